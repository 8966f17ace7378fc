"""Publishing an attachment to Kubernetes: BGP custom resources, then the Pod's EndpointSlice.

The verbs use only what is defined here. `Publisher.prepare` runs before any kernel change:
it checks the settings (code 7), reaches the API (code 11 when unreachable) and finds this
node's BGPRouter, so an ADD that cannot publish changes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cni_plugin.kube.client import ApiError
from netconf.errors import INVALID_CONFIG, STATUS_NOT_AVAILABLE, CniError
from netconf.result import Result

if TYPE_CHECKING:
    from cni_plugin.attachment import Addressing
    from cni_plugin.core.request import Invocation
    from cni_plugin.core.rollback import Rollback
    from cni_plugin.publish.context import PublishContext, Router


def check_settings(inv: Invocation) -> None:
    """Code 7 when publishing is on but the node name or kubeconfig is unusable."""
    if not inv.host.node_name:
        raise CniError(INVALID_CONFIG, "publishing needs a node name",
                       "set nodeName in the stanza, VPC_ATTACH_NODE_NAME, or the host file")
    kubeconfig = inv.host.kubeconfig
    if not kubeconfig:
        raise CniError(INVALID_CONFIG, "publishing needs a kubeconfig",
                       "set kubeconfig in the stanza, VPC_ATTACH_KUBECONFIG, or the host file; "
                       "or turn publishing off with \"publish\": {\"bgp\": false, "
                       "\"endpointSlice\": false}")
    if not os.access(kubeconfig, os.R_OK):
        raise CniError(INVALID_CONFIG, f"kubeconfig {kubeconfig!r} is not readable")


@dataclass
class Publisher:
    """An open connection to the cluster and this node's router, ready to publish."""

    ctx: PublishContext
    router: Router | None

    @classmethod
    def prepare(cls, inv: Invocation) -> Publisher | None:
        """None when publishing is off; otherwise connected and with the router found."""
        if not inv.conf.publish.any:
            return None
        check_settings(inv)
        from cni_plugin.publish.bgp import find_router
        from cni_plugin.publish.context import PublishContext
        ctx = PublishContext.open(inv)
        router = find_router(ctx, inv.deadline) if inv.conf.publish.bgp else None
        return cls(ctx, router)

    def publish(self, plan: Addressing, rollback: Rollback) -> None:
        """BGP state first, then the EndpointSlices; every creation recorded for rollback."""
        from cni_plugin.core import naming
        from cni_plugin.publish import bgp, endpointslice
        inv = self.ctx.inv
        deadline = inv.deadline
        sid = None
        try:
            if self.router is not None:
                vrf_id = bgp.ensure_vrf_instance(self.ctx, self.router, rollback, deadline)
                bgp.ensure_advertisement(self.ctx, self.router, vrf_id, plan, rollback, deadline)
                if self.router.srv6_locator and self.router.node_id:
                    sid = naming.srv6_sid(self.router.srv6_locator, self.router.node_id, vrf_id)
            if inv.conf.publish.endpoint_slice:
                endpointslice.ensure_slices(self.ctx, plan, sid, rollback, deadline)
        finally:
            self.ctx.close()


def _open(inv: Invocation) -> PublishContext | None:
    """A context for DEL/CHECK/GC, or None when publishing is off or cannot be configured."""
    if not inv.conf.publish.any:
        return None
    check_settings(inv)
    from cni_plugin.publish.context import PublishContext
    return PublishContext.open(inv)


def unpublish(inv: Invocation) -> None:
    """Withdraw this container's slices and advertisement annotations (DEL)."""
    try:
        ctx = _open(inv)
    except CniError:
        return  # never configured, so nothing can have been published
    if ctx is None:
        return
    from cni_plugin.publish import bgp, endpointslice
    from cni_plugin.publish.context import api_failure
    try:
        if inv.conf.publish.endpoint_slice:
            endpointslice.delete_slices(ctx, inv.deadline)
        if inv.conf.publish.bgp:
            try:
                bgp.withdraw_advertisement(ctx, inv.deadline, may_delete=True)
            except ApiError as exc:
                raise api_failure(exc, "withdraw the BGPAdvertisement") from None
    finally:
        ctx.close()


def published_differences(inv: Invocation, prev: Result) -> list[str]:
    """What CHECK finds changed in the published objects."""
    ctx = _open(inv)
    if ctx is None:
        return []
    from cni_plugin.attachment import Addressing
    from cni_plugin.publish import bgp, endpointslice
    plan = Addressing.from_result(prev)
    try:
        diffs: list[str] = []
        if inv.conf.publish.bgp:
            diffs += bgp.advertisement_differences(ctx, plan, inv.deadline)
        if inv.conf.publish.endpoint_slice:
            diffs += endpointslice.slice_differences(ctx, plan, inv.deadline)
        return diffs
    finally:
        ctx.close()


def publishing_status(inv: Invocation) -> None:
    """Code 50 unless the kubeconfig works, the API answers and RBAC allows what ADD does."""
    if not inv.conf.publish.any:
        return
    try:
        ctx = _open(inv)
        assert ctx is not None
        from cni_plugin.publish.status import check_access
        try:
            check_access(ctx)
            if inv.conf.publish.bgp:  # ADD would fail with code 7 without exactly one
                from cni_plugin.publish.bgp import find_router
                find_router(ctx, inv.deadline)
        finally:
            ctx.close()
    except CniError as exc:
        if exc.code == STATUS_NOT_AVAILABLE:
            raise
        raise CniError(STATUS_NOT_AVAILABLE, exc.msg, exc.details) from None


def collect_garbage(inv: Invocation, valid: set[tuple[str, str]]) -> None:
    """GC: delete this node's EndpointSlices of attachments not in valid."""
    if not inv.conf.publish.endpoint_slice:
        return
    ctx = _open(inv)
    if ctx is None:
        return
    from cni_plugin.publish import endpointslice
    from cni_plugin.publish.context import api_failure
    try:
        endpointslice.collect_slices(ctx, valid, inv.deadline)
    except ApiError as exc:
        raise api_failure(exc, "collect stale EndpointSlices") from None
    finally:
        ctx.close()
