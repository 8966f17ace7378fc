"""galactic-router, built from galactic's own source, reads what vpc-attach publishes and
announces it over BGP: a gobgpd collector peered with every node's router receives exactly the
Pod's prefixes, with the VRF's RD, the VPC's route target and the published SRv6 SID, from the
router of the node the Pod runs on only, and loses them after DEL. galactic's own ingress-sidecar
code judges the EndpointSlices vpc-attach wrote (issue 21, items 1 and 4). Pods on several
nodes, each announced by its own node's router only: e2e/test_galactic_nodes.py. The nodes are
galactic sites (`e2e.harness.galactic.sites`)."""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.resources import ROUTERS
from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import condition, running_fabric
from e2e.harness.galactic.sites import (
    LOCATOR,
    ROUTE_TIMEOUT_S,
    assert_ipv6_slice_accepted,
    attach_pod,
    judge_slices,
    start_site,
    wait_announced,
)
from e2e.harness.galactic.verdict import SidecarRoute, Verdict
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin
from e2e.harness.publishing import BGP_NS, advertisement, endpoint_slice, make_node, vrf_instance
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]


def test_one_node_router_announces_the_pod_with_rd_rt_sid_and_withdraws_it_after_del(
        kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents, galactic: GalacticBuild,
        netns: str, vpc: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        fabric = stack.enter_context(running_fabric(galactic, tmp_path, nodes=1))
        site = start_site(stack, fabric, 1, kube, cluster, cni_bin, own_agents, tmp_path)
        router = kube.get(ROUTERS.path(BGP_NS, site.node.router))
        assert (condition(router, "Ready") or {}).get("reason") == "RuntimeReady"

        pod = attach_pod(kube, site.node, "gal-1", vpc, "10", netns, tmp_path / "ipam",
                         "fd00:21:1::/64", "172.21.1.0/24")
        prefixes = {"172.21.1.2/32", "fd00:21:1::/64"}
        vrf_id = wait_announced(kube, fabric, site, vpc, "10", prefixes)
        instance = vrf_instance(kube, naming.vrf_instance_name(vpc, site.name))
        adv = advertisement(kube, naming.advertisement_name(vpc, "10", site.name))
        assert (condition(instance, "Ready") or {}).get("reason") == "Accepted"
        assert (condition(adv, "Advertised") or {}).get("reason") == "Advertised"
        assert adv is not None and adv["status"]["advertisedPrefixes"] == len(prefixes)

        rib = fabric.rib()
        for route in rib:
            print(f"collector RIB: {route}")
        assert rib == site.expected_routes(vpc, vrf_id, prefixes)
        v6_slice = endpoint_slice(kube, pod.slices[0])
        assert v6_slice is not None
        assert {r.sid for r in rib} == {
            v6_slice["metadata"]["annotations"]["galactic.datum.net/srv6-sid"]}

        verdicts = judge_slices(kube, galactic, pod.slices)
        assert_ipv6_slice_accepted(kube, verdicts, pod.slices[0], vpc)

        pod.detach()
        wait_until("the collector to lose the Pod's routes after DEL", lambda: not fabric.rib(),
                   ROUTE_TIMEOUT_S, alive=fabric.alive)
        assert site.address in fabric.established(), "withdrawn, not a dropped session"


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
        pod.detach()
