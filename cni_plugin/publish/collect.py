"""GC's publishing: this node's stale EndpointSlices and advertised containers, the VPC's unused
BGPVRFInstance, and the Node's ownerReference on this node's BGP objects."""

from __future__ import annotations

from cni_plugin.core.request import Invocation
from cni_plugin.kube.session import VerbCluster
from cni_plugin.publish.boundary import api_boundary, connected
from cni_plugin.publish.withdraw import router_and_vrf_id


def collect_stale_slices(inv: Invocation, cluster: VerbCluster,
                         valid: set[tuple[str, str]]) -> None:
    """GC: delete this node's EndpointSlices of attachments not in valid."""
    if not inv.conf.publish.endpoint_slice:
        return
    from cni_plugin.publish import endpointslice
    with connected(inv, cluster) as ctx, api_boundary("collect stale EndpointSlices"):
        if ctx is not None:
            endpointslice.collect_slices(ctx, valid, inv.deadline)


def collect_stale_advertisements(inv: Invocation, cluster: VerbCluster,
                                 valid: set[tuple[str, str]]) -> None:
    """GC: drop this node's containers not in valid from its advertisement of the attachment,
    and move this node's valid ones out of the shared advertisement earlier versions wrote."""
    if not inv.conf.publish.bgp:
        return
    from cni_plugin.core.naming import annotation_cid
    from cni_plugin.publish.bgp.advertisement import convert_shared, prune_own
    kept = {annotation_cid(container_id) for container_id, _ifname in valid}
    with connected(inv, cluster) as ctx, api_boundary("collect stale advertisements"):
        if ctx is not None:
            convert_shared(ctx, lambda: router_and_vrf_id(ctx), inv.deadline,
                           keeps=kept.__contains__)
            prune_own(ctx, inv.deadline, keeps=kept.__contains__)


def give_to_node(inv: Invocation, cluster: VerbCluster) -> None:
    """GC: this node's BGPVRFInstance of the VPC and advertisement of the attachment get the
    Node's ownerReference when vpc-attach created them without one (earlier versions wrote
    none; a Node registered after the object was created), so they go with the Node."""
    if not inv.conf.publish.bgp:
        return
    from cni_plugin.publish.resources import ADVERTISEMENTS, VRF_INSTANCES
    with connected(inv, cluster) as ctx, api_boundary("give this node's BGP objects to its Node"):
        if ctx is not None:
            ctx.give_to_node(VRF_INSTANCES, ctx.instance_name, inv.deadline)
            ctx.give_to_node(ADVERTISEMENTS, ctx.advertisement_name, inv.deadline)


def collect_unused_instance(inv: Invocation, cluster: VerbCluster, valid: set[tuple[str, str]],
                            attached: set[tuple[str, str]]) -> bool:
    """GC: delete the VPC's BGPVRFInstance on this node if vpc-attach created it and no valid
    attachment, attachment on this node (`attached`: owners of the VPC's links) or
    advertisement uses it any more; whether the node has no such instance now (False when
    BGP is not published)."""
    if not inv.conf.publish.bgp:
        return False
    from cni_plugin.publish.bgp.instance import collect_instance, instance_vrf_id
    from cni_plugin.publish.bgp.router import find_router
    with connected(inv, cluster) as ctx, api_boundary("collect the VPC's unused BGPVRFInstance"):
        if ctx is None:
            return False
        router = find_router(ctx, inv.deadline)
        return collect_instance(ctx, router, valid, attached, inv.deadline) or \
            instance_vrf_id(ctx, inv.deadline) is None
