"""The VPC's BGPVRFInstance on this node: reused (completed with our route target) or created
with the lowest free VRF ID, collisions resolved; what uses it; its undo, and its GC."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.locks import file_lock
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import ApiError, update_with_retry
from cni_plugin.publish.bgp import crd_fit
from cni_plugin.publish.bgp.router import list_selected
from cni_plugin.publish.bgp.spec import (
    MAX_ATTEMPTS,
    VRF_ID_MAX,
    VRF_ID_MIN,
    live_containers,
    restore_fields,
    unchanged_since,
    vrf_id,
)
from cni_plugin.publish.context import PublishContext, Router, create, created_by
from cni_plugin.publish.resources import ADVERTISEMENTS, GROUP, VERSION, VRF_INSTANCES
from netconf.errors import TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)
# Spec fields an ADD completes on a VRF instance it found.
INSTANCE_KEYS = ("routerRef", "importRouteTargets", "exportRouteTargets")
ROUTE_TARGET_KEYS = ("importRouteTargets", "exportRouteTargets")


def _instance_spec_ok(spec: dict[str, Any], router: Router, target: str) -> bool:
    has = all({"value": target} in (spec.get(key) or []) for key in ROUTE_TARGET_KEYS)
    return has and (spec.get("routerRef") or {}).get("name") == router.name \
        and VRF_ID_MIN <= int(spec.get("vrfID") or 0) <= VRF_ID_MAX


def _fill_instance(obj: dict[str, Any], router: Router, target: str) -> bool:
    """Add our route target / router ref to an instance, keeping every other field."""
    spec = obj.setdefault("spec", {})
    if _instance_spec_ok(spec, router, target):
        return False
    spec["routerRef"] = {**(spec.get("routerRef") or {}), "name": router.name}
    for key in ROUTE_TARGET_KEYS:
        targets = list(spec.get(key) or [])
        if {"value": target} not in targets:
            targets.append({"value": target})
        spec[key] = targets
    return True


def _router_instances(ctx: PublishContext, router: Router, deadline: Deadline, *,
                      cached: bool = False) -> list[dict[str, Any]]:
    """The router's VRF instances; `cached`: a synced watch cache will do (the agent's)."""
    if cached:
        found = ctx.session.instances(ctx.namespace, router.name)
        if found is not None:
            return found
    return list_selected(ctx, VRF_INSTANCES, "spec.routerRef.name", router.name, deadline)


def _lowest_free(used: Iterable[int]) -> int:
    taken = set(used)
    for candidate in range(VRF_ID_MIN, VRF_ID_MAX + 1):
        if candidate not in taken:
            return candidate
    raise CniError(TRY_AGAIN_LATER, "no free VRF ID left (1-4095) on this router")


def _precedence(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("creationTimestamp") or "", meta["name"])


def ask_crd_first(ctx: PublishContext, router: Router, deadline: Deadline) -> None:
    """Before ADD makes anything, and only for a route target wider than galactic's CRD takes
    (any other ADD asks nothing more): a dry-run create of the VPC's instance as ADD would make
    it; code 7 naming the limit when the cluster's CRD refuses its route target (`crd_fit`).
    Any other refusal is left to the instance's own write, where it keeps its meaning (an
    admission policy's denial stays code 104). Through the agent, a route target the CRD took
    is not asked again."""
    target = naming.route_target(router.local_asn, ctx.inv.conf.vpc)
    if crd_fit.fits_galactic_crd(target) or ctx.session.route_target_fits(target):
        return
    # No ownerReferences: reading the Node for them would be one more request.
    body = _instance_body(ctx, router, target, VRF_ID_MIN, owners=[])
    try:
        ctx.client.create(VRF_INSTANCES, body, namespace=ctx.namespace, deadline=deadline,
                          dry_run=True)
    except ApiError as exc:
        if crd_fit.refuses_route_target(exc):
            raise crd_fit.does_not_fit(ctx.inv.conf.vpc, target, exc) from None
        if exc.status != 409:  # 409: it exists, and was validated before that was looked at
            log.info("dry run of BGPVRFInstance %s: %s; its own write will tell",
                     ctx.instance_name, exc)
            return
    ctx.session.remember_route_target_fits(target)


def _instance_body(ctx: PublishContext, router: Router, target: str, vrf: int,
                   owners: list[dict[str, Any]]) -> dict[str, Any]:
    """The VPC's BGPVRFInstance on this node as ADD creates it."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
        "metadata": {"name": ctx.instance_name, "namespace": ctx.namespace,
                     "ownerReferences": owners},
        "spec": {"routerRef": {"name": router.name}, "vrfID": vrf,
                 "importRouteTargets": [{"value": target}],
                 "exportRouteTargets": [{"value": target}]},
    }


def ensure_vrf_instance(ctx: PublishContext, router: Router, rollback: Rollback,
                        deadline: Deadline) -> int:
    """The VRF ID of this VPC on this node, creating or completing its BGPVRFInstance; code 7
    when the cluster's CRD refuses the VPC's route target (`crd_fit`)."""
    target = naming.route_target(router.local_asn, ctx.inv.conf.vpc)
    try:
        return _settle_instance(ctx, router, target, rollback, deadline)
    except ApiError as exc:  # the create or update carrying our route target was refused
        if crd_fit.refuses_route_target(exc):
            raise crd_fit.does_not_fit(ctx.inv.conf.vpc, target, exc) from None
        raise


def _settle_instance(ctx: PublishContext, router: Router, target: str, rollback: Rollback,
                     deadline: Deadline) -> int:
    name = ctx.instance_name
    recorded: list[bool] = []

    def fill(obj: dict[str, Any]) -> bool:
        before = {k: copy.deepcopy((obj.get("spec") or {}).get(k)) for k in INSTANCE_KEYS}
        if not _fill_instance(obj, router, target):
            return False
        if not recorded:  # recorded before the write: its answer may be lost
            written = {k: copy.deepcopy(obj["spec"].get(k)) for k in INSTANCE_KEYS}
            rollback.created(f"route target {target} on BGPVRFInstance {name}",
                             lambda d: _restore_instance(ctx, router, written, before, d))
            recorded.append(True)
        return True

    for _ in range(MAX_ATTEMPTS):
        existing = update_with_retry(ctx.client, VRF_INSTANCES, name, namespace=ctx.namespace,
                                     deadline=deadline, mutate=fill)
        if existing is not None:  # checked when created; checked again in case of a late rival
            ctx.learn_node_owner(existing)
            return _resolve_collision(ctx, router, existing, deadline, cached=True)
        existing = _create_instance(ctx, router, target, rollback, deadline)
        if existing is not None:
            return _resolve_collision(ctx, router, existing, deadline)
        # lost a create race: read the winner's object
    raise CniError(TRY_AGAIN_LATER, f"BGPVRFInstance {name!r} keeps changing")


def _create_instance(ctx: PublishContext, router: Router, target: str, rollback: Rollback,
                     deadline: Deadline) -> dict[str, Any] | None:
    # Only this node's plugins create instances of its router: a node-wide lock makes their
    # choose-then-create atomic. Collisions with other writers are resolved afterwards.
    with file_lock(ctx.inv.lock_path(f"vrfid-{router.name}"), deadline.remaining()):
        return _create_instance_locked(ctx, router, target, rollback, deadline)


def _create_instance_locked(ctx: PublishContext, router: Router, target: str,
                            rollback: Rollback, deadline: Deadline) -> dict[str, Any] | None:
    free = _lowest_free(vrf_id(i) for i in _router_instances(ctx, router, deadline))
    body = _instance_body(ctx, router, target, free, ctx.node_owner(deadline))

    def undo(found: dict[str, Any], d: Deadline) -> None:
        _undo_instance(ctx, router, found["metadata"]["uid"], d)

    return create(ctx, VRF_INSTANCES, body, rollback, undo, deadline)  # None: someone else's


def _resolve_collision(ctx: PublishContext, router: Router, ours: dict[str, Any],
                       deadline: Deadline, *, cached: bool = False) -> int:
    """If another instance of this router has our VRF ID, the later one (by creation time,
    then name) takes the lowest free ID; both sides reach the same verdict.

    `cached`: the first look may use the agent's watch cache. An instance found (not created
    by this ADD) was checked against a fresh list when it was created; looking again on
    every ADD only catches a rival created in the same second after that check, which a
    cache a few milliseconds old sees as well. A move is always decided on a fresh list."""
    name = ctx.instance_name
    for _ in range(MAX_ATTEMPTS):
        current = vrf_id(ours)
        others = [i for i in _router_instances(ctx, router, deadline, cached=cached)
                  if i["metadata"]["name"] != name]
        rivals = [i for i in others if vrf_id(i) == current]
        if not rivals or all(_precedence(ours) < _precedence(r) for r in rivals):
            return current
        if cached:
            cached = False
            continue  # look again on a fresh list before moving
        new_id = _lowest_free(vrf_id(i) for i in others)
        log.info("VRF ID %d of %s collides with %s; moving to %d", current, name,
                 rivals[0]["metadata"]["name"], new_id)

        def move(obj: dict[str, Any], old: int = current, new: int = new_id) -> bool:
            if vrf_id(obj) != old:
                return False  # someone already moved it
            obj["spec"]["vrfID"] = new
            return True

        updated = update_with_retry(ctx.client, VRF_INSTANCES, name, namespace=ctx.namespace,
                                    deadline=deadline, mutate=move)
        if updated is None:
            raise CniError(TRY_AGAIN_LATER, f"BGPVRFInstance {name!r} vanished")
        ours = updated
    raise CniError(TRY_AGAIN_LATER, f"VRF ID of {name!r} keeps colliding")


def users(ctx: PublishContext, router: Router, instance: dict[str, Any], deadline: Deadline,
          *, ignoring: str | None = None) -> list[str]:
    """Advertisements of this VPC that rely on the instance: this router's with its VRF ID, or
    any recording a live container of this node (a shared advertisement names the router of
    its last writer, maybe another node's). `ignoring`: a container that does not count."""
    prefix = naming.hex_id(ctx.inv.conf.vpc) + "-"
    on_router = [a["metadata"]["name"] for a in
                 list_selected(ctx, ADVERTISEMENTS, "spec.routerRef.name", router.name, deadline)
                 if a["metadata"]["name"].startswith(prefix) and vrf_id(a) == vrf_id(instance)]
    if on_router:
        return on_router
    # No selector narrows by annotation: the namespace's advertisements, read only here.
    return [a["metadata"]["name"] for a in
            ctx.client.list(ADVERTISEMENTS, namespace=ctx.namespace, deadline=deadline)
            if a["metadata"]["name"].startswith(prefix) and
            live_containers(a["metadata"].get("annotations") or {}, ctx.node) - {ignoring}]


@contextmanager
def instance_in_use(ctx: PublishContext, deadline: Deadline) -> Iterator[None]:
    """Held (shared) by an ADD from reading the VPC's instance until its advertisement is
    written; an instance is deleted only under this lock held alone, so never in between."""
    with file_lock(_instance_lock(ctx), deadline.remaining(), shared=True):
        yield


def _instance_lock(ctx: PublishContext) -> str:
    return ctx.inv.lock_path(f"bgpvrfinstance-{ctx.instance_name}")


def _delete_unless_used(ctx: PublishContext, router: Router,
                        kept_because: Callable[[dict[str, Any]], str | None],
                        deadline: Deadline, *, ignoring: str | None = None) -> bool:
    """Delete the instance unless kept_because(it) names a reason or an advertisement uses
    it; whether it was deleted. A concurrent change wins (uid + resourceVersion
    preconditions); an ADD about to rely on it holds `instance_in_use`."""
    name = ctx.instance_name
    with file_lock(_instance_lock(ctx), deadline.remaining()):
        current = ctx.client.get(VRF_INSTANCES, name, namespace=ctx.namespace, deadline=deadline)
        if current is None:
            return False
        reason = kept_because(current)
        if reason is None:
            found = users(ctx, router, current, deadline, ignoring=ignoring)
            reason = f"BGPAdvertisement {found[0]} uses it" if found else None
        if reason is not None:
            log.info("keeping BGPVRFInstance %s: %s", name, reason)
            return False
        meta = current["metadata"]
        if ctx.client.delete(VRF_INSTANCES, name, namespace=ctx.namespace, deadline=deadline,
                             uid=meta["uid"], resource_version=meta["resourceVersion"]):
            log.info("deleted BGPVRFInstance %s (created by %s)", name, created_by(current))
            return True
        log.info("keeping BGPVRFInstance %s: it changed meanwhile", name)
        return False


def _undo_instance(ctx: PublishContext, router: Router, uid: str, deadline: Deadline) -> None:
    """Delete an instance this ADD created, unless an advertisement now relies on it."""
    def kept_because(current: dict[str, Any]) -> str | None:
        return None if current["metadata"]["uid"] == uid else "not the one this ADD created"

    _delete_unless_used(ctx, router, kept_because, deadline, ignoring=ctx.cid)


def _restore_instance(ctx: PublishContext, router: Router, written: dict[str, Any],
                      before: dict[str, Any], deadline: Deadline) -> None:
    """Put back the route targets and router ref an ADD added to an instance it found, unless
    someone changed them since or an advertisement now relies on the instance."""
    def put_back(obj: dict[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        if not unchanged_since(spec, written) or \
                users(ctx, router, obj, deadline, ignoring=ctx.cid):
            return False
        restore_fields(spec, before)
        return True

    update_with_retry(ctx.client, VRF_INSTANCES, ctx.instance_name, namespace=ctx.namespace,
                      deadline=deadline, mutate=put_back)


def collect_instance(ctx: PublishContext, router: Router, valid: set[tuple[str, str]],
                     attached: set[tuple[str, str]], deadline: Deadline) -> bool:
    """GC: delete this VPC's instance on this node if vpc-attach created it and nothing uses
    it any more (valid: the runtime's attachments; attached: owners of the VPC's links on
    this node); whether it was deleted."""
    vpc = ctx.inv.conf.vpc
    return _delete_unless_used(
        ctx, router, lambda current: gc_keeps_instance(current, router, vpc, valid, attached),
        deadline)


def gc_keeps_instance(instance: dict[str, Any], router: Router, vpc: str,
                      valid: set[tuple[str, str]], attached: set[tuple[str, str]]) -> str | None:
    """Why GC keeps the VPC's instance on this node before asking which advertisements use
    it; None when only that question is left."""
    mark = created_by(instance)
    if mark is None:
        return "vpc-attach did not create it"
    parts = mark.split("/")
    if len(parts) != 3:
        return f"unreadable created-by mark {mark!r}"
    creator = (parts[0], parts[1])
    spec = instance.get("spec") or {}
    if (spec.get("routerRef") or {}).get("name") != router.name:
        return f"its router is not {router.name}"
    ours = [{"value": naming.route_target(router.local_asn, vpc)}]
    if set(spec) - {"vrfID", *INSTANCE_KEYS} or \
            any(spec.get(key) != ours for key in ROUTE_TARGET_KEYS):
        return "another writer has added to it"
    if creator in valid:
        return f"the attachment that created it ({mark.rsplit('/', 1)[0]}) is valid"
    if attached:
        return "attachment {}/{} of the VPC is on this node".format(*min(attached))
    return None


def instance_vrf_id(ctx: PublishContext, deadline: Deadline) -> int | None:
    """The vrfID of the VPC's BGPVRFInstance on this node; None when it does not exist."""
    instance = ctx.client.get(VRF_INSTANCES, ctx.instance_name, namespace=ctx.namespace,
                              deadline=deadline)
    return None if instance is None else vrf_id(instance)
