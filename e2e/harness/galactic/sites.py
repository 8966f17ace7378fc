"""Galactic sites: simulated nodes each running galactic-router beside vpc-attach, peered with
the fabric's gobgpd collector (`e2e.harness.galactic.fabric`), and what the collector must hold
for the Pods a site announces.

A site is a node namespace linked to the fabric, its BGPRouter (SRv6 locator `LOCATOR`, node ID
its index, router ID `router_id(index)`), a BGPPeer to the collector, galactic-router in the
namespace and the plugin configured for the node (through an agent of its own in the agent
pass). `start_site` is the one way a test starts one; its options add what some scenes need:
the Node object (owner of the node's BGP objects and IPAMBlocks), an ipamDataRoot of the node's
own, a fault proxy in front of the API server, an agent started with the node's host settings.
"""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni_plugin.core import naming
from cni_plugin.kernel.netns import entered
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ROUTERS
from e2e.harness.agentproc import AgentProcess, OwnAgents
from e2e.harness.faults import FaultProxy, ProxiedCluster, start_proxy
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import ASN, Fabric, create_peer, is_true
from e2e.harness.galactic.rib import EvpnRoute, sorted_routes
from e2e.harness.galactic.verdict import SidecarRoute, Verdict, judge
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES, api_port, in_node, node_namespace
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

LOCATOR = "2001:db8:ff01::/48"
# A router's status and the collector's RIB follow an API write within seconds; under CI's
# load (other suites, the full-kernel VM beside) a minute and more.
ROUTE_TIMEOUT_S = 90.0
FAMILIES = ("IPv6", "IPv4")


def router_id(index: int) -> str:
    """Site ``index``'s BGPRouter routerID: not its BGP address, so RD and next hop differ."""
    return f"198.51.100.{index}"


@dataclass
class GalacticSite:
    """A node of a galactic scene: its number, name, router and plugin (``node``), its BGP
    address (the next hop it announces), its BGPPeer, and what `start_site` added."""

    index: int
    node: Node
    address: str
    peer: str  # its BGPPeer's path
    uid: str | None = None  # its Node object's, when registered
    agent: AgentProcess | None = None  # its own, in the agent pass
    data_root: Path | None = None  # its ipamDataRoot, when it has one of its own
    proxied: ProxiedCluster | None = None  # the fault proxy its plugin talks through
    deleted: bool = False  # a test deleted its Node object

    @property
    def name(self) -> str:
        """Its node name."""
        return self.node.name

    @property
    def plugin(self) -> Plugin:
        """The plugin configured for it (runs inside its namespace)."""
        return self.node.plugin

    @property
    def netns(self) -> str:
        """The namespace acting as its host."""
        return self.node.plugin.prefix[-1]  # in_node(netns)

    @property
    def proxy(self) -> FaultProxy:
        """The proxy every API request of its plugin (and agent) goes through."""
        assert self.proxied is not None, f"{self.label()} was started without a proxy"
        return self.proxied.proxy

    def label(self) -> str:
        """`node 1 worker-…`."""
        return f"node {self.index} {self.name}"

    def served(self, verb: str) -> int:
        """How many of verb its agent answered (0 in-process: there is none)."""
        if self.agent is None:
            return 0
        return sum(1 for line in self.agent.verb_lines() if line.get("verb") == verb)

    def node_owner(self) -> dict[str, Any]:
        """The ownerReference naming its Node object."""
        assert self.uid is not None, f"{self.label()} has no Node object"
        return {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid}

    def expected_routes(self, vpc: str, vrf_id: int, prefixes: set[str]) -> list[EvpnRoute]:
        """What the collector must hold for ``prefixes`` announced by this site's router: its
        RD, the VPC's route target, its SID, its address as next hop."""
        sid = naming.srv6_sid(LOCATOR, self.index, vrf_id)
        return sorted_routes(EvpnRoute(prefix, f"{router_id(self.index)}:{vrf_id}",
                                       (naming.route_target(ASN, vpc),), sid, self.address,
                                       self.address)
                             for prefix in prefixes)


def start_site(stack: contextlib.ExitStack, fabric: Fabric, index: int, kube: Kube,
               cluster: Any, cni_bin: Path, own_agents: OwnAgents, directory: Path, *,
               register_node: bool = False, ipam_data_root: bool = False,
               behind_proxy: bool = False,
               agent_with_host_settings: bool = False) -> GalacticSite:
    """Site ``index``, up once its BGPRouter is Ready and its session with the collector is
    Established; everything it made goes when ``stack`` closes.

    ``register_node``: its Node object, created before any ADD (its BGP objects and IPAMBlocks
    are then owned by it). ``ipam_data_root``: `<directory>/ipam-<index>` as its ipamDataRoot
    (its notes of claims are its own). ``behind_proxy``: its plugin reaches the API server
    through a fault proxy of its own (listening inside its namespace), which counts requests.
    ``agent_with_host_settings``: in the agent pass its agent starts with the node's settings,
    as the DaemonSet's does (its watches are then the node's: an IPAMClaim watch frees here);
    otherwise its agent learns the node from each request."""
    netns = stack.enter_context(node_namespace(api_port(cluster.server)))
    address = fabric.link(index, netns)
    locks = directory / f"locks-{index}"
    locks.mkdir()
    plugin = Plugin(cni_bin, locks, prefix=in_node(netns))
    data_root = None
    if ipam_data_root:
        data_root = directory / f"ipam-{index}"
        data_root.mkdir()
        plugin.environ["VPC_ATTACH_IPAM_DATA_ROOT"] = str(data_root)
    node = make_node(kube, cluster, plugin, locator=LOCATOR, node_id=index,
                     router_id=router_id(index))
    site = GalacticSite(index, node, address, "", data_root=data_root)
    if register_node:
        created = kube.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": node.name}})
        stack.callback(kube.delete, f"{NODES}/{node.name}")  # its objects go with it
        site.uid = str(created["metadata"]["uid"])
    if behind_proxy:
        site.proxied = _proxy_in(stack, netns, cluster, directory / f"proxy-{index}")
        plugin.environ["VPC_ATTACH_KUBECONFIG"] = str(site.proxied.kubeconfig)
    if VIA_AGENT:
        agent_dir = directory / f"agent-{index}"
        agent_dir.mkdir()
        env = None
        if agent_with_host_settings:
            env = {**plugin.environ, "VPC_ATTACH_LOCK_DIR": str(locks),
                   "VPC_ATTACH_HOST_CONFIG": str(locks / "absent-host.json")}
        site.agent = own_agents.enter(stack, agent_dir, prefix=in_node(netns), env=env)
        plugin.agent_socket = str(site.agent.socket)
    site.peer = create_peer(kube, BGP_NS, node.router, index)
    stack.callback(kube.delete, site.peer)
    # Stopped before its namespace goes (the stack unwinds in reverse).
    stack.callback(fabric.start_router(index, netns, node.name, cluster.admin_kubeconfig).stop)
    wait_until(f"BGPRouter {node.router} Ready",
               is_true(lambda: kube.get(ROUTERS.path(BGP_NS, node.router)), "Ready"),
               ROUTE_TIMEOUT_S, alive=fabric.alive)
    wait_until(f"{node.router}'s session with the collector",
               lambda: address in fabric.established(), ROUTE_TIMEOUT_S, alive=fabric.alive)
    return site


def _proxy_in(stack: contextlib.ExitStack, netns: str, cluster: Any,
              directory: Path) -> ProxiedCluster:
    """A fault proxy created inside the node's namespace: its listener (and its threads) live
    there, where the plugin and agent connect; it reaches the API server through the node's
    forwarder."""
    directory.mkdir()
    with entered(f"/var/run/netns/{netns}"):
        proxied = start_proxy(cluster, directory)
    stack.callback(proxied.stop)
    return proxied


def wait_announced(kube: Kube, fabric: Fabric, site: GalacticSite, vpc: str, att: str,
                   prefixes: set[str]) -> int:
    """Wait until the site's router reports the VPC's instance accepted and the advertisement
    advertised, and the collector holds ``prefixes`` from it; returns the VRF ID."""
    vrf_name = naming.vrf_instance_name(vpc, site.name)
    adv_name = naming.advertisement_name(vpc, att, site.name)
    wait_until(f"{site.node.router} to accept {vrf_name} and advertise {adv_name}",
               lambda: is_true(lambda: vrf_instance(kube, vrf_name), "Ready")()
               and is_true(lambda: advertisement(kube, adv_name), "Advertised")(),
               ROUTE_TIMEOUT_S, alive=fabric.alive)
    wait_until(f"the collector to receive {sorted(prefixes)} from {site.address}",
               lambda: {r.prefix for r in fabric.rib() if r.router == site.address} == prefixes,
               ROUTE_TIMEOUT_S, alive=fabric.alive)
    # The router's own view of the session (its status is refreshed when it reconciles).
    wait_until(f"{site.peer} Established in its status",
               lambda: (kube.get(site.peer) or {}).get("status", {}).get("sessionState")
               == "Established", ROUTE_TIMEOUT_S, alive=fabric.alive)
    instance = vrf_instance(kube, vrf_name)
    assert instance is not None
    return int(instance["spec"]["vrfID"])


# A veth Pod on a site, published ---------------------------------------------------------------

@dataclass
class AttachedPod:
    """A Pod attached through the plugin on a site: what DEL needs, and its EndpointSlices."""

    node: Node
    conf: dict[str, Any]
    container_id: str
    args: str
    netns: str
    slices: list[str]

    def detach(self) -> None:
        """The runtime's DEL of what `attach_pod` added."""
        self.node.plugin.ok("DEL", self.conf, container_id=self.container_id, netns=self.netns,
                            CNI_ARGS=self.args)


def attach_pod(kube: Kube, node: Node, pod: str, vpc: str, att: str, netns: str,
               ipam_dir: Path, *subnets: str,
               families: tuple[str, ...] = FAMILIES) -> AttachedPod:
    """ADD a veth for a new Pod on ``node``, publishing BGP and a slice per family."""
    uid = create_pod(kube, pod, node.name)
    conf = base_conf(vpc, att, ipam=host_local(ipam_dir, *subnets))
    conf["publish"] = {"bgp": True, "endpointSlice": True,
                       "endpointSliceFamilies": list(families)}
    attached = AttachedPod(node, conf, f"ctr-{pod}", node.cni_args(pod, uid), netns,
                           [slice_name(pod, vpc, att, family) for family in families])
    node.plugin.ok("ADD", conf, container_id=attached.container_id, netns=netns,
                   CNI_ARGS=attached.args)
    return attached


# galactic's ingress sidecar on the slices ----------------------------------------------------

def judge_slices(kube: Kube, galactic: GalacticBuild, names: list[str]) -> dict[str, Verdict]:
    """galactic's ingress-sidecar code's verdict on each slice, read back from the API server;
    printed."""
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


def host_prefix(address: str) -> str:
    """An address (with or without a prefix length) as its host prefix."""
    host = ipaddress.ip_interface(address).ip
    return f"{host}/{host.max_prefixlen}"
