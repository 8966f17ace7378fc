"""ADD's publishing: `Publisher.api_find_router` runs before any kernel change (it checks the
settings, code 7, reaches the API, code 11 when unreachable, finds this node's BGPRouter, and
asks whether the cluster's CRD takes a wide route target, code 7, so an ADD that cannot
publish changes nothing); its `api_settle_instance_thread` block settles the
VPC's BGPVRFInstance on a thread while IPAM and the kernel work run, and yields the
`Publication` that alone can `api_publish` the attachment (or hold it back, not announced)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cni_plugin.core.addressing import Addressing
from cni_plugin.core.request import Invocation
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.session import VerbCluster
from cni_plugin.publish.boundary import api_boundary, connected
from cni_plugin.publish.context import PublishContext, Router
from netconf.errors import TRY_AGAIN_LATER, CniError

if TYPE_CHECKING:
    from cni_plugin.publish.bgp.advertisement import Found


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
        publishing settings checked, this node's router read from the API server and, for a
        route target wider than galactic's CRD takes, the cluster's CRD asked
        (`instance.ask_crd_first`)."""
        with connected(inv, cluster) as ctx:
            router = None
            if ctx is not None and inv.conf.publish.bgp:
                from cni_plugin.publish.bgp.router import find_router
                with api_boundary(f"find the BGPRouter of node {ctx.node!r}"):
                    router = find_router(ctx, inv.deadline)
                from cni_plugin.publish.bgp.instance import ask_crd_first
                ask_crd_first(ctx, router, inv.deadline)
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
