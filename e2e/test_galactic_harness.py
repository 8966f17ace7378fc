"""The harness for galactic's eBPF datapath (``e2e.harness.galactic.datapath``) proves itself:
two simulated nodes, each with galactic-cni's datapath pinned in its own bpffs and
``usid_ingress`` on its underlay link, galactic-routers in session over the underlay, a route
each router learns written into the other node's ``egress_route_table``, and galactic's own
vrf_table sweep run against a node's pins. The VPC state the CNI would write (VRF devices,
BGPVRFInstances, BGPAdvertisements) is written here by the test on its behalf."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.resources import ADVERTISEMENTS, GROUP, ROUTERS, VERSION, VRF_INSTANCES
from e2e.harness.galactic.build import GalacticBuild, ensure_galactic_built
from e2e.harness.galactic.datapath import (
    INGRESS_FILTER,
    PINS,
    SESSION_ESTABLISHED,
    Datapath,
    DatapathNode,
    galactic_datapath,
    session_state,
)
from e2e.harness.galactic.fabric import ASN, apply_galactic_crds
from e2e.harness.galactic.maps import EgressRoute
from e2e.harness.galactic.sweep import run_sweep
from e2e.harness.kernel import run_ip
from e2e.harness.kube import Kube
from e2e.harness.nodes import in_node
from e2e.harness.publishing import BGP_NS

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel]
ROUTE_TIMEOUT_S = 180.0
VRF_TABLES = {1: 3101, 2: 3102}  # the test's VRF device on node 1 and 2: different tables
VRF_IDS = {1: 7, 2: 9}  # their BGPVRFInstances' vrfIDs
PREFIXES = {1: ("10.77.1.0/24", "fd00:77:1::/64"), 2: ("10.77.2.0/24", "fd00:77:2::/64")}


@pytest.fixture(scope="module")
def galactic(kube: Kube) -> GalacticBuild:
    """galactic's binaries (setup.sh built them: a cache hit here) and the CRDs its router
    watches beyond ours, in this test cluster only."""
    build = ensure_galactic_built()
    apply_galactic_crds(kube, build.crd_dir)
    return build


@pytest.fixture(scope="module")
def datapath(kube: Kube, cluster: Any, galactic: GalacticBuild,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Datapath]:
    """Two nodes running galactic-cni and galactic-router, sessions up."""
    with galactic_datapath(kube, cluster, galactic,
                           tmp_path_factory.mktemp("galactic-datapath")) as running:
        print(f"\ndatapath start (s since the first namespace): {running.timings}")
        yield running


def test_each_node_pins_the_datapath_in_its_own_bpffs_and_attaches_usid_ingress_on_its_underlay(
        datapath: Datapath) -> None:
    for node in datapath.nodes:
        assert set(PINS) <= node.pins(), node.pins()
        filters = node.ingress_filters()
        print(f"{node.name}: pinned {sorted(node.pins())}; ingress of {node.underlay_link}: "
              f"{filters}")
        assert [(f.kind, f.name, f.program, f.direct_action) for f in filters] == \
            [("bpf", INGRESS_FILTER, "usid_ingress", True)]
    first, second = datapath.nodes
    assert first.map_id("egress_route_table") != second.map_id("egress_route_table"), \
        "each node's galactic-cni pinned maps of its own"
    assert first.ingress_filters()[0].program_id != second.ingress_filters()[0].program_id
    assert not Path("/sys/fs/bpf/galactic").exists(), "nothing pinned in the VM's own bpffs"


def test_routers_report_their_sessions_established_over_the_underlay(
        kube: Kube, datapath: Datapath) -> None:
    states = {peer.rsplit("/", 1)[1]: session_state(kube, peer) for peer in datapath.peers}
    print(f"BGPPeer sessions: {states}")
    assert set(states.values()) == {SESSION_ESTABLISHED}
    for node in datapath.nodes:
        router = kube.get(ROUTERS.path(BGP_NS, node.router)) or {}
        assert router["status"]["peers"] == {"total": 1, "established": 1}
        other = next(n for n in datapath.nodes if n is not node)
        assert bgp_sessions(node) == {(node.underlay_address, other.underlay_address)}
        neighbours = json.loads(run_ip("-n", node.netns, "-j", "-6", "neigh", "show", "dev",
                                       node.underlay_link, other.underlay_address))
        assert neighbours and neighbours[0].get("lladdr") == other.link()["address"], \
            "the session keeps the other node resolved on the underlay"


def bgp_sessions(node: DatapathNode) -> set[tuple[str, str]]:
    """(local, peer) addresses of the node's established TCP connections on port 179."""
    shown = subprocess.run(
        [*in_node(node.netns), "ss", "-H", "-tn", "state", "established",
         "( sport = :179 or dport = :179 )"], capture_output=True, text=True, check=True,
        timeout=30).stdout
    sessions = set()
    for line in shown.splitlines():  # Recv-Q Send-Q [local]:port [peer]:port
        local, peer = (column.rsplit(":", 1)[0].strip("[]") for column in line.split()[2:4])
        sessions.add((local, peer))
    return sessions


@contextlib.contextmanager
def vrf_device(node: DatapathNode, vpc: str, table: int) -> Iterator[str]:
    """The VPC's VRF device G{vpc}V on ``node`` (the CNI's, written by the test)."""
    name = naming.vrf_name(vpc)
    run_ip("-n", node.netns, "link", "add", name, "type", "vrf", "table", str(table))
    try:
        run_ip("-n", node.netns, "link", "set", name, "up")
        yield name
    finally:
        run_ip("-n", node.netns, "link", "del", name, check=False)


def bgp_object(kube: Kube, collection: str, kind: str, name: str,
               spec: dict[str, Any]) -> str:
    """Create a BGP object in the BGP namespace; return its path."""
    kube.create(collection, {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind,
                             "metadata": {"name": name}, "spec": spec})
    return f"{collection}/{name}"


def vrf_instance_spec(node: DatapathNode, vpc: str) -> dict[str, Any]:
    """The VPC's BGPVRFInstance on ``node`` as vpc-attach writes it."""
    target = [{"value": naming.route_target(ASN, vpc)}]
    return {"routerRef": {"name": node.router}, "vrfID": VRF_IDS[node.index],
            "importRouteTargets": target, "exportRouteTargets": target}


def advertisement_spec(node: DatapathNode, vpc: str) -> dict[str, Any]:
    """A BGPAdvertisement of the node's PREFIXES in the VPC, as vpc-attach writes it."""
    return {"routerRef": {"name": node.router}, "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
            "prefixes": list(PREFIXES[node.index]),
            "communities": [naming.route_target(ASN, vpc)], "vrfID": VRF_IDS[node.index],
            "function": "End.DT46"}


def learned_routes(learner: DatapathNode, announcer: DatapathNode) -> set[EgressRoute]:
    """The rows ``learner``'s router must write for ``announcer``'s prefixes: keyed by the
    learner's VRF table, to the SID the announcer's router announces, out the learner's
    underlay link to the announcer's MAC."""
    sid = naming.srv6_sid(announcer.locator, announcer.node_id, VRF_IDS[announcer.index])
    link = learner.link()
    return {EgressRoute(VRF_TABLES[learner.index], ipaddress.ip_network(prefix), sid,
                        int(link["ifindex"]), announcer.link()["address"], link["address"])
            for prefix in PREFIXES[announcer.index]}


def bgp_statuses(kube: Kube, paths: list[str]) -> str:
    """The status of each object, for a failure message."""
    return "\n".join(f"{path}: {json.dumps((kube.get(path) or {}).get('status'))}"
                     for path in paths)


def test_router_writes_learned_prefix_into_egress_route_table_objects_written_by_test(
        kube: Kube, datapath: Datapath, vpc: str) -> None:
    """Both nodes announce (each node with a Pod of the VPC has its own advertisement): a
    router applies a new BGPVRFInstance only when its hashed state (peers, advertisements,
    policies) changes, so a node with the instance alone would never import the VPC."""
    with contextlib.ExitStack() as stack:
        written = []
        for node in datapath.nodes:  # the device first: the router resolves its table by it
            stack.enter_context(vrf_device(node, vpc, VRF_TABLES[node.index]))
            written.append(bgp_object(kube, VRF_INSTANCES.path(BGP_NS), "BGPVRFInstance",
                                      naming.vrf_instance_name(vpc, node.name),
                                      vrf_instance_spec(node, vpc)))
            stack.callback(kube.delete, written[-1])
        for node in datapath.nodes:
            written.append(bgp_object(kube, ADVERTISEMENTS.path(BGP_NS), "BGPAdvertisement",
                                      naming.advertisement_name(vpc, "1", node.name),
                                      advertisement_spec(node, vpc)))
            stack.callback(kube.delete, written[-1])

        first, second = datapath.nodes
        expected = {first.name: learned_routes(first, second),
                    second.name: learned_routes(second, first)}
        datapath.wait("each node's egress_route_table to hold the other's prefixes",
                      lambda: {node.name: set(node.egress_routes())
                               for node in datapath.nodes} == expected,
                      ROUTE_TIMEOUT_S, detail=lambda: bgp_statuses(kube, written))
        for node in datapath.nodes:
            print(f"{node.name} egress_route_table: {node.egress_routes()}")


def test_sweep_runs_galactics_vrf_table_gc_against_a_nodes_pins(
        kube: Kube, cluster: Any, galactic: GalacticBuild, datapath: Datapath) -> None:
    node = datapath.nodes[0]
    result = run_sweep(galactic.sweep, node.prefix, cluster.admin_kubeconfig, node.name, BGP_NS)
    print(f"sweep on {node.name}: {result}")
    assert (result.errors, result.ebpf_vrf_entries_removed) == (0, 0)
    assert "no BGPRouter found" not in result.log, "it found the node's router and reconciled"
    assert set(PINS) <= node.pins()
