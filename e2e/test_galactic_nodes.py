"""One attachment's Pods spread over three nodes, each node running galactic-router (issue 21
item 6). A gobgpd collector peered with every router holds each Pod's prefixes exactly once,
from the router of the node the Pod runs on, with that node's RD, SID, route target and next
hop, through a scale-down, a node losing its last Pod, a refused write's rollback, a node whose
API writes fail, and the deletion of a node's Node object (the garbage collector removes that
node's BGP objects through their ownerReference and its router withdraws them). galactic's
ingress-sidecar code routes each Pod's IPv6 slice to the SID its node announces. Each node
reaches the API server through a fault proxy of its own, which also counts each verb's requests.
The tests share one deployment (`e2e.harness.galactic.deployment`: collector, routers, proxies,
six Pods, publish-after-ptp) and each proves one of those behaviours on it; they run in file
order, each starting by arranging the Pods it needs from what the earlier ones left.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ENDPOINT_SLICES
from e2e.harness.agentproc import OwnAgents
from e2e.harness.faults import Fault, Rule
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.collector import every_route, rib_sampled
from e2e.harness.galactic.deployment import (
    FIRST_ADD,
    PATH,
    SECOND_ADD,
    STEADY,
    Deployment,
    spread_deployment,
    versions,
)
from e2e.harness.galactic.sites import assert_ipv6_slice_accepted, judge_slices
from e2e.harness.kernel import links_in
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES
from e2e.harness.plugin import VIA_AGENT
from e2e.harness.publishing import advertisement, deny_writes, vrf_instance, wait_denied
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
ATT = "40"
GC_TIMEOUT_S = 120.0  # the garbage collector notices a deleted Node's dependents
FAULT_TIMEOUT_S = 6.0  # the node's timeoutSeconds while every advertisement write fails
WRITES = ("POST", "PUT", "PATCH", "DELETE")
AGAIN = "ADD on node 2 again (instance kept, advertisement created)"
SCALE_DOWN = "DEL on node 3, another Pod left (advertisement updated)"
LAST_POD = "DEL of node 2's last Pod (advertisement deleted)"
REFUSED_SLICE = "ADD on node 1 refused its slice (rolled back)"


@pytest.fixture(scope="module")
def deployment(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
               galactic: GalacticBuild,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Set up once for the module (a minute under load)."""
    with spread_deployment(kube, cluster, cni_bin, own_agents, galactic,
                           tmp_path_factory.mktemp("galactic-nodes"), ATT) as shared:
        yield shared


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
    advertisement twice: 10 in-process, 5 through the agent), plus, in-process, the dry run of
    the instance its wide route target costs (the agent asked it on its first ADD). The first
    ADD on a node reads its Node once for both objects it creates, after that dry run. In-process,
    an ADD creating the advertisement reads the shared form too; the agent lists the namespace's
    advertisements once instead and reads no shared form that holds none of its node's
    containers."""
    calls = deployment.requests.calls
    assert calls[STEADY] == STEADY_ADD, calls[STEADY]
    if not VIA_AGENT:  # through the agent, its second ADD may still be warming its caches
        assert calls[SECOND_ADD.format(1)] == calls[SECOND_ADD.format(3)] == STEADY_ADD
    for index in (1, 2, 3):
        first = calls[FIRST_ADD.format(index)]
        assert first.count("GET nodes 200") == 1, first
        assert advertisement_requests(first) == FIRST_ADVERTISEMENT_READS, first
        assert [c for c in first if c.startswith("POST bgp")] == \
            [ASKED_FIRST, "POST bgpvrfinstances 201", "POST bgpadvertisements 201"], first


def test_scaling_a_node_down_withdraws_only_the_deleted_pods_prefixes(
        deployment: Deployment) -> None:
    """DEL with another Pod left on the node reads and updates this node's advertisement only."""
    third = deployment.sites[2]
    while len(deployment.live(third)) < 2:
        deployment.add(third, f"c{secrets.token_hex(1)}", "ADD arranging node 3's two Pods")
    deployment.settled_advertisements()  # no router status write costs the DEL a conflict
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
    deployment.settled_advertisements()
    deployment.remove(deployment.live(second)[0], LAST_POD)
    name = naming.advertisement_name(deployment.vpc, ATT, second.name)
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
                        naming.vrf_instance_name(deployment.vpc, second.name)) is not None
    deployment.settled_advertisements()
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
    kube, name = deployment.kube, naming.advertisement_name(deployment.vpc, ATT, site.name)
    if not deployment.live(site):
        deployment.add(site, f"a{secrets.token_hex(1)}", "ADD arranging node 1's Pod")
    before_rib = deployment.settle("before the refused ADD on node 1")
    before = advertisement(kube, name)
    assert before is not None
    pod = deployment.start_pod(site, "ax")
    remove = deny_writes(kube, f"deny-{pod.name}", "endpointslices", "discovery.k8s.io",
                         ["CREATE"], pod.name)
    try:
        wait_denied(lambda: kube.create(ENDPOINT_SLICES.path("default"), {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{pod.name}-probe"}, "addressType": "IPv6",
            "endpoints": []}, dry_run=True))
        with rib_sampled(deployment.fabric) as samples:
            answer = deployment.requests.measure(REFUSED_SLICE, site.proxy, pod.publish)
            assert answer.code == 104 and "EndpointSlice" in answer.body["msg"], answer.stdout
            wait_until(f"{name}'s annotations as before the ADD",
                       lambda: _annotations(advertisement(kube, name))
                       == _annotations(before))
            after = advertisement(kube, name)
            assert after is not None and after["spec"] == before["spec"]
            deployment.settle("after the rolled-back ADD on node 1", before_rib)
    finally:
        remove()
    transient = sorted(r.prefix for r in every_route(samples) - set(before_rib))
    print(f"rolled-back ADD: prefixes announced meanwhile: {transient or 'none'}")
    assert set(transient) <= pod.prefixes
    assert kube.get(ENDPOINT_SLICES.path("default", slice_name(pod.name, deployment.vpc, ATT,
                                                               "IPv6"))) is None
    wrote = deployment.requests.calls[REFUSED_SLICE]
    assert wrote.count("PUT bgpadvertisements 200") == 2, wrote  # published, then withdrawn
    deployment.check_objects()
    deployment.requests.measure("DEL after node 1's refused ADD (nothing of it published)",
                                site.proxy, pod.delete_chain)
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
    before = deployment.settled_advertisements()
    assert len(before) == len([s for s in deployment.sites if deployment.prefixes(s)])
    pod = deployment.start_pod(site, "bx")
    rules = [Rule(Fault.RESPOND, method=method, resource="bgpadvertisements", times=0,
                  status=503, retry_after=1.0) for method in WRITES]
    with site.proxy.rules(*rules):
        answer = deployment.requests.measure(
            "ADD on node 2 with every advertisement write failing", site.proxy,
            lambda: pod.publish(VPC_ATTACH_TIMEOUT_SECONDS=str(FAULT_TIMEOUT_S)))
    adv_name = naming.advertisement_name(deployment.vpc, ATT, site.name)
    assert answer.code == 11 and f"bgpadvertisements/{adv_name}" in answer.body["msg"], \
        answer.stdout
    assert sum(rule.fired for rule in rules) >= 1
    after = deployment.advertisements()
    assert versions(after) == versions(before), f"before {before}\nafter {after}"
    rib = deployment.fabric.rib()
    deployment.show("after node 2's failed ADD", rib)
    assert rib == before_rib
    deployment.check_objects()
    deployment.requests.measure("DEL after node 2's failed ADD (nothing of it published)",
                                site.proxy, pod.delete_chain)
    assert versions(deployment.advertisements()) == versions(before)


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
    adv_name = naming.advertisement_name(vpc, ATT, site.name)
    vrf_name = naming.vrf_instance_name(vpc, site.name)
    assert kube.delete(f"{NODES}/{site.name}")
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
    assert deployment.advertisements() == {}
    for site in deployment.sites:
        if not site.deleted:
            name = naming.vrf_instance_name(deployment.vpc, site.name)
            assert vrf_instance(deployment.kube, name) is not None, name


def advertisement_requests(calls: list[str]) -> list[str]:
    """The requests about BGPAdvertisements, in order."""
    return [call for call in calls if " bgpadvertisements " in call]


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict((obj or {}).get("metadata", {}).get("annotations") or {})


# The requests each verb may ask ------------------------------------------------------------------

# The deployment's VPC has a wide route target (a side of 10 digits): before anything is made,
# each ADD asks the CRD with a dry run of the instance (201 where it does not exist yet, 409
# where it does, after validation); through the agent, only its first ADD asks.
ASKED_FIRST = "POST bgpvrfinstances (dry run) 201"
# The requests of an ADD of the attachment on a node whose VRF instance and advertisement exist,
# as many as before per-node advertisements (the shared form is read only by the ADD creating
# this node's), and in-process the dry run. The agent answers VPCBindings, namespaces, the
# router, the router's instances and the Pod from its watch caches; the instance itself is read
# fresh before it is written. The advertisement is read once: its PUT is conditional on that
# read's resourceVersion.
STEADY_ADD = {
    "in-process": ["LIST vpcbindings 200", "GET namespaces 200", "LIST bgprouters 200",
                   "POST bgpvrfinstances (dry run) 409",
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
