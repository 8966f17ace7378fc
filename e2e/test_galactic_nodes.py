"""One attachment's Pods spread over three nodes, each node running galactic-router (issue 21
item 6). A gobgpd collector peered with every router holds each Pod's prefixes exactly once,
from the router of the node the Pod runs on, with that node's RD, SID, route target and next
hop, through a scale-down, a node losing its last Pod, a refused write's rollback, a node whose
API writes fail, and the deletion of a node's Node object (the garbage collector removes that
node's BGP objects through their ownerReference and its router withdraws them). galactic's
ingress-sidecar code routes each Pod's IPv6 slice to the SID its node announces. Each node
reaches the API server through a fault proxy of its own, which also counts each verb's requests.
The tests share one deployment (the module's `deployment` fixture: collector, routers, proxies,
six Pods) and each proves one of those behaviours on it.

Two Pods of one attachment cannot share a node as veth attachments (the host link is named by
VPC and attachment, SPEC §5), so the Pods use the publish-after-ptp chain: ptp creates the
Pod's interface from its node's host-local pool, and vpc-attach (`attachment: existing`)
publishes its addresses, each as a host prefix (SPEC §6).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cni_plugin.core import naming
from cni_plugin.kernel.netns import entered
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ENDPOINT_SLICES, PODS
from e2e.harness.agentproc import OwnAgents
from e2e.harness.faults import Fault, FaultProxy, ProxiedCluster, Rule, Seen, start_proxy
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import (
    Fabric,
    is_true,
    running_fabric,
)
from e2e.harness.galactic.rib import EvpnRoute, sorted_routes
from e2e.harness.kernel import links_in, remove_vpc_objects, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES
from e2e.harness.plugin import VIA_AGENT, Answer, host_local, random_vpc, with_prev
from e2e.harness.publishing import (
    Node,
    advertisement,
    advertisements_of,
    create_pod,
    deny_writes,
    vrf_instance,
    wait_denied,
)
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until
from e2e.test_galactic_router import (
    ROUTE_TIMEOUT_S,
    GalacticNode,
    assert_ipv6_slice_accepted,
    expected_routes,
    judge_slices,
    start_node,
    wait_announced,
)

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
ATT = "40"
GC_TIMEOUT_S = 120.0  # the garbage collector notices a deleted Node's dependents
FAULT_TIMEOUT_S = 6.0  # the node's timeoutSeconds while every advertisement write fails
WRITES = ("POST", "PUT", "PATCH", "DELETE")
PATH = "agent" if VIA_AGENT else "in-process"
T = TypeVar("T")
# The requests of an ADD of the attachment on a node whose VRF instance and advertisement exist,
# as many as before per-node advertisements (the shared form is read only by the ADD creating
# this node's). The agent answers VPCBindings, namespaces, the router, the router's instances
# and the Pod from its watch caches; the instance itself is read fresh before it is written.
# The advertisement is read once: its PUT is conditional on that read's resourceVersion.
STEADY_ADD = {
    "in-process": ["LIST vpcbindings 200", "GET namespaces 200", "LIST bgprouters 200",
                   "GET bgpvrfinstances 200", "LIST bgpvrfinstances 200",
                   "GET bgpadvertisements 200", "PUT bgpadvertisements 200", "GET pods 200",
                   "POST endpointslices 201"],
    "agent": ["GET bgpvrfinstances 200", "GET bgpadvertisements 200",
              "PUT bgpadvertisements 200", "POST endpointslices 201"],
}[PATH]
# DEL of a Pod (both paths alike: no cache is used): its slices (both families looked for),
# then this node's advertisement, updated or deleted.
DEL_KEEPING = ["GET endpointslices 200", "DELETE endpointslices 200", "GET endpointslices 404",
               "GET bgpadvertisements 200", "PUT bgpadvertisements 200"]
DEL_LAST = [*DEL_KEEPING[:-1], "DELETE bgpadvertisements 200"]
# What an ADD creating this node's advertisement asks of advertisements: this node's (404), then
# in-process the shared form (404); the agent instead lists the namespace's advertisements, once
# (on the first ADD on a node that is not the agent's own: it lists its own when it starts).
FIRST_ADVERTISEMENT_READS = {
    "in-process": ["GET bgpadvertisements 404", "GET bgpadvertisements 404",
                   "POST bgpadvertisements 201"],
    "agent": ["GET bgpadvertisements 404", "LIST bgpadvertisements 200",
              "POST bgpadvertisements 201"],
}[PATH]
LATER_ADVERTISEMENT_READS = {
    "in-process": FIRST_ADVERTISEMENT_READS,
    "agent": ["GET bgpadvertisements 404", "POST bgpadvertisements 201"],
}[PATH]
FIRST_ADD = "ADD first on node {} (creates instance, advertisement)"
SECOND_ADD = "ADD second on node {}"
STEADY = "ADD third on node 1 (steady state)"
AGAIN = "ADD on node 2 again (instance kept, advertisement created)"
SCALE_DOWN = "DEL on node 3, another Pod left (advertisement updated)"
LAST_POD = "DEL of node 2's last Pod (advertisement deleted)"
REFUSED_SLICE = "ADD on node 1 refused its slice (rolled back)"


# A node, its Pods, and what its fault proxy saw ------------------------------------------------

@dataclass
class Site:
    """A node of the deployment: galactic-router, the plugin behind its own fault proxy, the
    Node object owning its BGP objects, and its host-local pool."""

    gnode: GalacticNode
    proxied: ProxiedCluster
    node_uid: str
    pool: Path
    deleted: bool = False  # its Node object was deleted

    @property
    def index(self) -> int:
        """Its number (1-based), as the fabric and its router know it."""
        return self.gnode.index

    @property
    def node(self) -> Node:
        """Its name, router and plugin."""
        return self.gnode.node

    @property
    def proxy(self) -> FaultProxy:
        """The proxy every API request of its plugin (and agent) goes through."""
        return self.proxied.proxy

    def subnets(self) -> tuple[str, str]:
        """Its pool: an IPv6 /64 and an IPv4 /24 of its own."""
        return f"fd00:40:{self.index}::/64", f"172.40.{self.index}.0/24"


def start_site(stack: contextlib.ExitStack, fabric: Fabric, index: int, kube: Kube,
               cluster: Any, cni_bin: Path, own_agents: OwnAgents, tmp_path: Path) -> Site:
    """Node ``index`` as test_galactic_router starts it, then its Node object (before any ADD,
    so its BGP objects are created owned by it) and its fault proxy."""
    gnode = start_node(stack, fabric, index, kube, cluster, cni_bin, own_agents, tmp_path)
    node_netns = gnode.node.plugin.prefix[-1]  # in_node(netns): the node's namespace
    directory = tmp_path / f"proxy-{index}"
    directory.mkdir()
    # Created inside the node's namespace: its listener (and its threads) live there, where the
    # plugin and agent connect; it reaches the API server through the node's forwarder.
    with entered(f"/var/run/netns/{node_netns}"):
        proxied = start_proxy(cluster, directory)
    stack.callback(proxied.stop)
    gnode.node.plugin.environ["VPC_ATTACH_KUBECONFIG"] = str(proxied.kubeconfig)
    created = kube.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": gnode.node.name}})
    stack.callback(kube.delete, f"{NODES}/{gnode.node.name}")  # its BGP objects go with it
    return Site(gnode, proxied, str(created["metadata"]["uid"]), tmp_path / f"pool-{index}")


@dataclass
class Pod:
    """A Pod of the deployment on a node: ptp's interface, vpc-attach publishing it."""

    name: str
    site: Site
    netns: str
    uid: str
    ptp: dict[str, Any]
    conf: dict[str, Any]
    ptp_result: dict[str, Any]
    result: dict[str, Any] | None = None  # the chain's result, once vpc-attach added it
    live: bool = True

    @property
    def container_id(self) -> str:
        """The sandbox's container ID."""
        return f"ctr-{self.name}"

    @property
    def args(self) -> str:
        """CNI_ARGS as containerd sends them."""
        return self.site.node.cni_args(self.name, self.uid)

    @property
    def prefixes(self) -> set[str]:
        """What its node must announce for it: each address as a host prefix."""
        hosts = (ipaddress.ip_interface(ip["address"]).ip for ip in self.ptp_result["ips"])
        return {f"{host}/{host.max_prefixlen}" for host in hosts}


def start_pod(stack: contextlib.ExitStack, kube: Kube, site: Site, label: str, vpc: str) -> Pod:
    """A Pod object (deleted after the test), its netns, and ptp's interface in it (the chain's
    first plugin)."""
    name = f"d40-{secrets.token_hex(2)}-{label}"
    uid = create_pod(kube, name, site.node.name)
    stack.callback(functools.partial(kube.delete, PODS.path("default", name),
                                     grace_period_seconds=0))
    netns = stack.enter_context(temporary_netns("vpa-d40"))
    network = f"net-{vpc}"
    ptp = {"cniVersion": "1.1.0", "name": network, "type": "ptp", "ipMasq": False,
           "ipam": host_local(site.pool, *site.subnets())}
    conf = {"cniVersion": "1.1.0", "name": network, "type": "vpc-attach", "vpc": vpc,
            "vpcattachment": ATT, "attachment": "existing",
            "publish": {"bgp": True, "endpointSlice": True}}
    pod = Pod(name, site, netns, uid, ptp, conf, {})
    pod.ptp_result = site.node.plugin.ok("ADD", ptp, container_id=pod.container_id,
                                         netns=netns, CNI_ARGS=pod.args, executable="ptp")
    return pod


def publish(pod: Pod, **extra: str) -> Answer:
    """vpc-attach's ADD of the Pod (prevResult: ptp's)."""
    return pod.site.node.plugin.call("ADD", with_prev(pod.conf, pod.ptp_result),
                                     container_id=pod.container_id, netns=pod.netns,
                                     CNI_ARGS=pod.args, **extra)


def delete_chain(pod: Pod) -> None:
    """The runtime's DEL of the chain, last plugin first."""
    plugin = pod.site.node.plugin
    plugin.ok("DEL", with_prev(pod.conf, pod.result or pod.ptp_result),
              container_id=pod.container_id, netns=pod.netns, CNI_ARGS=pod.args)
    plugin.ok("DEL", pod.ptp, container_id=pod.container_id, netns=pod.netns,
              CNI_ARGS=pod.args, executable="ptp")
    pod.live = False


def request_label(seen: Seen) -> str:
    """`VERB resource status` of a request, LIST and WATCH told apart from GET."""
    verb = seen.method
    if verb == "GET" and seen.name is None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(seen.path).query)
        verb = "WATCH" if query.get("watch", ["false"])[0] in ("1", "true") else "LIST"
    return f"{verb} {seen.resource} {seen.status if seen.status is not None else '-'}"


@dataclass
class Requests:
    """What each measured verb asked the API server (its node's proxy saw it), in order;
    Events the agent writes after answering and watches are left out (they are no verb's)."""

    calls: dict[str, list[str]] = field(default_factory=dict)

    def measure(self, what: str, proxy: FaultProxy, call: Callable[[], T]) -> T:
        """Run ``call``, keeping the requests that ended while it ran."""
        began = time.monotonic()
        result = call()
        ended = time.monotonic()
        labels = (request_label(s) for s in proxy.seen()
                  if began <= s.at <= ended and s.resource != "events")
        self.calls[what] = [label for label in labels if not label.startswith("WATCH")]
        return result

    def report(self) -> None:
        """Printed for the closing note."""
        for what, labels in self.calls.items():
            print(f"requests ({PATH}) {what}: {len(labels)}: {', '.join(labels)}")


# The deployment --------------------------------------------------------------------------------

def describe(route: EvpnRoute, names: dict[str, str]) -> str:
    """One RIB line: prefix, RD, RT, SID, next hop, and the router (node) it came from."""
    return (f"{route.prefix:<20} rd {route.rd:<16} rt {','.join(route.route_targets)} "
            f"sid {route.sid} next-hop {route.next_hop} from {route.router} "
            f"({names.get(route.router, '?')})")


@dataclass
class Deployment:
    """The sites, the Pods, and what the collector and the API server must hold for them."""

    kube: Kube
    fabric: Fabric
    vpc: str
    sites: list[Site]
    stack: contextlib.ExitStack
    pods: list[Pod] = field(default_factory=list)
    vrf_ids: dict[int, int] = field(default_factory=dict)
    router_refs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name
    requests: Requests = field(default_factory=Requests)

    def add(self, site: Site, label: str, what: str) -> Pod:
        """A new Pod on ``site``, attached (requests measured as ``what``)."""
        pod = start_pod(self.stack, self.kube, site, label, self.vpc)
        answer = self.requests.measure(what, site.proxy, lambda: publish(pod))
        assert answer.status == 0, f"ADD {pod.name} failed: {answer.stdout} {answer.stderr}"
        pod.result = answer.body
        self.pods.append(pod)
        return pod

    def live(self, site: Site | None = None) -> list[Pod]:
        """The Pods still attached (on ``site``), oldest first."""
        return [p for p in self.pods if p.live and (site is None or p.site is site)]

    def remove(self, pod: Pod, what: str) -> None:
        """The runtime's DEL of a Pod (vpc-attach's requests measured as ``what``)."""
        self.requests.measure(what, pod.site.proxy, lambda: delete_chain(pod))

    def prefixes(self, site: Site) -> set[str]:
        """What ``site``'s router must announce: its live Pods' prefixes, none once its Node
        object is deleted."""
        if site.deleted:
            return set()
        return set().union(*(p.prefixes for p in self.pods if p.site is site and p.live))

    def expected(self) -> list[EvpnRoute]:
        """The collector's exact RIB."""
        routes: list[EvpnRoute] = []
        for site in self.sites:
            if prefixes := self.prefixes(site):
                routes += expected_routes(site.gnode, self.vpc, self.vrf_ids[site.index],
                                          prefixes)
        return sorted_routes(routes)

    def show(self, step: str, rib: list[EvpnRoute]) -> None:
        """The RIB, one readable line per route."""
        names = {s.gnode.address: f"node {s.index} {s.node.name}" for s in self.sites}
        print(f"collector RIB step {step}: {len(rib)} routes")
        for route in rib:
            print(f"collector RIB step {step}: {describe(route, names)}")

    def settle(self, step: str, expected: list[EvpnRoute] | None = None) -> list[EvpnRoute]:
        """Wait until the collector holds exactly what it must, print it and return it."""
        want = self.expected() if expected is None else expected
        seen: list[list[EvpnRoute]] = [[]]

        def holds() -> bool:
            seen[0] = self.fabric.rib()
            return seen[0] == want

        wait_until(f"the collector's RIB at step {step}", holds, ROUTE_TIMEOUT_S,
                   alive=self.fabric.alive,
                   detail=lambda: f"held {seen[0]}\nwanted {want}")
        self.show(step, seen[0])
        assert seen[0] == want
        return seen[0]

    def check_objects(self) -> None:
        """One BGPAdvertisement per node with live Pods (none other of the attachment), each
        naming that node's router since its creation, announcing that node's Pods, owned by
        that node's Node; each live node's VRF instance owned by it too."""
        found = advertisements_of(self.kube, self.vpc, ATT)
        wanted = {naming.advertisement_name(self.vpc, ATT, s.node.name): s
                  for s in self.sites if self.prefixes(s)}
        assert set(found) == set(wanted), f"advertisements {sorted(found)}"
        for name, site in wanted.items():
            adv = found[name]
            ref = adv["spec"]["routerRef"]
            assert ref == {"name": site.node.router}
            assert self.router_refs.setdefault(name, ref) == ref, f"{name}'s routerRef moved"
            assert adv["spec"]["prefixes"] == sorted(set(adv["spec"]["prefixes"]))
            assert set(adv["spec"]["prefixes"]) == self.prefixes(site)
            assert adv["spec"]["vrfID"] == self.vrf_ids[site.index]
            assert owners(adv) == [node_owner(site)]
            instance = vrf_instance(self.kube, naming.vrf_instance_name(self.vpc, site.node.name))
            assert instance is not None and owners(instance) == [node_owner(site)]


def owners(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """An object's ownerReferences, reduced to what names the owner."""
    return [{key: ref.get(key) for key in ("apiVersion", "kind", "name", "uid")}
            for ref in obj["metadata"].get("ownerReferences") or []]


def node_owner(site: Site) -> dict[str, Any]:
    """The ownerReference naming ``site``'s Node object."""
    return {"apiVersion": "v1", "kind": "Node", "name": site.node.name, "uid": site.node_uid}


@contextlib.contextmanager
def rib_samples(fabric: Fabric) -> Iterator[set[EvpnRoute]]:
    """Every route the collector held while the block ran (sampled in a thread)."""
    seen: set[EvpnRoute] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.update(fabric.rib())
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, name="rib sampler", daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join(30)


def router_caught_up(adv: dict[str, Any] | None) -> bool:
    """Whether its router's status reports this generation of the advertisement advertised
    with all its prefixes (the router writes no status after that until something changes)."""
    status = (adv or {}).get("status") or {}
    return adv is not None \
        and status.get("observedGeneration") == adv["metadata"]["generation"] \
        and is_true(lambda: adv, "Advertised")() \
        and status.get("advertisedPrefixes") == len(adv["spec"]["prefixes"])


def settled_advertisements(deployment: Deployment) -> dict[str, dict[str, Any]]:
    """The attachment's advertisements once every router has reported on them."""
    found: list[dict[str, dict[str, Any]]] = [{}]

    def caught_up() -> bool:
        found[0] = advertisements_of(deployment.kube, deployment.vpc, ATT)
        return all(router_caught_up(adv) for adv in found[0].values())

    wait_until("every router's status on its advertisement", caught_up, ROUTE_TIMEOUT_S,
               alive=deployment.fabric.alive, detail=lambda: str(found[0]))
    return found[0]


def versions(advertisements: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each advertisement's resourceVersion, by name."""
    return {name: adv["metadata"]["resourceVersion"] for name, adv in advertisements.items()}


# The deployment the tests share ----------------------------------------------------------------

@pytest.fixture(scope="module")
def deployment(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
               galactic: GalacticBuild,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The collector, three nodes and six Pods of one VPC attachment (three on node 1, one on
    node 2, two on node 3), announced; set up once for the module (a minute under load), each
    ADD's requests measured. Before each measured ADD the routers' status writes are done (none
    costs it a conflict). The tests run in file order; each starts by arranging the Pods it
    needs from what the earlier ones left."""
    tmp_path = tmp_path_factory.mktemp("galactic-nodes")
    vpc = random_vpc()
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, [vpc])
        stack.enter_context(bound(kube, vpc))
        fabric = stack.enter_context(running_fabric(galactic, tmp_path, nodes=3))
        sites = [start_site(stack, fabric, index, kube, cluster, cni_bin, own_agents, tmp_path)
                 for index in (1, 2, 3)]
        first, second, third = sites
        shared = Deployment(kube, fabric, vpc, sites, stack)
        shared.add(first, "a1", FIRST_ADD.format(1))
        shared.add(second, "b1", FIRST_ADD.format(2))
        shared.add(third, "c1", FIRST_ADD.format(3))
        settled_advertisements(shared)
        shared.add(first, "a2", SECOND_ADD.format(1))
        settled_advertisements(shared)
        shared.add(third, "c2", SECOND_ADD.format(3))
        settled_advertisements(shared)
        shared.add(first, "a3", STEADY)
        for site in sites:
            shared.vrf_ids[site.index] = wait_announced(kube, fabric, site.gnode, vpc, ATT,
                                                        shared.prefixes(site))
        yield shared
        for pod in shared.live():  # what the tests left (all of it when one failed early)
            with contextlib.suppress(AssertionError):
                delete_chain(pod)
        shared.requests.report()


def test_each_pod_is_announced_once_by_its_own_nodes_router_with_its_rd_rt_sid_and_next_hop(
        deployment: Deployment) -> None:
    deployment.settle("6 Pods on 3 nodes")
    deployment.check_objects()
    assert len(deployment.router_refs) == 3


def test_the_ingress_sidecar_routes_each_pods_slice_to_the_sid_its_node_announces(
        deployment: Deployment, galactic: GalacticBuild) -> None:
    """galactic's ingress-sidecar code selects each Pod's IPv6 slice and routes the Pod's /128
    to the SID the collector holds for that prefix: its node's."""
    rib = deployment.settle("6 Pods on 3 nodes")
    names = {slice_name(pod.name, deployment.vpc, ATT, "IPv6"): pod
             for pod in deployment.live()}
    verdicts = judge_slices(deployment.kube, galactic, sorted(names))
    announced = {route.prefix: route.sid for route in rib}
    for name, pod in names.items():
        assert_ipv6_slice_accepted(deployment.kube, verdicts, name, deployment.vpc)
        route = verdicts[name].route
        assert route is not None and route.prefix in pod.prefixes
        assert route.sid == announced[route.prefix], f"{name}: {route} vs the RIB"


def test_an_add_reads_its_node_once_and_a_steady_add_asks_only_its_budget(
        deployment: Deployment) -> None:
    """A steady ADD asks one request fewer than before per-node advertisements (it read the
    advertisement twice: 10 in-process, 5 through the agent). The first ADD on a node reads
    its Node once for both objects it creates. In-process, an ADD creating the advertisement
    reads the shared form too; the agent lists the namespace's advertisements once instead and
    reads no shared form that holds none of its node's containers."""
    calls = deployment.requests.calls
    assert calls[STEADY] == STEADY_ADD, calls[STEADY]
    if not VIA_AGENT:  # through the agent, its second ADD may still be warming its caches
        assert calls[SECOND_ADD.format(1)] == calls[SECOND_ADD.format(3)] == STEADY_ADD
    for index in (1, 2, 3):
        first = calls[FIRST_ADD.format(index)]
        assert first.count("GET nodes 200") == 1, first
        assert advertisement_requests(first) == FIRST_ADVERTISEMENT_READS, first
        assert [c for c in first if c.startswith("POST bgp")] == \
            ["POST bgpvrfinstances 201", "POST bgpadvertisements 201"], first


def test_scaling_a_node_down_withdraws_only_the_deleted_pods_prefixes(
        deployment: Deployment) -> None:
    """DEL with another Pod left on the node reads and updates this node's advertisement only."""
    third = deployment.sites[2]
    while len(deployment.live(third)) < 2:
        deployment.add(third, f"c{secrets.token_hex(1)}", "ADD arranging node 3's two Pods")
    settled_advertisements(deployment)  # no router status write costs the DEL a conflict
    deployment.remove(deployment.live(third)[-1], SCALE_DOWN)
    deployment.settle("node 3 scaled down")
    deployment.check_objects()
    assert deployment.requests.calls[SCALE_DOWN] == DEL_KEEPING


def test_deleting_a_nodes_last_pod_deletes_its_advertisement_and_withdraws_its_routes(
        deployment: Deployment) -> None:
    second = deployment.sites[1]
    if not deployment.live(second):
        deployment.add(second, f"b{secrets.token_hex(1)}", "ADD arranging node 2's Pod")
    for pod in deployment.live(second)[1:]:
        deployment.remove(pod, "DEL arranging node 2's last Pod")
    settled_advertisements(deployment)
    deployment.remove(deployment.live(second)[0], LAST_POD)
    name = naming.advertisement_name(deployment.vpc, ATT, second.node.name)
    assert advertisement(deployment.kube, name) is None
    deployment.settle("node 2 empty")
    deployment.check_objects()
    assert deployment.requests.calls[LAST_POD] == DEL_LAST


def test_an_add_next_to_a_kept_vrf_instance_creates_the_advertisement_without_reading_the_node(
        deployment: Deployment) -> None:
    """DEL keeps the node's VRF instance; the next ADD there creates the advertisement with the
    Node's ownerReference taken from the instance."""
    second = deployment.sites[1]
    for pod in deployment.live(second):
        deployment.remove(pod, "DEL arranging an empty node 2")
    assert vrf_instance(deployment.kube,
                        naming.vrf_instance_name(deployment.vpc, second.node.name)) is not None
    settled_advertisements(deployment)
    deployment.add(second, "b2", AGAIN)
    deployment.settle("a Pod on node 2 again")
    deployment.check_objects()
    again = deployment.requests.calls[AGAIN]
    assert not [c for c in again if c.startswith("GET nodes")], again
    assert advertisement_requests(again) == LATER_ADVERTISEMENT_READS, again


def test_a_refused_slice_rolls_the_add_back_and_the_rib_returns_to_what_it_was(
        deployment: Deployment) -> None:
    """An ADD on node 1 whose EndpointSlice create is refused: it fails after publishing the
    advertisement; its rollback gives the advertisement back its annotations, and the RIB is
    what it was before."""
    site = deployment.sites[0]
    kube, name = deployment.kube, naming.advertisement_name(deployment.vpc, ATT, site.node.name)
    if not deployment.live(site):
        deployment.add(site, f"a{secrets.token_hex(1)}", "ADD arranging node 1's Pod")
    before_rib = deployment.settle("before the refused ADD on node 1")
    before = advertisement(kube, name)
    assert before is not None
    pod = start_pod(deployment.stack, kube, site, "ax", deployment.vpc)
    remove = deny_writes(kube, f"deny-{pod.name}", "endpointslices", "discovery.k8s.io",
                         ["CREATE"], pod.name)
    try:
        wait_denied(lambda: kube.create(ENDPOINT_SLICES.path("default"), {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{pod.name}-probe"}, "addressType": "IPv6",
            "endpoints": []}, dry_run=True))
        with rib_samples(deployment.fabric) as sampled:
            answer = deployment.requests.measure(REFUSED_SLICE, site.proxy, lambda: publish(pod))
            assert answer.code == 104 and "EndpointSlice" in answer.body["msg"], answer.stdout
            wait_until(f"{name}'s annotations as before the ADD",
                       lambda: _annotations(advertisement(kube, name))
                       == _annotations(before))
            after = advertisement(kube, name)
            assert after is not None and after["spec"] == before["spec"]
            deployment.settle("after the rolled-back ADD on node 1", before_rib)
    finally:
        remove()
    transient = sorted(r.prefix for r in sampled - set(before_rib))
    print(f"rolled-back ADD: prefixes announced meanwhile: {transient or 'none'}")
    assert set(transient) <= pod.prefixes
    assert kube.get(ENDPOINT_SLICES.path("default", slice_name(pod.name, deployment.vpc, ATT,
                                                               "IPv6"))) is None
    wrote = deployment.requests.calls[REFUSED_SLICE]
    assert wrote.count("PUT bgpadvertisements 200") == 2, wrote  # published, then withdrawn
    deployment.check_objects()
    deployment.requests.measure("DEL after node 1's refused ADD (nothing of it published)",
                                site.proxy, lambda: delete_chain(pod))
    deployment.settle("after DEL of the refused ADD on node 1", before_rib)


def test_an_add_whose_advertisement_writes_all_fail_answers_11_and_moves_no_announcement(
        deployment: Deployment) -> None:
    """Every advertisement write of node 2 meets a 503 until the ADD's deadline: it fails, and
    every node's advertisement and announcements stay exactly as they were."""
    site = deployment.sites[1]
    if not deployment.live(site):
        deployment.add(site, f"b{secrets.token_hex(1)}", "ADD arranging node 2's Pod")
    before_rib = deployment.settle("before node 2's failing ADD")
    deployment.check_objects()
    before = settled_advertisements(deployment)
    assert len(before) == len([s for s in deployment.sites if deployment.prefixes(s)])
    pod = start_pod(deployment.stack, deployment.kube, site, "bx", deployment.vpc)
    rules = [Rule(Fault.RESPOND, method=method, resource="bgpadvertisements", times=0,
                  status=503, retry_after=1.0) for method in WRITES]
    with site.proxy.rules(*rules):
        answer = deployment.requests.measure(
            "ADD on node 2 with every advertisement write failing", site.proxy,
            lambda: publish(pod, VPC_ATTACH_TIMEOUT_SECONDS=str(FAULT_TIMEOUT_S)))
    adv_name = naming.advertisement_name(deployment.vpc, ATT, site.node.name)
    assert answer.code == 11 and f"bgpadvertisements/{adv_name}" in answer.body["msg"], \
        answer.stdout
    assert sum(rule.fired for rule in rules) >= 1
    after = advertisements_of(deployment.kube, deployment.vpc, ATT)
    assert versions(after) == versions(before), f"before {before}\nafter {after}"
    rib = deployment.fabric.rib()
    deployment.show("after node 2's failed ADD", rib)
    assert rib == before_rib
    deployment.check_objects()
    deployment.requests.measure("DEL after node 2's failed ADD (nothing of it published)",
                                site.proxy, lambda: delete_chain(pod))
    assert versions(advertisements_of(deployment.kube, deployment.vpc, ATT)) == versions(before)


def test_a_deleted_node_object_takes_its_bgp_objects_and_routes_and_del_still_succeeds(
        deployment: Deployment) -> None:
    """Node 3's Node object deleted: the garbage collector deletes its advertisement and VRF
    instance (their ownerReference), its router withdraws; the other nodes' routes stay; DEL of
    its Pod still succeeds."""
    site = deployment.sites[2]
    kube, vpc = deployment.kube, deployment.vpc
    if not deployment.live(site):
        deployment.add(site, f"c{secrets.token_hex(1)}", "ADD arranging node 3's Pod")
    deployment.settle("before node 3's Node is deleted")
    pod = deployment.live(site)[0]
    adv_name = naming.advertisement_name(vpc, ATT, site.node.name)
    vrf_name = naming.vrf_instance_name(vpc, site.node.name)
    assert kube.delete(f"{NODES}/{site.node.name}")
    site.deleted = True
    wait_until(f"the garbage collector to delete {adv_name} and {vrf_name}",
               lambda: advertisement(kube, adv_name) is None
               and vrf_instance(kube, vrf_name) is None, GC_TIMEOUT_S)
    deployment.settle("node 3's Node deleted")
    deployment.check_objects()
    assert links_in(pod.netns) == {"lo", "eth0"}  # its interface is still there
    deployment.remove(pod, "DEL on node 3 after its Node and BGP objects were deleted")
    assert advertisement(kube, adv_name) is None and vrf_instance(kube, vrf_name) is None
    assert links_in(pod.netns) == {"lo"}
    deployment.settle("after DEL of node 3's last Pod")


def test_deleting_every_pod_withdraws_every_route_and_keeps_the_vrf_instances(
        deployment: Deployment) -> None:
    """DEL never deletes a VRF instance; a live node's stays until its Node object goes."""
    for pod in deployment.live():
        deployment.remove(pod, f"DEL {pod.name.rsplit('-', 1)[-1]}")
    deployment.settle("every Pod deleted")
    assert advertisements_of(deployment.kube, deployment.vpc, ATT) == {}
    for site in deployment.sites:
        if not site.deleted:
            name = naming.vrf_instance_name(deployment.vpc, site.node.name)
            assert vrf_instance(deployment.kube, name) is not None, name


def advertisement_requests(calls: list[str]) -> list[str]:
    """The requests about BGPAdvertisements, in order."""
    return [call for call in calls if " bgpadvertisements " in call]


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict((obj or {}).get("metadata", {}).get("annotations") or {})
