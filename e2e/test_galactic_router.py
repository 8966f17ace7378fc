"""galactic-router, built from galactic's own source, reads what vpc-attach publishes and
announces it over BGP: a gobgpd collector peered with every node's router receives exactly the
Pod's prefixes, with the VRF's RD, the VPC's route target and the published SRv6 SID, from the
router of the node the Pod runs on only, and loses them after DEL. galactic's own ingress-sidecar
code judges the EndpointSlices vpc-attach wrote (issue 21, items 1 and 4). Pods on several
nodes, each announced by its own node's router only: e2e/test_galactic_nodes.py."""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ROUTERS
from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import (
    ASN,
    Fabric,
    condition,
    create_peer,
    is_true,
    running_fabric,
)
from e2e.harness.galactic.rib import EvpnRoute, sorted_routes
from e2e.harness.galactic.verdict import SidecarRoute, Verdict, judge
from e2e.harness.kube import Kube
from e2e.harness.nodes import api_port, in_node, node_namespace
from e2e.harness.plugin import VIA_AGENT, Plugin, base_conf, host_local
from e2e.harness.publishing import (
    BGP_NS,
    Node,
    advertisement,
    create_pod,
    endpoint_slice,
    make_node,
    vrf_instance,
)
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
LOCATOR = "2001:db8:ff01::/48"
ROUTE_TIMEOUT_S = 90.0
FAMILIES = ("IPv6", "IPv4")


def router_id(index: int) -> str:
    """Node ``index``'s BGPRouter routerID: not its BGP address, so RD and next hop differ."""
    return f"198.51.100.{index}"


@dataclass
class GalacticNode:
    """A simulated node running the plugin and galactic-router, and its BGP address."""

    index: int
    node: Node
    address: str
    peer: str  # its BGPPeer's path


def start_node(stack: contextlib.ExitStack, fabric: Fabric, index: int, kube: Kube,
               cluster: Any, cni_bin: Path, own_agents: OwnAgents,
               tmp_path: Path) -> GalacticNode:
    """Node ``index``: a namespace linked to the fabric, its BGPRouter (SRv6 locator, node ID
    ``index``), galactic-router in it peered with the collector (a BGPPeer), and the plugin
    running there (through its own agent in the agent pass)."""
    netns = stack.enter_context(node_namespace(api_port(cluster.server)))
    address = fabric.link(index, netns)
    locks = tmp_path / f"locks-{index}"
    locks.mkdir()
    node_plugin = Plugin(cni_bin, locks, prefix=in_node(netns))
    if VIA_AGENT:
        agent_dir = tmp_path / f"agent-{index}"
        agent_dir.mkdir()
        node_plugin.agent_socket = str(own_agents.enter(stack, agent_dir,
                                                        prefix=in_node(netns)).socket)
    node = make_node(kube, cluster, node_plugin, locator=LOCATOR, node_id=index,
                     router_id=router_id(index))
    peer = create_peer(kube, BGP_NS, node.router, index)
    stack.callback(kube.delete, peer)
    # Stopped before its namespace goes (the stack unwinds in reverse).
    stack.callback(fabric.start_router(index, netns, node.name, cluster.admin_kubeconfig).stop)
    wait_until(f"BGPRouter {node.router} Ready",
               is_true(lambda: kube.get(ROUTERS.path(BGP_NS, node.router)), "Ready"),
               ROUTE_TIMEOUT_S, alive=fabric.alive)
    wait_until(f"{node.router}'s session with the collector",
               lambda: address in fabric.established(), ROUTE_TIMEOUT_S, alive=fabric.alive)
    return GalacticNode(index, node, address, peer)


@dataclass
class Attached:
    """A Pod attached through the plugin: what DEL needs, and its EndpointSlices."""

    conf: dict[str, Any]
    container_id: str
    args: str
    slices: list[str]


def attach_pod(kube: Kube, node: Node, pod: str, vpc: str, att: str, netns: str,
               ipam_dir: Path, *subnets: str, families: tuple[str, ...] = FAMILIES) -> Attached:
    """ADD a veth for a new Pod on ``node``, publishing BGP and a slice per family."""
    uid = create_pod(kube, pod, node.name)
    conf = base_conf(vpc, att, ipam=host_local(ipam_dir, *subnets))
    conf["publish"] = {"bgp": True, "endpointSlice": True,
                       "endpointSliceFamilies": list(families)}
    attached = Attached(conf, f"ctr-{pod}", node.cni_args(pod, uid),
                        [slice_name(pod, vpc, att, family) for family in families])
    node.plugin.ok("ADD", conf, container_id=attached.container_id, netns=netns,
                   CNI_ARGS=attached.args)
    return attached


def detach_pod(node: Node, attached: Attached, netns: str) -> None:
    """DEL what ``attach_pod`` added."""
    node.plugin.ok("DEL", attached.conf, container_id=attached.container_id, netns=netns,
                   CNI_ARGS=attached.args)


def wait_announced(kube: Kube, fabric: Fabric, gnode: GalacticNode, vpc: str, att: str,
                   prefixes: set[str]) -> int:
    """Wait until the router reports the VPC's instance accepted and the advertisement
    advertised, and the collector holds ``prefixes`` from it; returns the VRF ID."""
    vrf_name = naming.vrf_instance_name(vpc, gnode.node.name)
    adv_name = naming.advertisement_name(vpc, att, gnode.node.name)
    wait_until(f"{gnode.node.router} to accept {vrf_name} and advertise {adv_name}",
               lambda: is_true(lambda: vrf_instance(kube, vrf_name), "Ready")()
               and is_true(lambda: advertisement(kube, adv_name), "Advertised")(),
               ROUTE_TIMEOUT_S, alive=fabric.alive)
    wait_until(f"the collector to receive {sorted(prefixes)} from {gnode.address}",
               lambda: {r.prefix for r in fabric.rib() if r.router == gnode.address} == prefixes,
               ROUTE_TIMEOUT_S, alive=fabric.alive)
    # The router's own view of the session (its status is refreshed when it reconciles).
    wait_until(f"{gnode.peer} Established in its status",
               lambda: (kube.get(gnode.peer) or {}).get("status", {}).get("sessionState")
               == "Established", ROUTE_TIMEOUT_S, alive=fabric.alive)
    instance = vrf_instance(kube, vrf_name)
    assert instance is not None
    return int(instance["spec"]["vrfID"])


def expected_routes(gnode: GalacticNode, vpc: str, vrf_id: int,
                    prefixes: set[str]) -> list[EvpnRoute]:
    """What the collector must hold for ``prefixes`` announced by ``gnode``'s router."""
    sid = naming.srv6_sid(LOCATOR, gnode.index, vrf_id)
    return sorted_routes(EvpnRoute(prefix, f"{router_id(gnode.index)}:{vrf_id}",
                                   (naming.route_target(ASN, vpc),), sid, gnode.address,
                                   gnode.address)
                         for prefix in prefixes)


def judge_slices(kube: Kube, galactic: GalacticBuild, names: list[str]) -> dict[str, Verdict]:
    """The sidecar's verdict on each slice, read back from the API server; printed."""
    slices = [endpoint_slice(kube, name) for name in names]
    assert all(slices), f"missing slices among {names}"
    verdicts = {v.name: v for v in judge(galactic.verdict, [s for s in slices if s])}
    for verdict in verdicts.values():
        print(f"sidecar verdict: {verdict}")
    return verdicts


def assert_ipv6_slice_accepted(kube: Kube, verdicts: dict[str, Verdict], name: str,
                               vpc: str) -> None:
    """The sidecar selects the slice and routes the Pod's /128 of ``vpc`` to its SID."""
    eps = endpoint_slice(kube, name)
    assert eps is not None and eps["addressType"] == "IPv6"
    address = eps["endpoints"][0]["addresses"][0]
    sid = eps["metadata"]["annotations"]["galactic.datum.net/srv6-sid"]
    assert verdicts[name] == Verdict("default", name, True,
                                     SidecarRoute(vpc, f"{address}/128", sid), "")


def test_one_node_router_announces_the_pod_with_rd_rt_sid_and_withdraws_it_after_del(
        kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents, galactic: GalacticBuild,
        netns: str, vpc: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        fabric = stack.enter_context(running_fabric(galactic, tmp_path, nodes=1))
        gnode = start_node(stack, fabric, 1, kube, cluster, cni_bin, own_agents, tmp_path)
        router = kube.get(ROUTERS.path(BGP_NS, gnode.node.router))
        assert (condition(router, "Ready") or {}).get("reason") == "RuntimeReady"

        pod = attach_pod(kube, gnode.node, "gal-1", vpc, "10", netns, tmp_path / "ipam",
                         "fd00:21:1::/64", "172.21.1.0/24")
        prefixes = {"172.21.1.2/32", "fd00:21:1::/64"}
        vrf_id = wait_announced(kube, fabric, gnode, vpc, "10", prefixes)
        instance = vrf_instance(kube, naming.vrf_instance_name(vpc, gnode.node.name))
        adv = advertisement(kube, naming.advertisement_name(vpc, "10", gnode.node.name))
        assert (condition(instance, "Ready") or {}).get("reason") == "Accepted"
        assert (condition(adv, "Advertised") or {}).get("reason") == "Advertised"
        assert adv is not None and adv["status"]["advertisedPrefixes"] == len(prefixes)

        rib = fabric.rib()
        for route in rib:
            print(f"collector RIB: {route}")
        assert rib == expected_routes(gnode, vpc, vrf_id, prefixes)
        v6_slice = endpoint_slice(kube, pod.slices[0])
        assert v6_slice is not None
        assert {r.sid for r in rib} == {
            v6_slice["metadata"]["annotations"]["galactic.datum.net/srv6-sid"]}

        verdicts = judge_slices(kube, galactic, pod.slices)
        assert_ipv6_slice_accepted(kube, verdicts, pod.slices[0], vpc)

        detach_pod(gnode.node, pod, netns)
        wait_until("the collector to lose the Pod's routes after DEL", lambda: not fabric.rib(),
                   ROUTE_TIMEOUT_S, alive=fabric.alive)
        assert gnode.address in fabric.established(), "withdrawn, not a dropped session"


@pytest.mark.parametrize("family", ["IPv6", "IPv4"])
def test_ingress_sidecar_builds_a_route_from_the_slice_vpc_attach_writes(
        family: str, kube: Kube, cluster: Any, plugin: Plugin, galactic: GalacticBuild,
        netns: str, vpc: str, tmp_path: Path) -> None:
    """An IPv6 slice becomes the sidecar's route to the SID; an IPv4 slice is not selected
    (the sidecar publishes IPv6 backends only and logs any slice it selects otherwise as
    malformed, on every event)."""
    node = make_node(kube, cluster, plugin, locator=LOCATOR, node_id=1)
    pod = attach_pod(kube, node, f"side-{family.lower()}", vpc, "30", netns, tmp_path / "ipam",
                     "fd00:21:30::/64", "172.21.30.0/24", families=(family,))
    try:
        eps = endpoint_slice(kube, pod.slices[0])
        assert eps is not None and eps["addressType"] == family
        address = eps["endpoints"][0]["addresses"][0]
        host = ipaddress.ip_network(address).prefixlen
        sid = eps["metadata"]["annotations"]["galactic.datum.net/srv6-sid"]
        verdict = judge_slices(kube, galactic, pod.slices)[pod.slices[0]]
        print(f"\nsidecar verdict on {family} slice {pod.slices[0]}: {verdict}")
        if family == "IPv6":
            assert verdict == Verdict("default", pod.slices[0], True,
                                      SidecarRoute(vpc, f"{address}/{host}", sid), "")
        else:
            assert verdict == Verdict("default", pod.slices[0], False, None, "")
    finally:
        detach_pod(node, pod, netns)
