"""Publishing an attachment to Kubernetes: BGP custom resources, then the Pod's EndpointSlice.

The verbs use only what is defined here, each front function on the verb's one session (its
`VerbCluster`, opened by the verb), and this is where an API refusal nobody handled becomes a
CNI error (`api_failure`). `Publisher.api_find_router` runs before any kernel change: it checks
the settings (code 7), reaches the API (code 11 when unreachable) and finds this node's
BGPRouter, so an ADD that cannot publish changes nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cni_plugin.core.addressing import Addressing
from cni_plugin.core.request import Invocation
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import ApiError, api_failure
from cni_plugin.kube.session import VerbCluster
from cni_plugin.publish.context import PublishContext, Router
from netconf.errors import INVALID_CONFIG, STATUS_NOT_AVAILABLE, TRY_AGAIN_LATER, CniError

if TYPE_CHECKING:
    from cni_plugin.publish.bgp.advertisement import Found


@contextmanager
def api_boundary(doing: str) -> Iterator[None]:
    """Turn an ApiError escaping the block into its CNI error (the one place this happens)."""
    try:
        yield
    except ApiError as exc:
        raise api_failure(exc, doing) from None


def _check_settings(inv: Invocation) -> str:
    """The node name; code 7 when publishing is on but it or the kubeconfig is unusable."""
    node = inv.host.node_name
    if not node:
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
    return node


@contextmanager
def connected(inv: Invocation, cluster: VerbCluster) -> Iterator[PublishContext | None]:
    """A context on the verb's session (its client borrowed now), or None when publishing is
    off. The session stays the verb's: it outlives the block (a rollback after it uses it)."""
    if not inv.conf.publish.any:
        yield None
        return
    node = _check_settings(inv)
    yield PublishContext.open(inv, cluster.session(), node)


class SettlingInstance:
    """The VPC's BGPVRFInstance being settled (reused or created, recorded for rollback) and
    this node's advertisement of the attachment read, on a thread of its own while IPAM and
    the kernel work run: neither needs the addresses."""

    def __init__(self, ctx: PublishContext, router: Router, rollback: Rollback) -> None:
        self._ctx = ctx
        self._done: tuple[int, Found] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(router, rollback),
                                        name="vpc-attach settling instance", daemon=True)
        self._thread.start()

    def _run(self, router: Router, rollback: Rollback) -> None:
        from cni_plugin.publish.bgp import advertisement, instance
        ctx, deadline = self._ctx, self._ctx.inv.deadline
        try:
            vrf_id = instance.ensure_vrf_instance(ctx, router, rollback, deadline)
            self._done = (vrf_id, advertisement.read_found(ctx, deadline))
        except BaseException as exc:  # handed to the verb's thread by result()
            self._error = exc

    def wait(self) -> None:
        """Until the thread is done (each of its requests and locks ends by the deadline)."""
        self._thread.join(self._ctx.inv.final_deadline.remaining(floor=0))

    def result(self) -> tuple[int, Found]:
        """(VRF ID, the advertisements as read); what the thread raised, if it did."""
        self.wait()
        if self._error is not None:
            raise self._error
        if self._done is None:
            raise CniError(TRY_AGAIN_LATER, "the VPC's BGPVRFInstance was not settled in time")
        return self._done


@dataclass(frozen=True)
class SettledInstance:
    """The VPC's BGPVRFInstance on this node as ADD settled it: its VRF ID and, when the
    node's router has a locator and node ID, the SID the VPC is published with."""

    vrf_id: int
    locator: str | None = None
    node_id: int | None = None

    @property
    def sid(self) -> str | None:
        """The VPC's End.DT46 SID on this node (SPEC §6), if the router has SIDs."""
        if not (self.locator and self.node_id):
            return None
        from cni_plugin.core import naming
        return naming.srv6_sid(self.locator, self.node_id, self.vrf_id)


class Publication:
    """What `Publisher.api_settle_instance_thread` yields: the only way to publish an attachment, so
    publishing runs while the instance is held in use and after it was settled."""

    def __init__(self, ctx: PublishContext | None, router: Router | None,
                 settling: SettlingInstance | None, rollback: Rollback) -> None:
        self._ctx = ctx
        self._router = router
        self._settling = settling
        self._rollback = rollback

    def settled(self) -> SettledInstance | None:
        """Waits for the settling thread: the VPC's instance, None when BGP is not published
        (what the thread raised, if it did)."""
        router, settling = self._router, self._settling
        if router is None or settling is None:
            return None
        with api_boundary("settle the VPC's BGPVRFInstance"):
            vrf_id, _read = settling.result()
        return SettledInstance(vrf_id, router.srv6_locator, router.node_id)

    def api_publish(self, addressing: Addressing, announce: bool = True) -> Unannounced | None:
        """BGP state first, then the EndpointSlices; every creation recorded for rollback.
        Not announced (a live migration's target, until KubeVirt marks it ready): the slices
        are written not ready, and what the advertisement would get is held back and
        returned, for the caller to record (nothing when publishing is off)."""
        ctx, router, rollback = self._ctx, self._router, self._rollback
        if ctx is None:
            return None
        from cni_plugin.publish import endpointslice
        from cni_plugin.publish.bgp import advertisement
        deadline = ctx.inv.deadline
        settled = self.settled()
        ours: dict[str, str] = {}
        spec: dict[str, object] = {}
        with api_boundary("publish the attachment"):
            if router is not None and self._settling is not None and settled is not None:
                _vrf_id, read = self._settling.result()
                if announce:
                    advertisement.ensure_advertisement(ctx, router, settled.vrf_id, addressing,
                                                       rollback, deadline, read)
                else:
                    ours = advertisement.container_annotations(ctx, addressing)
                    spec = advertisement.advertisement_spec(ctx, router, settled.vrf_id)
            slices: list[str] = []
            if ctx.inv.conf.publish.endpoint_slice:
                slices = endpointslice.ensure_slices(ctx, addressing,
                                                     settled.sid if settled else None,
                                                     rollback, deadline, ready=announce)
            if announce:
                return None
            return Unannounced(
                node=ctx.node, namespace=ctx.namespace, advertisement=ctx.advertisement_name,
                annotations=ours, spec=spec,
                owner_references=ctx.node_owner(deadline) if ours else [], slices=slices,
                pod_uid=_pod_uid(ctx))


@dataclass(frozen=True)
class Unannounced:
    """What an attachment published but not announced holds back: this container's
    annotations as ADD would have merged them into this node's advertisement (and its spec and
    owner, to create it), and its EndpointSlices, written not ready."""

    node: str
    namespace: str  # of the BGP objects
    advertisement: str  # this node's advertisement of the attachment
    annotations: dict[str, str]
    spec: dict[str, object]
    owner_references: list[dict[str, Any]]
    slices: list[str]
    pod_uid: str


def _pod_uid(ctx: PublishContext) -> str:
    """The Pod's uid: from CNI_ARGS, else the Pod as the verb read it."""
    pod = ctx.inv.pod
    if pod.uid:
        return pod.uid
    from cni_plugin.publish.endpointslice import pod_object
    found = pod_object(ctx, ctx.inv.deadline)
    return str(((found or {}).get("metadata") or {}).get("uid") or "")


class Publisher:
    """ADD's publishing: this node's router found up front; a no-op when publishing is off."""

    def __init__(self, ctx: PublishContext | None, router: Router | None) -> None:
        self.ctx = ctx
        self.router = router

    @property
    def publishes_instance(self) -> bool:
        """Whether ADD publishes the VPC's BGPVRFInstance on this node (BGP on, router found)."""
        return self.router is not None

    @property
    def announces_sids(self) -> bool:
        """Whether this node's router has a locator and node ID: the VPC gets a SID here."""
        return self.router is not None and bool(self.router.srv6_locator and self.router.node_id)

    @classmethod
    def api_find_router(cls, inv: Invocation, cluster: VerbCluster) -> Publisher:
        """On the verb's session (held by the verb until its rollback, if any, is done): the
        publishing settings checked and this node's router read from the API server."""
        with connected(inv, cluster) as ctx:
            router = None
            if ctx is not None and inv.conf.publish.bgp:
                from cni_plugin.publish.bgp.router import find_router
                with api_boundary(f"find the BGPRouter of node {ctx.node!r}"):
                    router = find_router(ctx, inv.deadline)
            return cls(ctx, router)

    @contextmanager
    def api_settle_instance_thread(self, rollback: Rollback) -> Iterator[Publication]:
        """Settle the VPC's instance on a thread (`SettlingInstance`) during the block (the
        IPAM and kernel work, then `Publication.publish`); the block's end waits for it, so a
        rollback after the block finds all it recorded. The instance is held in use (GC
        waits) from its read until the block's end."""
        ctx, router = self.ctx, self.router
        if ctx is None or router is None:
            yield Publication(ctx, None, None, rollback)
            return
        from cni_plugin.publish.bgp import instance
        with instance.instance_in_use(ctx, ctx.inv.deadline):
            settling = SettlingInstance(ctx, router, rollback)
            try:
                yield Publication(ctx, router, settling, rollback)
            finally:
                settling.wait()


def unpublish(inv: Invocation, cluster: VerbCluster) -> None:
    """Withdraw this container's slices and advertisement annotations (DEL), converting a
    shared advertisement earlier versions wrote on the way."""
    if not inv.conf.publish.any:
        return
    try:
        node = _check_settings(inv)
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
            convert_shared(ctx, lambda: _router_and_vrf_id(ctx), inv.deadline,
                           keeps=lambda cid: cid != ctx.cid)


def _router_and_vrf_id(ctx: PublishContext) -> tuple[Router | None, int | None]:
    """This node's router and the VPC's VRF ID on it, where both exist (DEL's conversion)."""
    from cni_plugin.publish.bgp.instance import instance_vrf_id
    from cni_plugin.publish.bgp.router import find_router
    try:
        router = find_router(ctx, ctx.inv.deadline)
    except CniError:
        return None, None
    return router, instance_vrf_id(ctx, ctx.inv.deadline)


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


def router_has_sids(inv: Invocation, cluster: VerbCluster) -> bool:
    """Whether this node's router has an SRv6 locator and node ID (STATUS)."""
    if not inv.conf.publish.bgp:
        return False
    from cni_plugin.publish.bgp.router import find_router
    with connected(inv, cluster) as ctx, api_boundary("find the node's BGPRouter"):
        if ctx is None:
            return False
        router = find_router(ctx, inv.deadline)
        return bool(router.srv6_locator and router.node_id)


def publishing_status(inv: Invocation, cluster: VerbCluster) -> None:
    """Code 50 unless the kubeconfig works, the API answers and RBAC allows what ADD does."""
    from cni_plugin.publish.bgp.router import find_router
    from cni_plugin.publish.status import check_access
    try:
        with connected(inv, cluster) as ctx, api_boundary("check access"):
            if ctx is None:
                return
            check_access(ctx)
            if inv.conf.publish.bgp:  # ADD would fail with code 7 without exactly one
                find_router(ctx, inv.deadline)
    except CniError as exc:
        if exc.code == STATUS_NOT_AVAILABLE:
            raise
        raise CniError(STATUS_NOT_AVAILABLE, exc.msg, exc.details) from None


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
            convert_shared(ctx, lambda: _router_and_vrf_id(ctx), inv.deadline,
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
