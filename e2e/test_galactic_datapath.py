"""One VPC across two nodes through galactic's own datapath (issue 30, SPEC §15).

Each node runs galactic-cni (its eBPF uSID datapath pinned in the node's own bpffs,
`usid_ingress` on the underlay), galactic-router (BGP over the underlay with the other node's)
and vpc-attach as installed (in-process, or through the node's agent in the agent pass). Nothing
in this module writes a route, a neighbour or a map row on a node: vpc-attach registers the
attachments (rows, `usid_egress` on their host links), galactic-router writes what it learns
into `egress_route_table`, galactic's programs carry the packets. The underlay's own addresses
and routes are the harness's (`e2e.harness.galactic.datapath`); vpc-attach on those nodes:
`e2e.harness.galactic.vpc_nodes`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.galactic import layout
from e2e.harness.agentproc import OwnAgents
from e2e.harness.doctor import doctor_on
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.datapath import (
    INGRESS_FILTER,
    PINS,
    SESSION_ESTABLISHED,
    Datapath,
    galactic_datapath,
    session_state,
)
from e2e.harness.galactic.leftovers import (
    SKIPPED,
    STRAY_ARGUMENT,
    orphan_advertisement,
    owned_vrf_rows,
    plant_vrf_row,
    published,
    tapped,
)
from e2e.harness.galactic.sweep import run_sweep
from e2e.harness.galactic.vpc_nodes import (
    POD_MTU,
    VpcAttachNode,
    answered_by,
    attached,
    decoded_rows,
    host_prefixes,
    ping_mtu,
    vpc_attach_nodes,
    wait_routes,
)
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.packets import ping
from e2e.harness.plugin import VIA_AGENT, base_conf, random_vpc, with_prev
from e2e.harness.publishing import BGP_NS, create_pod, delete_pod, deny_writes, vrf_instance
from e2e.harness.tenancy import bound

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel,
              pytest.mark.both_paths, pytest.mark.once_through_agent]
PATH = "agent" if VIA_AGENT else "in-process"


@pytest.fixture(scope="module")
def datapath(kube: Kube, cluster: Any, galactic: GalacticBuild,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Datapath]:
    """Two nodes with galactic-cni (told its underlay, as on vpc-attach's nodes: docs) and
    galactic-router, sessions up."""
    with galactic_datapath(kube, cluster, galactic, tmp_path_factory.mktemp("galactic-dp"),
                           underlay_by_env=True) as running:
        yield running


@pytest.fixture(scope="module")
def nodes(datapath: Datapath, cluster: Any, cni_bin: Path,
          own_agents: OwnAgents) -> Iterator[list[VpcAttachNode]]:
    """vpc-attach on each node (its node agent too, in the agent pass)."""
    with vpc_attach_nodes(datapath, cluster, cni_bin, own_agents) as made:
        yield made


def test_each_node_runs_galactics_datapath_of_its_own_and_routers_in_session(
        kube: Kube, datapath: Datapath) -> None:
    for node in datapath.nodes:
        assert set(PINS) <= node.pins(), node.pins()
        assert [(f.kind, f.name, f.program, f.direct_action) for f in node.ingress_filters()] \
            == [("bpf", INGRESS_FILTER, "usid_ingress", True)]
    first, second = datapath.nodes
    assert first.map_id("egress_route_table") != second.map_id("egress_route_table")
    assert not Path("/sys/fs/bpf/galactic").exists(), "nothing pinned in the VM's own bpffs"
    assert {session_state(kube, peer) for peer in datapath.peers} == {SESSION_ESTABLISHED}


def test_one_vpc_across_two_nodes_and_a_vpc_with_the_same_subnets_reaches_neither(
        kube: Kube, datapath: Datapath, nodes: list[VpcAttachNode], tmp_path: Path) -> None:
    node1, node2 = nodes
    vpc, other = random_vpc(), random_vpc()
    with bound(kube, vpc), bound(kube, other), \
            attached(kube, node1, vpc, "1") as pod_a, attached(kube, node1, vpc, "3") as pod_a2, \
            attached(kube, node2, vpc, "2") as pod_b, \
            attached(kube, node1, other, "1") as pod_x, attached(kube, node2, other, "2") as pod_y:
        assert (pod_x.v4, pod_y.v6) == (pod_a.v4, pod_b.v6), "the other VPC has the same addresses"
        for reader, pod in ((node1, pod_b), (node1, pod_y), (node2, pod_a), (node2, pod_a2),
                            (node2, pod_x)):
            wait_routes(datapath, reader, pod)
        print(f"\n[{PATH}] galactic's maps on {node1.name} (pods {pod_a.name}, {pod_a2.name} of "
              f"VPC {vpc}, {pod_x.name} of VPC {other}):\n| map | key | value |\n|---|---|---|")
        print("\n".join(decoded_rows(node1)))
        assert {i["mtu"] for i in pod_a.result["interfaces"]} == {POD_MTU}
        cases = []
        for src, dst, servers, expected in (
                (pod_a, pod_b, [pod_b, pod_y], pod_b), (pod_b, pod_a, [pod_a, pod_x], pod_a),
                (pod_a2, pod_b, [pod_b, pod_y], pod_b), (pod_b, pod_a2, [pod_a2], pod_a2),
                (pod_x, pod_y, [pod_b, pod_y], pod_y), (pod_y, pod_x, [pod_a, pod_x], pod_x)):
            for family, address in (("v4", dst.v4), ("v6", dst.v6)):
                heard = answered_by(src, address, servers, tmp_path)
                cases.append((f"{src.name}->{dst.name}", family, ping(src.netns, address),
                              ping_mtu(src, address, 1400).returncode == 0, heard,
                              [expected.name]))
        print("\n| path | family | ping | 1400-byte DF ping | TCP reached |\n|---|---|---|---|---|")
        for path, family, pinged, big, heard, _ in cases:
            print(f"| {path} | {family} | {pinged} | {big} | {heard} |")
        assert all(pinged and big and heard == want for _, _, pinged, big, heard, want in cases)
        too_big = ping_mtu(pod_a, pod_b.v4, POD_MTU + 1)
        assert too_big.returncode != 0 and f"mtu={POD_MTU}" in too_big.stdout + too_big.stderr
        check = pod_a.node.plugin.call("CHECK", with_prev(pod_a.conf, pod_a.result),
                                       container_id=pod_a.container, netns=pod_a.path,
                                       CNI_ARGS=pod_a.cni_args)
        assert check.status == 0, check.stdout
        findings = doctor_on(node1.plugin).by_check
        assert findings["datapath.galactic"][0]["status"] == "ok", findings
        registered = findings["datapath.registered"]
        assert [f["status"] for f in registered] == ["ok"], registered
        for pod in (pod_a, pod_a2, pod_x):
            assert naming.host_link_name(pod.vpc, pod.att) in registered[0]["detail"]
        # The kernel's End.DT46 route would serve nothing here: all of this went without it.
        for node in nodes:
            assert "End.DT46" not in run_ip("-n", node.galactic.netns, "-6", "route", "show")


def test_del_withdraws_a_prefix_add_brings_it_back_and_an_emptied_vpc_keeps_its_table(
        kube: Kube, datapath: Datapath, nodes: list[VpcAttachNode]) -> None:
    node1, node2 = nodes
    vpc = random_vpc()
    with bound(kube, vpc), attached(kube, node1, vpc, "1") as pod_a:
        with attached(kube, node2, vpc, "2") as pod_b:  # node 2's first ADD of the VPC
            wait_routes(datapath, node1, pod_b)
            wait_routes(datapath, node2, pod_a)
            table = node2.table_of(vpc)
            assert ping(pod_a.netns, pod_b.v6) and ping(pod_b.netns, pod_a.v4)
            pod_b.delete()  # the VPC's last attachment on node 2: its VRF goes
            wait_routes(datapath, node1, pod_b, present=False)
            assert not ping(pod_a.netns, pod_b.v6)
            assert node2.table_of(vpc) is None
            assert vrf_instance(kube, naming.vrf_instance_name(vpc, node2.name)) is not None
        with attached(kube, node2, vpc, "2") as pod_b2:  # the VPC back on node 2
            wait_routes(datapath, node1, pod_b2)
            assert node2.table_of(vpc) == table, "the VRF got its table back"
            # galactic-router never read the VRF again: its rows for A are still in `table`.
            assert {r.table_id for r in node2.galactic.egress_routes()
                    if r.prefix in host_prefixes(pod_a)} == {table}
            assert ping(pod_a.netns, pod_b2.v6) and ping(pod_b2.netns, pod_a.v4)
    for node in nodes:
        log = (node.galactic.directory / "galactic-router.log").read_text()
        assert "SEG6 encap routes will not be installed" not in log, \
            "galactic-router read a BGPVRFInstance before its VRF existed"


def test_an_add_rolled_back_after_registering_leaves_every_map_byte_for_byte(
        kube: Kube, nodes: list[VpcAttachNode]) -> None:
    node1 = nodes[0]
    vpc = random_vpc()
    with bound(kube, vpc), attached(kube, node1, vpc, "1"):
        before = node1.rows()
        name = f"dp-rb-{os.urandom(2).hex()}"
        uid = create_pod(kube, name, node1.name)
        allow = deny_writes(kube, f"deny-{name}", "endpointslices", "discovery.k8s.io",
                            ["CREATE"], name)
        try:
            with temporary_netns("vpa-dprb") as netns:
                answer = node1.plugin.call(
                    "ADD", base_conf(vpc, "5", isolation="vrf", ipam=node1.ipam(vpc),
                                     publish={"bgp": True, "endpointSlice": True}),
                    container_id=f"ctr-{name}", netns=netns,
                    CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};"
                             f"K8S_POD_UID={uid}")
        finally:
            allow()
            delete_pod(kube, name)
        assert answer.status != 0 and answer.code == 104, answer.stdout
        log = (node1.directory / "vpc-attach.log").read_text()
        assert "rollback: removed rows written into galactic's datapath" in log
        assert node1.rows() == before


def test_gc_removes_the_rows_of_attachments_the_runtime_no_longer_runs(
        kube: Kube, nodes: list[VpcAttachNode]) -> None:
    node1 = nodes[0]
    vpc = random_vpc()
    with bound(kube, vpc), attached(kube, node1, vpc, "1") as kept, \
            attached(kube, node1, vpc, "3") as gone:
        links = {pod.att: node1.galactic.link(naming.host_link_name(vpc, pod.att))["ifindex"]
                 for pod in (kept, gone)}
        gc = {**kept.conf, "cni.dev/valid-attachments": [
            {"containerID": kept.container, "ifname": "eth0"}]}
        node1.plugin.ok("GC", gc)
        ifindexes = {layout.decode_ifindex_key(bytes.fromhex(key))
                     for key in node1.rows()[layout.IFINDEX_VRF_TABLE.name]}
        assert links[kept.att] in ifindexes and links[gone.att] not in ifindexes


def test_galactics_vrf_table_sweep_removes_a_row_no_instance_names_and_keeps_ours(
        kube: Kube, cluster: Any, galactic: GalacticBuild, nodes: list[VpcAttachNode]) -> None:
    """galactic-cni's sweep (gc.SweepEBPFVRFTable; galactic-cni runs it only where it reads its
    own conflist, so never on these nodes by itself) sweeps for real beside vpc-attach: a row
    whose Argument no BGPVRFInstance of the node's router names goes (the positive control),
    vpc-attach's rows stay; and it took neither of the paths that also say "removed 0" without
    sweeping (no BGPRouter for the node: shown by the negative control; no pin directory: the
    program refuses to run then)."""
    node1 = nodes[0]
    assert "eBPF vrf_table GC sweep disabled" in \
        (node1.galactic.directory / "galactic-cni.log").read_text()
    vpc = random_vpc()
    with bound(kube, vpc), attached(kube, node1, vpc, "1"):
        stray = plant_vrf_row(node1.galactic, argument=STRAY_ARGUMENT)
        ours = owned_vrf_rows(node1)
        assert stray in ours
        skipped = run_sweep(galactic.sweep, node1.galactic.prefix, cluster.admin_kubeconfig,
                            "a-node-no-router-targets", BGP_NS)
        kept = owned_vrf_rows(node1)
        swept = run_sweep(galactic.sweep, node1.galactic.prefix, cluster.admin_kubeconfig,
                          node1.name, BGP_NS)
        after = owned_vrf_rows(node1)
    print(f"\n[{PATH}] galactic's vrf_table sweep on {node1.name}: planted row {stray}; "
          f"sweep as another node: removed {skipped.ebpf_vrf_entries_removed}, skipped "
          f"{SKIPPED in skipped.log}; sweep as {node1.name}: removed "
          f"{swept.ebpf_vrf_entries_removed}, errors {swept.errors}, skipped "
          f"{SKIPPED in swept.log}; vpc-attach's rows before {len(ours) - 1}, after "
          f"{len(after)}")
    assert SKIPPED in skipped.log and skipped.ebpf_vrf_entries_removed == 0 and kept == ours
    assert SKIPPED not in swept.log and swept.errors == 0, swept.log
    assert swept.ebpf_vrf_entries_removed == 1 and stray not in after
    assert after == {key: row for key, row in ours.items() if key != stray}


def test_galactic_routers_gc_keeps_live_veth_and_tap_pods_and_removes_what_is_orphaned(
        kube: Kube, cluster: Any, galactic: GalacticBuild, nodes: list[VpcAttachNode]) -> None:
    """galactic-router's GC pass (gc.RunGC) beside live vpc-attach Pods: their VPC's VRF,
    instance and advertisements survive. What it removes is counted and named, as the positive
    controls: the planted advertisement of a container whose netns is gone, and what it takes
    from a VPC the node advertises nothing in (an L2-only tap's instance and VRF:
    docs/operations.md#galactics-datapath). A first pass clears what earlier tests left (the
    instances DEL keeps), so the counted pass sees only this test's."""
    node1 = nodes[0]
    run_sweep(galactic.sweep, node1.galactic.prefix, cluster.admin_kubeconfig, node1.name,
              BGP_NS, router_gc=True)
    vpc, l2_vpc = random_vpc(), random_vpc()
    tap = base_conf(vpc, "2", attachment="tap", isolation="vrf", ipam=node1.ipam(vpc),
                    publish={"bgp": True, "endpointSlice": False})
    l2_tap = base_conf(l2_vpc, "1", attachment="tap", isolation="vrf",
                       publish={"bgp": True, "endpointSlice": False})
    with bound(kube, vpc), bound(kube, l2_vpc), attached(kube, node1, vpc, "1") as veth, \
            tapped(node1, tap, "gc-vm") as vm, tapped(node1, l2_tap, "gc-l2"), \
            orphan_advertisement(kube, node1, random_vpc()) as orphan:
        objects = published(kube, vpc, node1)
        assert node1.table_of(l2_vpc) is not None and all(objects.values())
        swept = run_sweep(galactic.sweep, node1.galactic.prefix, cluster.admin_kubeconfig,
                          node1.name, BGP_NS, router_gc=True)
        survived = published(kube, vpc, node1)
        print(f"\n[{PATH}] galactic-router's GC pass on {node1.name} with veth {veth.name} and "
              f"tap {vm} of VPC {vpc}: {swept}; VPC {vpc}'s VRF table "
              f"{node1.table_of(vpc)}, objects {sorted(k for k, v in survived.items() if v)}; "
              f"planted advertisement {orphan} left: {kube.get(orphan) is not None}")
        assert (swept.orphaned_crds_removed, swept.orphaned_vrfs_removed, swept.errors) == (
            2, 1, 0), swept.log
        assert kube.get(orphan) is None and node1.table_of(l2_vpc) is None
        assert vrf_instance(kube, naming.vrf_instance_name(l2_vpc, node1.name)) is None
        assert node1.table_of(vpc) is not None and all(survived.values()), survived
        check = node1.plugin.call("CHECK", with_prev(veth.conf, veth.result),
                                  container_id=veth.container, netns=veth.path,
                                  CNI_ARGS=veth.cni_args)
        assert check.status == 0, check.stdout
