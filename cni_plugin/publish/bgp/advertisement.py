"""The attachment's BGPAdvertisement: this container's annotations merged in (creating it when
missing), the advertised prefixes their union; withdrawn on DEL or rollback."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import update_with_retry
from cni_plugin.publish.bgp.spec import (
    MAX_ATTEMPTS,
    drop_containers,
    prefixes_of,
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
# Spec fields an ADD sets on an advertisement it shares with other containers.
SHARED_SPEC_KEYS = ("routerRef", "addressFamily", "communities", "vrfID", "function")
MAX_PREFIXES = 256  # spec.prefixes maxItems of the CRD we ship
MAX_ANNOTATION_BYTES = 256 * 1024  # the API server's limit on all annotations of an object


def container_annotations(ctx: PublishContext, addressing: Addressing) -> dict[str, str]:
    """This container's annotations on the advertisement (empty when nothing to advertise)."""
    cid = ctx.cid
    # An earlier plugin's address carries its pool's prefix, shared with other nodes: advertise
    # the host alone (SPEC §6).
    host_only = ctx.inv.conf.attachment == "existing"
    values: dict[str, str] = {}
    for addr in addressing.workload:
        if addr.version == 6 and SUBNET_V6_KEY + cid not in values:
            values[SUBNET_V6_KEY + cid] = f"{addr.ip}/128" if host_only else str(addr.network)
        elif addr.version == 4 and SUBNET_V4_KEY + cid not in values:
            values[SUBNET_V4_KEY + cid] = str(addr.ip)
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


def read_advertisement(ctx: PublishContext, deadline: Deadline) -> dict[str, Any] | None:
    """The attachment's BGPAdvertisement, or None."""
    return ctx.client.get(ADVERTISEMENTS, ctx.advertisement_name, namespace=ctx.namespace,
                          deadline=deadline)


def ensure_advertisement(ctx: PublishContext, router: Router, vrf_id: int,
                         addressing: Addressing, rollback: Rollback, deadline: Deadline,
                         read: dict[str, Any] | None) -> None:
    """Merge this container into the attachment's BGPAdvertisement (create it if missing).
    `read`: the object as `read_advertisement` found it a moment ago (None: absent), used for
    the first attempt (a write based on it is conditional: a stale read costs a conflict and a
    re-read, nothing else)."""
    ours = container_annotations(ctx, addressing)
    if not ours:
        return  # nothing to advertise (an L2-only tap)
    name, cid = ctx.advertisement_name, ctx.cid
    target = naming.route_target(router.local_asn, ctx.inv.conf.vpc)

    def merge(obj: dict[str, Any]) -> bool:
        meta = obj.setdefault("metadata", {})
        annotations = dict(meta.get("annotations") or {})
        drop_containers(annotations, stale_containers(annotations, ctx.node, cid))
        annotations.update(ours)
        prefixes = prefixes_of(annotations)
        _within_limits(name, prefixes, annotations)
        spec = {**(obj.get("spec") or {}),
                **_advertisement_spec(router, vrf_id, target, prefixes)}
        if annotations == meta.get("annotations") and spec == obj.get("spec"):
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
                                 deadline=deadline, mutate=merge) is None:
                continue  # deleted meanwhile: create it
            return
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPAdvertisement",
                "metadata": {"name": name, "namespace": ctx.namespace, "annotations": {}}}
        merge(body)
        # Others may join before a rollback: it withdraws ours, never blind-deletes.
        if create(ctx, ADVERTISEMENTS, body, rollback,
                  lambda _, d: withdraw_advertisement(ctx, d, may_delete=True), deadline):
            return
        # created concurrently: merge into it
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")


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
                          before: dict[str, Any]) -> Callable[[Deadline], None]:
    return lambda d: withdraw_advertisement(ctx, d, may_delete=False, restore=(written, before))


def withdraw_advertisement(ctx: PublishContext, deadline: Deadline, *, may_delete: bool,
                           restore: tuple[dict[str, Any], dict[str, Any]] | None = None) -> None:
    """Remove this container's annotations; delete the object if that leaves no prefixes
    (with a resourceVersion precondition, so a concurrent ADD keeps it).

    `restore` = (what this ADD wrote, what was there before): a rollback puts the shared
    spec fields back, unless someone has changed them since."""
    name, cid = ctx.advertisement_name, ctx.cid
    for _ in range(MAX_ATTEMPTS):
        current = read_advertisement(ctx, deadline)
        if current is None:
            return
        annotations = dict(current["metadata"].get("annotations") or {})
        if not any(key + cid in annotations for key in CONTAINER_KEYS):
            return
        drop_containers(annotations, {cid} | stale_containers(annotations, ctx.node, cid))
        prefixes = prefixes_of(annotations)
        if not prefixes:
            if not may_delete:
                log.info("leaving %s untouched: it would have no prefixes", name)
                return
            meta = current["metadata"]
            if ctx.client.delete(ADVERTISEMENTS, name, namespace=ctx.namespace,
                                 deadline=deadline, uid=meta["uid"],
                                 resource_version=meta["resourceVersion"]):
                return
            continue  # changed meanwhile (a concurrent ADD): re-read
        current["metadata"]["annotations"] = annotations
        current["spec"]["prefixes"] = prefixes
        if restore is not None:
            written, before = restore
            if unchanged_since(current["spec"], written):  # else changed by someone: theirs
                restore_fields(current["spec"], before)
        if ctx.client.put_unless_changed(ADVERTISEMENTS, current, deadline=deadline):
            return
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")
