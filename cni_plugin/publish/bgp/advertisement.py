"""This node's BGPAdvertisement of the attachment: this container's annotations merged in
(creating it when missing), the advertised prefixes their union; withdrawn on DEL or rollback.
The shared advertisement earlier versions wrote for every node is converted on the way: this
node's containers are written into its own first, then removed from the shared one."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import KubeClient, update_with_retry
from cni_plugin.publish.bgp.spec import (
    MAX_ATTEMPTS,
    drop_containers,
    live_containers,
    prefixes_of,
    recorded_containers,
    restore_fields,
    stale_containers,
    unchanged_since,
)
from cni_plugin.publish.context import PublishContext, Router, create
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    CONTAINER_KEYS,
    GROUP,
    NETNS_KEY,
    NODE_KEY,
    SUBNET_V4_KEY,
    SUBNET_V6_KEY,
    VERSION,
)
from netconf.errors import TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)
# Spec fields an ADD sets on an advertisement it shares with other containers (routerRef is
# set at creation only: the router announcing an object never changes).
SHARED_SPEC_KEYS = ("addressFamily", "communities", "vrfID", "function")
MAX_PREFIXES = 256  # spec.prefixes maxItems of the CRD we ship
MAX_ANNOTATION_BYTES = 256 * 1024  # the API server's limit on all annotations of an object


def container_annotations(ctx: PublishContext, addressing: Addressing) -> dict[str, str]:
    """This container's annotations on the advertisement (empty when nothing to advertise)."""
    cid = ctx.cid
    # An earlier plugin's address carries its pool's prefix, shared with other nodes: advertise
    # the host alone (SPEC §6).
    values: dict[str, str] = {}
    for prefix in addressing.advertised(host_only=ctx.inv.conf.attachment == "existing"):
        if prefix.version == 6:
            values[SUBNET_V6_KEY + cid] = str(prefix)
        else:  # recorded as the bare address, as galactic does
            values[SUBNET_V4_KEY + cid] = str(prefix.network_address)
    if not values:
        return {}
    values[NETNS_KEY + cid] = ctx.inv.env.netns
    values[NODE_KEY + cid] = ctx.node
    return values


def _advertisement_spec(router: Router, vrf_id: int, target: str,
                        prefixes: list[str]) -> dict[str, Any]:
    return {"routerRef": {"name": router.name}, "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
            "prefixes": prefixes, "communities": [target], "vrfID": vrf_id,
            "function": "End.DT46"}


def advertisement_spec(ctx: PublishContext, router: Router, vrf_id: int) -> dict[str, Any]:
    """This node's advertisement's spec but its prefixes (a migration target's record keeps
    it to create the object at the cut-over, SPEC §16)."""
    target = naming.route_target(router.local_asn, ctx.inv.conf.vpc)
    spec = _advertisement_spec(router, vrf_id, target, [])
    del spec["prefixes"]
    return spec


@dataclass(frozen=True)
class Found:
    """What ADD read before writing: this node's advertisement of the attachment, and the shared
    one earlier versions wrote (read only when this node's is absent, to convert it)."""

    own: dict[str, Any] | None
    shared: dict[str, Any] | None = None


def read_advertisement(ctx: PublishContext, deadline: Deadline,
                       name: str | None = None) -> dict[str, Any] | None:
    """This node's BGPAdvertisement of the attachment (or the one named), or None."""
    return ctx.client.get(ADVERTISEMENTS, name or ctx.advertisement_name,
                          namespace=ctx.namespace, deadline=deadline)


def read_found(ctx: PublishContext, deadline: Deadline) -> Found:
    """This node's advertisement; when absent, the shared one too (one request more, only on
    the ADD that creates this node's, and not when the session knows it holds none of this
    node's containers: the agent lists them once)."""
    own = read_advertisement(ctx, deadline)
    if own is not None or not _shared_may_hold(ctx, deadline):
        return Found(own)
    return Found(None, read_advertisement(ctx, deadline, ctx.shared_advertisement_name))


def _shared_may_hold(ctx: PublishContext, deadline: Deadline) -> bool:
    """Whether the shared advertisement may hold this node's containers: not when the session's
    listing says it holds none (nothing to convert, so nothing to read)."""
    holding = ctx.session.advertisements_holding(ctx.namespace, ctx.node, deadline)
    return holding is None or ctx.shared_advertisement_name in holding


def ensure_advertisement(ctx: PublishContext, router: Router, vrf_id: int,
                         addressing: Addressing, rollback: Rollback, deadline: Deadline,
                         read: Found) -> None:
    """Merge this container into this node's BGPAdvertisement of the attachment (create it if
    missing), then move this node's containers out of a shared one earlier versions wrote.
    `read`: what `read_found` found a moment ago, used for the first attempt (a write based on
    it is conditional: a stale read costs a conflict and a re-read, nothing else)."""
    ours = container_annotations(ctx, addressing)
    if not ours:
        return  # nothing to advertise (an L2-only tap)
    if read.shared is None:
        _merge_own(ctx, router, vrf_id, ours, {}, rollback, deadline, read.own)
        return
    shared = read.shared["metadata"].get("annotations") or {}
    moving = live_containers(shared, ctx.node) - {ctx.cid}
    _merge_own(ctx, router, vrf_id, ours, _annotations_of(shared, moving), rollback, deadline,
               read.own)
    _release_shared(ctx, deadline, moving | {ctx.cid})  # announced by this node's now


def convert_shared(ctx: PublishContext, locate: Callable[[], tuple[Router | None, int | None]],
                   deadline: Deadline, *, keeps: Callable[[str], bool]) -> None:
    """Move this node's containers out of the shared advertisement earlier versions wrote: the
    live ones `keeps` accepts into this node's (written first: no live prefix is unannounced
    in between), the others dropped; the shared one is deleted when that empties it (DEL, GC).
    `locate`: this node's router and the VPC's VRF ID on it, asked only when something moves;
    without either, those containers stay in the shared one (still announced there)."""
    shared = read_advertisement(ctx, deadline, ctx.shared_advertisement_name)
    if shared is None:
        return
    annotations = shared["metadata"].get("annotations") or {}
    moving = {cid for cid in live_containers(annotations, ctx.node) if keeps(cid)}
    staying: set[str] = set()
    if moving:
        router, vrf_id = locate()
        if router is None or vrf_id is None:
            staying = moving  # nowhere to move them: still announced from the shared one
            log.warning("leaving containers %s of node %s in shared BGPAdvertisement %s: "
                        "no BGPRouter or no BGPVRFInstance of the VPC for this node to write "
                        "its own advertisement with", ", ".join(sorted(moving)), ctx.node,
                        ctx.shared_advertisement_name)
        else:
            # Creating this node's object here is not rolled back: DEL and GC undo nothing.
            _merge_own(ctx, router, vrf_id, {}, _annotations_of(annotations, moving),
                       Rollback(deadline), deadline, read_advertisement(ctx, deadline))
    _release_shared(ctx, deadline, recorded_containers(annotations, ctx.node) - staying)


def prune_own(ctx: PublishContext, deadline: Deadline, *, keeps: Callable[[str], bool]) -> None:
    """GC: drop this node's containers that `keeps` refuses (or whose netns is gone) from this
    node's advertisement; deleted when that leaves no prefixes."""
    def gone(annotations: dict[str, str]) -> set[str]:
        return {cid for cid in recorded_containers(annotations, ctx.node) if not keeps(cid)}

    _drop_containers(ctx, ctx.advertisement_name, gone, deadline,
                     "collected containers {} from BGPAdvertisement {}")


def _annotations_of(annotations: dict[str, str], cids: set[str]) -> dict[str, str]:
    """Every annotation of these containers."""
    return {key + cid: annotations[key + cid] for cid in cids for key in CONTAINER_KEYS
            if key + cid in annotations}


def _merge_own(ctx: PublishContext, router: Router, vrf_id: int, ours: dict[str, str],
               moving: dict[str, str], rollback: Rollback, deadline: Deadline,
               read: dict[str, Any] | None) -> None:
    """Write `ours` (this container's, recorded for rollback) and `moving` (other containers
    of this node, from the shared form) into this node's advertisement, creating it if
    missing. Its routerRef is set at creation and never changed."""
    name, cid = ctx.advertisement_name, ctx.cid
    target = naming.route_target(router.local_asn, ctx.inv.conf.vpc)

    def merge(obj: dict[str, Any]) -> bool:
        meta = obj.setdefault("metadata", {})
        annotations = dict(meta.get("annotations") or {})
        drop_containers(annotations, stale_containers(annotations, ctx.node, cid))
        annotations.update({k: v for k, v in moving.items() if k not in annotations})
        annotations.update(ours)
        prefixes = prefixes_of(annotations)
        _within_limits(name, prefixes, annotations)
        old_spec = obj.get("spec") or {}
        spec = {**old_spec, **_advertisement_spec(router, vrf_id, target, prefixes)}
        if old_spec.get("routerRef"):
            spec["routerRef"] = old_spec["routerRef"]
        if annotations == meta.get("annotations") and spec == old_spec:
            return False
        meta["annotations"] = annotations
        obj["spec"] = spec
        return True

    written = {k: v for k, v in _advertisement_spec(router, vrf_id, target, []).items()
               if k in SHARED_SPEC_KEYS}
    existing = read
    for attempt in range(MAX_ATTEMPTS):
        if attempt:
            existing = read_advertisement(ctx, deadline)
        if existing is not None:
            had_ours = all(existing["metadata"].get("annotations", {}).get(k) == v
                           for k, v in ours.items())
            if not had_ours:  # recorded before the write: its answer may be lost
                before = {k: (existing.get("spec") or {}).get(k) for k in SHARED_SPEC_KEYS}
                rollback.created(f"annotations of {cid} on BGPAdvertisement {name}",
                                 _restoring_withdrawal(ctx, written, before))
            if update_with_retry(ctx.client, ADVERTISEMENTS, name, namespace=ctx.namespace,
                                 deadline=deadline, mutate=merge, read=existing) is None:
                continue  # deleted meanwhile: create it
            return
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPAdvertisement",
                "metadata": {"name": name, "namespace": ctx.namespace, "annotations": {},
                             "ownerReferences": ctx.node_owner(deadline)}}
        merge(body)
        # Others may join before a rollback: it withdraws ours, never blind-deletes.
        if create(ctx, ADVERTISEMENTS, body, rollback,
                  lambda _, d: withdraw_advertisement(ctx, d, may_delete=True), deadline):
            return
        # created concurrently: merge into it
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")


def _release_shared(ctx: PublishContext, deadline: Deadline, cids: set[str]) -> None:
    """Remove these containers (now in this node's advertisement, or leaving) and this node's
    stale ones from the shared advertisement; delete it when that leaves no prefixes (with a
    resourceVersion precondition, so a concurrent writer keeps it)."""
    _drop_containers(ctx, ctx.shared_advertisement_name, lambda _: cids, deadline,
                     "moved containers {} out of shared BGPAdvertisement {}")


def _drop_containers(ctx: PublishContext, name: str,
                     choose: Callable[[dict[str, str]], set[str]], deadline: Deadline,
                     done: str) -> None:
    """Drop the containers `choose` names (from the annotations as read) and this node's stale
    ones from an advertisement; delete it when that leaves no prefixes. Conditional writes,
    re-read on a conflict."""
    for _ in range(MAX_ATTEMPTS):
        current = read_advertisement(ctx, deadline, name)
        if current is None:
            return
        annotations = dict(current["metadata"].get("annotations") or {})
        gone = {cid for cid in choose(annotations)
                if any(key + cid in annotations for key in CONTAINER_KEYS)}
        gone |= stale_containers(annotations, ctx.node, keep="")
        if not gone:
            return
        drop_containers(annotations, gone)
        if write_or_delete(ctx.client, ctx.namespace, current, annotations, deadline):
            log.info(done.format(", ".join(sorted(gone)), name) + " (node %s)", ctx.node)
            return
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")


def write_or_delete(client: KubeClient, namespace: str, current: dict[str, Any],
                    annotations: dict[str, str], deadline: Deadline) -> bool:
    """Put the advertisement `current` with these annotations, or delete it when they
    advertise nothing (uid + resourceVersion preconditions: a concurrent writer keeps it);
    False when it changed meanwhile (re-read). Also a migration's withdrawal of its source."""
    prefixes = prefixes_of(annotations)
    meta = current["metadata"]
    if not prefixes:
        return client.delete(ADVERTISEMENTS, meta["name"], namespace=namespace,
                             deadline=deadline, uid=meta["uid"],
                             resource_version=meta["resourceVersion"])
    meta["annotations"] = annotations
    current["spec"]["prefixes"] = prefixes
    return client.put_unless_changed(ADVERTISEMENTS, current, deadline=deadline)


def _within_limits(name: str, prefixes: list[str], annotations: dict[str, str]) -> None:
    """Code 11 naming the limit when the write would be refused for its size: the CRD's
    maxItems on prefixes, or the API server's total size of annotations."""
    if len(prefixes) > MAX_PREFIXES:
        raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} is full: it would advertise "
                       f"{len(prefixes)} prefixes, its CRD allows at most {MAX_PREFIXES} "
                       "(spec.prefixes maxItems)", "retry once other workloads of this "
                       "attachment are gone, or spread them over more vpcattachments")
    size = sum(len(key) + len(value) for key, value in annotations.items())
    if size > MAX_ANNOTATION_BYTES:
        raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} is full: its annotations "
                       f"would take {size} bytes, the API server allows at most "
                       f"{MAX_ANNOTATION_BYTES} (256 KiB)", "retry once other workloads of "
                       "this attachment are gone, or spread them over more vpcattachments")


def _restoring_withdrawal(ctx: PublishContext, written: dict[str, Any],
                          before: dict[str, Any]) -> Callable[[Deadline], object]:
    return lambda d: withdraw_advertisement(ctx, d, may_delete=False, restore=(written, before))


def withdraw_advertisement(ctx: PublishContext, deadline: Deadline, *, may_delete: bool,
                           restore: tuple[dict[str, Any], dict[str, Any]] | None = None) -> bool:
    """Remove this container's annotations; delete the object if that leaves no prefixes
    (with a resourceVersion precondition, so a concurrent ADD keeps it).

    `restore` = (what this ADD wrote, what was there before): a rollback puts the shared
    spec fields back, unless someone has changed them since. Whether this node's advertisement
    recorded the container."""
    name, cid = ctx.advertisement_name, ctx.cid
    for _ in range(MAX_ATTEMPTS):
        current = read_advertisement(ctx, deadline)
        if current is None:
            return False
        annotations = dict(current["metadata"].get("annotations") or {})
        if not any(key + cid in annotations for key in CONTAINER_KEYS):
            return False
        drop_containers(annotations, {cid} | stale_containers(annotations, ctx.node, cid))
        prefixes = prefixes_of(annotations)
        if not prefixes:
            if not may_delete:
                log.info("leaving %s untouched: it would have no prefixes", name)
                return True
            meta = current["metadata"]
            if ctx.client.delete(ADVERTISEMENTS, name, namespace=ctx.namespace,
                                 deadline=deadline, uid=meta["uid"],
                                 resource_version=meta["resourceVersion"]):
                return True
            continue  # changed meanwhile (a concurrent ADD): re-read
        current["metadata"]["annotations"] = annotations
        current["spec"]["prefixes"] = prefixes
        if restore is not None:
            written, before = restore
            if unchanged_since(current["spec"], written):  # else changed by someone: theirs
                restore_fields(current["spec"], before)
        if ctx.client.put_unless_changed(ADVERTISEMENTS, current, deadline=deadline):
            return True
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")
