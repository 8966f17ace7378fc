"""DEL's publishing: this container's slices and advertisement annotations withdrawn, a shared
advertisement earlier versions wrote converted on the way."""

from __future__ import annotations

from cni_plugin.core.request import Invocation
from cni_plugin.kube.session import VerbCluster
from cni_plugin.publish.boundary import api_boundary, check_settings
from cni_plugin.publish.context import PublishContext, Router
from netconf.errors import CniError


def unpublish(inv: Invocation, cluster: VerbCluster) -> None:
    """Withdraw this container's slices and advertisement annotations (DEL), converting a
    shared advertisement earlier versions wrote on the way."""
    if not inv.conf.publish.any:
        return
    try:
        node = check_settings(inv)
    except CniError:
        return  # never configured, so nothing can have been published
    from cni_plugin.publish import endpointslice
    from cni_plugin.publish.bgp.advertisement import convert_shared, withdraw_advertisement
    ctx = PublishContext.open(inv, cluster.session(), node)
    with api_boundary("withdraw the attachment"):
        if inv.conf.publish.endpoint_slice:
            endpointslice.delete_slices(ctx, inv.deadline)
        if inv.conf.publish.bgp and \
                not withdraw_advertisement(ctx, inv.deadline, may_delete=True):
            # Published by an earlier version into the attachment's shared advertisement?
            # This node's other containers move to its own first, then this one goes.
            convert_shared(ctx, lambda: router_and_vrf_id(ctx), inv.deadline,
                           keeps=lambda cid: cid != ctx.cid)


def router_and_vrf_id(ctx: PublishContext) -> tuple[Router | None, int | None]:
    """This node's router and the VPC's VRF ID on it, where both exist (DEL's conversion)."""
    from cni_plugin.publish.bgp.instance import instance_vrf_id
    from cni_plugin.publish.bgp.router import find_router
    try:
        router = find_router(ctx, ctx.inv.deadline)
    except CniError:
        return None, None
    return router, instance_vrf_id(ctx, ctx.inv.deadline)
