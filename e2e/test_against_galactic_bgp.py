"""vpc-attach against galactic's own CNI chain (galactic-veth → galactic-bgp, built from
``../shared/peers``) on two nodes running galactic-cni and galactic-router (SPEC §15: "as
galactic-bgp does" is proven against galactic-bgp itself):

- the same Pod (VPC, attachment, addresses) attached by each on the same node writes the same
  rows into every pinned map and the same tc filters on its host link, normalised only where
  they must differ (`e2e.harness.galactic.rows.EXCEPTIONS`, each named);
- a mixed pair (node 1 galactic's chain, node 2 vpc-attach) carries one VPC both ways and keeps
  a VPC with the same subnets apart;
- where they differ on purpose: a bulk transfer from vpc-attach's Pod drops nothing on the
  underlay, one from galactic-bgp's Pod crawls (its segmentation offloads are on and
  galactic's usid_egress drops the GSO packets); CHECK and doctor see a Pod that lost the
  setting; `galacticOffloads: on` leaves the Pod's offloads alone.

In the agent pass only the transfer and `galacticOffloads: on` run again (where the offloads
are set depends on the path); the rest proves nothing more there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from e2e.harness.agentproc import OwnAgents
from e2e.harness.cluster import Cluster
from e2e.harness.doctor import doctor_on
from e2e.harness.galactic import rows
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.chain import (
    GalacticChain,
    ensure_nad_crd,
    galactic_pod,
    install_chain,
    static_ipam,
)
from e2e.harness.galactic.datapath import Datapath, galactic_datapath
from e2e.harness.galactic.transfer import offloads, set_offloads, transfer
from e2e.harness.galactic.vpc_nodes import (
    POD_MTU,
    NamedPod,
    VpcAttachNode,
    answered_by,
    attached,
    route_bound,
    routes_of,
    vpc_attach_nodes,
    wait_routes,
)
from e2e.harness.kube import Kube
from e2e.harness.packets import ping
from e2e.harness.plugin import VIA_AGENT, random_vpc, with_prev
from e2e.harness.tenancy import bound

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel]
PATH = "agent" if VIA_AGENT else "in-process"
TRANSFER_S = 3
STORM_SHARE = 100  # a retransmission storm: more than 1 in this many segments retransmitted


@pytest.fixture(scope="module")
def datapath(kube: Kube, cluster: Cluster, galactic: GalacticBuild,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Datapath]:
    """Two galactic nodes (galactic-cni told its underlay, galactic-router), sessions up."""
    with galactic_datapath(kube, cluster, galactic, tmp_path_factory.mktemp("galactic-bgp"),
                           underlay_by_env=True) as running:
        ensure_nad_crd(kube)
        yield running


@pytest.fixture(scope="module")
def nodes(datapath: Datapath, cluster: Cluster, cni_bin: Path,
          own_agents: OwnAgents) -> Iterator[list[VpcAttachNode]]:
    """vpc-attach on both nodes (and its node agent, in the agent pass)."""
    with vpc_attach_nodes(datapath, cluster, cni_bin, own_agents) as made:
        yield made


@pytest.fixture(scope="module")
def chain(datapath: Datapath, galactic: GalacticBuild, reference_plugins: Path,
          cluster: Cluster) -> GalacticChain:
    """galactic's chain installed on node 1."""
    node = datapath.nodes[0]
    return install_chain(node, galactic, reference_plugins, node.directory / "galactic-chain",
                         cluster.admin_kubeconfig)


def test_vpc_attach_writes_the_rows_and_filters_galactic_bgp_writes_for_the_same_pod(
        kube: Kube, nodes: list[VpcAttachNode], chain: GalacticChain) -> None:
    node = nodes[0]
    pin_dir = node.galactic.pin_dir
    vpc, att = random_vpc(), "1"
    ipam = static_ipam("fd00:c0:1::5", "10.197.1.5")
    maps = rows.pinned_maps(pin_dir)
    host_link = naming.host_link_name(vpc, att)
    found: dict[str, tuple[set[rows.Row], set[rows.Filter]]] = {}
    with bound(kube, vpc):
        rows.reset_node_rows(pin_dir)
        before = rows.snapshot(pin_dir, maps)
        with attached(kube, node, vpc, att, ipam=ipam):
            found["vpc-attach"] = (rows.written(before, rows.snapshot(pin_dir, maps)),
                                   rows.tc_filters(node.galactic.netns, host_link))
        rows.reset_node_rows(pin_dir)
        before = rows.snapshot(pin_dir, maps)
        with galactic_pod(kube, chain, vpc, att, ipam):
            theirs_written = rows.written(before, rows.snapshot(pin_dir, maps))
            found["galactic-bgp"] = (theirs_written,
                                     rows.tc_filters(node.galactic.netns, host_link))
        rows.forget(pin_dir, theirs_written)
    ours, theirs = ({r.normalised() for r in found[who][0]}
                    for who in ("vpc-attach", "galactic-bgp"))
    print(f"\nrows written for Pod {vpc}/{att} on {node.name} (maps pinned: "
          f"{', '.join(maps)}):\n" + "\n".join(rows.comparison(theirs, ours)))
    print("normalised:\n| map | bytes | why |\n|---|---|---|\n" +
          "\n".join(rows.exception_lines()))
    print(f"tc filters on {host_link}: galactic-bgp {sorted(found['galactic-bgp'][1])}, "
          f"vpc-attach {sorted(found['vpc-attach'][1])}")
    assert theirs, f"galactic's chain wrote no row: {chain.log_tail()}"
    assert ours == theirs, (rows.as_json(found["galactic-bgp"][0]),
                            rows.as_json(found["vpc-attach"][0]))
    assert found["vpc-attach"][1] == found["galactic-bgp"][1]
    assert {f.program for f in found["vpc-attach"][1]} == {"usid_egress"}


def test_a_galactic_bgp_node_and_a_vpc_attach_node_carry_one_vpc_and_keep_another_apart(
        kube: Kube, datapath: Datapath, nodes: list[VpcAttachNode], chain: GalacticChain,
        tmp_path: Path) -> None:
    node2 = nodes[1]
    vpc, other = random_vpc(), random_vpc()
    a_ipam, b_ipam = (static_ipam("fd00:c1:1::5", "10.198.1.5"),
                      static_ipam("fd00:c1:2::5", "10.198.2.5"))
    with bound(kube, vpc), bound(kube, other), \
            galactic_pod(kube, chain, vpc, "1", a_ipam) as pod_a, \
            attached(kube, node2, vpc, "2", ipam=b_ipam) as pod_b, \
            galactic_pod(kube, chain, other, "1", a_ipam) as pod_x, \
            attached(kube, node2, other, "2", ipam=b_ipam) as pod_y:
        for netns, address in ((pod_a.netns, pod_b.v4), (pod_b.netns, pod_a.v4),
                               (pod_x.netns, pod_y.v4)):
            datapath.wait(f"{netns} to reach {address}", functools.partial(ping, netns, address),
                          route_bound(),
                          detail=lambda: f"{chain.log_tail()}\n{routes_of(nodes)}")
        cases = []
        pairs: list[tuple[Any, Any, Sequence[NamedPod], Any]] = [
            (pod_a, pod_b, [pod_b, pod_y], pod_b), (pod_b, pod_a, [pod_a, pod_x], pod_a),
            (pod_x, pod_y, [pod_b, pod_y], pod_y), (pod_y, pod_x, [pod_a, pod_x], pod_x)]
        for src, dst, servers, expected in pairs:
            for family, address in (("v4", dst.v4), ("v6", dst.v6)):
                cases.append((src.name, dst.name, family, ping(src.netns, address),
                              answered_by(src, address, servers, tmp_path), [expected.name]))
    print(f"\nnode 1: galactic-veth → galactic-bgp; node 2: vpc-attach; VPC {vpc}: "
          f"{pod_a.name}, {pod_b.name}; VPC {other} (same addresses): {pod_x.name}, "
          f"{pod_y.name}\n| from | to | family | ping | TCP reached |\n|---|---|---|---|---|")
    for src_name, dst_name, family, pinged, heard, _ in cases:
        print(f"| {src_name} | {dst_name} | {family} | {pinged} | {heard} |")
    assert all(pinged and heard == want for _, _, _, pinged, heard, want in cases), cases


def underlays(datapath: Datapath) -> list[tuple[str, str]]:
    """Both nodes' underlay links, where what the sender could not segment is dropped."""
    return [(node.netns, node.underlay_link) for node in datapath.nodes]


@pytest.mark.both_paths
def test_a_bulk_transfer_across_nodes_drops_nothing_where_galactic_bgps_pod_crawls(
        kube: Kube, datapath: Datapath, nodes: list[VpcAttachNode],
        chain: GalacticChain) -> None:
    node1, node2 = nodes
    vpc = random_vpc()
    with bound(kube, vpc), attached(kube, node1, vpc, "1") as client, \
            attached(kube, node2, vpc, "2") as server:
        wait_routes(datapath, node1, server)
        assert offloads(client.netns)["tcp-segmentation-offload"] == "off"
        ours = transfer(client.netns, server.netns, server.v4, TRANSFER_S, underlays(datapath))
        # The positive control: a Pod of the same VPC on node 1 that galactic's own chain
        # attached, its offloads as galactic-bgp leaves them.
        with galactic_pod(kube, chain, vpc, "3", static_ipam("fd00:d1:1::33",
                                                             "10.211.1.33")) as theirs_pod:
            datapath.wait(f"{theirs_pod.name} to reach {server.name}",
                          functools.partial(ping, theirs_pod.netns_name, server.v4),
                          route_bound(), detail=lambda: routes_of(nodes))
            theirs = transfer(theirs_pod.netns_name, server.netns, server.v4, TRANSFER_S,
                              underlays(datapath))
    print(f"\n[{PATH}] {TRANSFER_S}-s TCP transfer {node1.name} → {node2.name}:\n"
          "| sender | Gbit/s | segments | retransmits | tx_dropped node 1 / node 2 |\n"
          "|---|--:|--:|--:|--:|")
    for who, done in (("vpc-attach", ours), ("galactic-veth → galactic-bgp", theirs)):
        print(f"| {who} | {done.gbits:.3f} | {done.segments(POD_MTU)} | {done.retransmits} | "
              f"{done.drops[0]} / {done.drops[1]} |")
    assert ours.drops == (0, 0), ours
    assert ours.retransmits * STORM_SHARE <= ours.segments(POD_MTU), ours
    assert theirs.drops[0] > 0 and theirs.retransmits * STORM_SHARE > theirs.segments(1500), \
        f"galactic-bgp's Pod did not crawl: the control proves nothing ({theirs})"


def test_check_and_doctor_see_a_registered_pod_whose_offloads_came_back(
        kube: Kube, nodes: list[VpcAttachNode]) -> None:
    node1 = nodes[0]
    vpc = random_vpc()
    with bound(kube, vpc), attached(kube, node1, vpc, "1") as pod:
        def check() -> Any:
            return node1.plugin.call("CHECK", with_prev(pod.conf, pod.result),
                                     container_id=pod.container, netns=pod.path,
                                     CNI_ARGS=pod.cni_args)

        assert check().status == 0 and doctor_on(node1.plugin).statuses(
            "datapath.offloads") == ["ok"]
        set_offloads(pod.netns, "tso", "on", "tx-udp-segmentation", "on")
        try:
            lost, found = check(), doctor_on(node1.plugin)
        finally:
            set_offloads(pod.netns, "tso", "off", "tx-udp-segmentation", "off")
        assert lost.status != 0 and "tx-tcp-segmentation" in lost.stdout, lost.stdout
        assert found.statuses("datapath.offloads") == ["fail"], found.report
        assert pod.path in found.findings("datapath.offloads")[0]["detail"]
        assert check().status == 0


@pytest.mark.both_paths
def test_a_node_with_galactic_offloads_on_leaves_the_pods_offloads_alone(
        kube: Kube, nodes: list[VpcAttachNode]) -> None:
    vpc = random_vpc()
    with bound(kube, vpc), attached(kube, nodes[0], vpc, "1",
                                    environ={"VPC_ATTACH_GALACTIC_OFFLOADS": "on"}) as pod:
        assert offloads(pod.netns)["tcp-segmentation-offload"] == "on"


def test_doctor_warns_about_receive_aggregation_where_usid_ingress_is_attached(
        nodes: list[VpcAttachNode]) -> None:
    node1 = nodes[0]
    underlay = node1.galactic.underlay_link
    assert doctor_on(node1.plugin).statuses("datapath.gro") == ["ok"]
    set_offloads(node1.galactic.netns, "gro", "on", link=underlay)
    try:
        found = doctor_on(node1.plugin)
    finally:
        set_offloads(node1.galactic.netns, "gro", "off", link=underlay)
    assert found.statuses("datapath.gro") == ["warn"], found.report
    assert underlay in found.findings("datapath.gro")[0]["detail"]
