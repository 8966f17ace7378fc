"""A deployment spread over galactic sites: Pods of one VPC attachment on several nodes, each
behind its node's fault proxy (which counts each verb's requests), and what the collector and
the API server must hold for them.

Two Pods of one attachment cannot share a node as veth attachments (the host link is named by
VPC and attachment, SPEC §5), so the Pods use the publish-after-ptp chain: ptp creates the
Pod's interface from its node's host-local pool, and vpc-attach (`attachment: existing`)
publishes its addresses, each as a host prefix (SPEC §6).
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cni_plugin.core import naming
from cni_plugin.kube.kinds import PODS
from e2e.harness.agentproc import OwnAgents
from e2e.harness.faults import FaultProxy, Seen
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.collector import describe, wait_for_rib
from e2e.harness.galactic.fabric import Fabric, is_true, running_fabric
from e2e.harness.galactic.rib import EvpnRoute, sorted_routes
from e2e.harness.galactic.sites import (
    ROUTE_TIMEOUT_S,
    GalacticSite,
    host_prefix,
    start_site,
    wait_announced,
)
from e2e.harness.kernel import remove_vpc_objects, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import VIA_AGENT, Answer, host_local, random_wide_vpc, with_prev
from e2e.harness.publishing import advertisements_of, create_pod, vrf_instance
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

PATH = "agent" if VIA_AGENT else "in-process"
T = TypeVar("T")
# The steps `spread_deployment` measures while it sets the Pods up.
FIRST_ADD = "ADD first on node {} (creates instance, advertisement)"
SECOND_ADD = "ADD second on node {}"
STEADY = "ADD third on node 1 (steady state)"


# A Pod of the deployment ------------------------------------------------------------------------

@dataclass
class ChainPod:
    """A Pod of the deployment on a site: ptp's interface, vpc-attach publishing it."""

    name: str
    site: GalacticSite
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
        return {host_prefix(ip["address"]) for ip in self.ptp_result["ips"]}

    def publish(self, **extra: str) -> Answer:
        """vpc-attach's ADD of the Pod (prevResult: ptp's)."""
        return self.site.plugin.call("ADD", with_prev(self.conf, self.ptp_result),
                                     container_id=self.container_id, netns=self.netns,
                                     CNI_ARGS=self.args, **extra)

    def delete_chain(self) -> None:
        """The runtime's DEL of the chain, last plugin first."""
        plugin = self.site.plugin
        plugin.ok("DEL", with_prev(self.conf, self.result or self.ptp_result),
                  container_id=self.container_id, netns=self.netns, CNI_ARGS=self.args)
        plugin.ok("DEL", self.ptp, container_id=self.container_id, netns=self.netns,
                  CNI_ARGS=self.args, executable="ptp")
        self.live = False


def pool_of(site: GalacticSite) -> tuple[str, str]:
    """A site's host-local pool: an IPv6 /64 and an IPv4 /24 of its own."""
    return f"fd00:40:{site.index}::/64", f"172.40.{site.index}.0/24"


def start_chain_pod(stack: contextlib.ExitStack, kube: Kube, site: GalacticSite, label: str,
                    vpc: str, att: str, pools: Path) -> ChainPod:
    """A Pod object (deleted when ``stack`` closes), its netns, and ptp's interface in it (the
    chain's first plugin), from the site's pool under ``pools``."""
    name = f"d{att}-{secrets.token_hex(2)}-{label}"
    uid = create_pod(kube, name, site.name)
    stack.callback(functools.partial(kube.delete, PODS.path("default", name),
                                     grace_period_seconds=0))
    netns = stack.enter_context(temporary_netns(f"vpa-d{att}"))
    network = f"net-{vpc}"
    ptp = {"cniVersion": "1.1.0", "name": network, "type": "ptp", "ipMasq": False,
           "ipam": host_local(pools / f"pool-{site.index}", *pool_of(site))}
    conf = {"cniVersion": "1.1.0", "name": network, "type": "vpc-attach", "vpc": vpc,
            "vpcattachment": att, "attachment": "existing",
            "publish": {"bgp": True, "endpointSlice": True}}
    pod = ChainPod(name, site, netns, uid, ptp, conf, {})
    pod.ptp_result = site.plugin.ok("ADD", ptp, container_id=pod.container_id,
                                    netns=netns, CNI_ARGS=pod.args, executable="ptp")
    return pod


# What each verb asked the API server ------------------------------------------------------------

def request_label(seen: Seen) -> str:
    """`VERB resource status` of a request, LIST and WATCH told apart from GET, a dry run
    marked (`VERB resource (dry run) status`)."""
    verb = seen.method
    if verb == "GET" and seen.name is None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(seen.path).query)
        verb = "WATCH" if query.get("watch", ["false"])[0] in ("1", "true") else "LIST"
    dry = " (dry run)" if seen.dry_run else ""
    return f"{verb} {seen.resource}{dry} {seen.status if seen.status is not None else '-'}"


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

@dataclass
class Deployment:
    """The sites, the Pods, and what the collector and the API server must hold for them."""

    kube: Kube
    fabric: Fabric
    vpc: str
    att: str
    sites: list[GalacticSite]
    stack: contextlib.ExitStack
    pools: Path  # the sites' host-local pools
    pods: list[ChainPod] = field(default_factory=list)
    vrf_ids: dict[int, int] = field(default_factory=dict)
    router_refs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name
    requests: Requests = field(default_factory=Requests)

    def start_pod(self, site: GalacticSite, label: str) -> ChainPod:
        """A Pod on ``site`` with ptp's interface, not yet published."""
        return start_chain_pod(self.stack, self.kube, site, label, self.vpc, self.att,
                               self.pools)

    def add(self, site: GalacticSite, label: str, what: str) -> ChainPod:
        """A new Pod on ``site``, attached (requests measured as ``what``)."""
        pod = self.start_pod(site, label)
        answer = self.requests.measure(what, site.proxy, pod.publish)
        assert answer.status == 0, f"ADD {pod.name} failed: {answer.stdout} {answer.stderr}"
        pod.result = answer.body
        self.pods.append(pod)
        return pod

    def live(self, site: GalacticSite | None = None) -> list[ChainPod]:
        """The Pods still attached (on ``site``), oldest first."""
        return [p for p in self.pods if p.live and (site is None or p.site is site)]

    def remove(self, pod: ChainPod, what: str) -> None:
        """The runtime's DEL of a Pod (vpc-attach's requests measured as ``what``)."""
        self.requests.measure(what, pod.site.proxy, pod.delete_chain)

    def prefixes(self, site: GalacticSite) -> set[str]:
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
                routes += site.expected_routes(self.vpc, self.vrf_ids[site.index], prefixes)
        return sorted_routes(routes)

    def show(self, step: str, rib: list[EvpnRoute]) -> None:
        """The RIB, one readable line per route."""
        names = {s.address: f"node {s.index} {s.name}" for s in self.sites}
        print(f"collector RIB step {step}: {len(rib)} routes")
        for route in rib:
            print(f"collector RIB step {step}: {describe(route, names)}")

    def settle(self, step: str, expected: list[EvpnRoute] | None = None) -> list[EvpnRoute]:
        """Wait until the collector holds exactly what it must, print it and return it."""
        rib = wait_for_rib(self.fabric, step, self.expected() if expected is None else expected)
        self.show(step, rib)
        return rib

    def advertisements(self) -> dict[str, dict[str, Any]]:
        """The attachment's advertisements, by name."""
        return advertisements_of(self.kube, self.vpc, self.att)

    def check_objects(self) -> None:
        """One BGPAdvertisement per node with live Pods (none other of the attachment), each
        naming that node's router since its creation, announcing that node's Pods, owned by
        that node's Node; each live node's VRF instance owned by it too."""
        found = self.advertisements()
        wanted = {naming.advertisement_name(self.vpc, self.att, s.name): s
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
            assert owners(adv) == [site.node_owner()]
            instance = vrf_instance(self.kube, naming.vrf_instance_name(self.vpc, site.name))
            assert instance is not None and owners(instance) == [site.node_owner()]

    def settled_advertisements(self) -> dict[str, dict[str, Any]]:
        """The attachment's advertisements once every router has reported on them."""
        found: list[dict[str, dict[str, Any]]] = [{}]

        def caught_up() -> bool:
            found[0] = self.advertisements()
            return all(router_caught_up(adv) for adv in found[0].values())

        wait_until("every router's status on its advertisement", caught_up, ROUTE_TIMEOUT_S,
                   alive=self.fabric.alive, detail=lambda: str(found[0]))
        return found[0]


def owners(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """An object's ownerReferences, reduced to what names the owner."""
    return [{key: ref.get(key) for key in ("apiVersion", "kind", "name", "uid")}
            for ref in obj["metadata"].get("ownerReferences") or []]


def router_caught_up(adv: dict[str, Any] | None) -> bool:
    """Whether its router's status reports this generation of the advertisement advertised
    with all its prefixes (the router writes no status after that until something changes)."""
    status = (adv or {}).get("status") or {}
    return adv is not None \
        and status.get("observedGeneration") == adv["metadata"]["generation"] \
        and is_true(lambda: adv, "Advertised")() \
        and status.get("advertisedPrefixes") == len(adv["spec"]["prefixes"])


def versions(advertisements: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each advertisement's resourceVersion, by name."""
    return {name: adv["metadata"]["resourceVersion"] for name, adv in advertisements.items()}


@contextlib.contextmanager
def spread_deployment(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
                      galactic: GalacticBuild, directory: Path,
                      att: str) -> Iterator[Deployment]:
    """The collector, three sites (each behind its proxy, its Node registered) and six Pods of
    one VPC attachment (three on node 1, one on node 2, two on node 3), announced, each ADD's
    requests measured (`FIRST_ADD`, `SECOND_ADD`, `STEADY`). Before each measured ADD the
    routers' status writes are done (none costs it a conflict). What the tests left attached
    is deleted afterwards; a DEL that fails then fails the teardown."""
    vpc = random_wide_vpc()  # its ADDs ask the CRD first: the budgets count that request
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, [vpc])
        stack.enter_context(bound(kube, vpc))
        fabric = stack.enter_context(running_fabric(galactic, directory, nodes=3))
        sites = [start_site(stack, fabric, index, kube, cluster, cni_bin, own_agents, directory,
                            register_node=True, behind_proxy=True) for index in (1, 2, 3)]
        first, second, third = sites
        shared = Deployment(kube, fabric, vpc, att, sites, stack, directory)
        shared.add(first, "a1", FIRST_ADD.format(1))
        shared.add(second, "b1", FIRST_ADD.format(2))
        shared.add(third, "c1", FIRST_ADD.format(3))
        shared.settled_advertisements()
        shared.add(first, "a2", SECOND_ADD.format(1))
        shared.settled_advertisements()
        shared.add(third, "c2", SECOND_ADD.format(3))
        shared.settled_advertisements()
        shared.add(first, "a3", STEADY)
        for site in sites:
            shared.vrf_ids[site.index] = wait_announced(kube, fabric, site, vpc, att,
                                                        shared.prefixes(site))
        yield shared
        shared.requests.report()
        delete_every(shared.live())  # what the tests left (all of it when one failed early)


def delete_every(pods: list[ChainPod]) -> None:
    """The runtime's DEL of each Pod's chain; every DEL is tried, and any that failed fail
    the caller (a teardown's DEL proves as much as a test's)."""
    failed = []
    for pod in pods:
        try:
            pod.delete_chain()
        except AssertionError as exc:
            failed.append(f"{pod.name} on {pod.site.label()}: {exc}")
    assert not failed, "DEL of what the tests left failed:\n" + "\n".join(failed)
