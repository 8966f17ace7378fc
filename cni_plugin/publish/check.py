"""CHECK's publishing: what changed in the published objects, and the SID the VPC is published
with on this node."""

from __future__ import annotations

from cni_plugin.core.addressing import Addressing
from cni_plugin.core.request import Invocation
from cni_plugin.kube.session import VerbCluster
from cni_plugin.publish.boundary import api_boundary, connected
from cni_plugin.publish.publisher import SettledInstance


def published_differences(inv: Invocation, cluster: VerbCluster, addressing: Addressing,
                          announced: bool = True) -> list[str]:
    """What CHECK finds changed in the published objects (addressing: prevResult's; not
    announced: the advertisement lacks the container on purpose)."""
    from cni_plugin.publish import endpointslice
    from cni_plugin.publish.bgp.check import advertisement_differences
    with connected(inv, cluster) as ctx, api_boundary("check the published objects"):
        if ctx is None:
            return []
        diffs: list[str] = []
        if inv.conf.publish.bgp and announced:
            diffs += advertisement_differences(ctx, addressing, inv.deadline)
        if inv.conf.publish.endpoint_slice:
            diffs += endpointslice.slice_differences(ctx, addressing, inv.deadline)
        return diffs


def published_sid(inv: Invocation, cluster: VerbCluster) -> SettledInstance | None:
    """The VPC's instance on this node with the SID it published (CHECK): None without a
    router that has a locator and node ID, or before the VPC's BGPVRFInstance exists."""
    if not inv.conf.publish.bgp:
        return None
    from cni_plugin.publish.bgp.instance import instance_vrf_id
    from cni_plugin.publish.bgp.router import find_router
    with connected(inv, cluster) as ctx, api_boundary("read the VPC's SID"):
        if ctx is None:
            return None
        router = find_router(ctx, inv.deadline)
        if not (router.srv6_locator and router.node_id):
            return None
        vrf_id = instance_vrf_id(ctx, inv.deadline)
        if vrf_id is None:
            return None
        return SettledInstance(vrf_id, router.srv6_locator, router.node_id)
