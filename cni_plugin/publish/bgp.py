"""BGP custom resources (SPEC §6): find the router, ensure the VRF instance, merge the
advertisement. Writes re-read on 409; created objects are recorded for rollback."""

from __future__ import annotations

import copy
import ipaddress
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.locks import file_lock
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import ApiError, Resource, update_with_retry
from cni_plugin.publish.context import PublishContext, Router, create, created_by
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    CONTAINER_KEYS,
    GROUP,
    NETNS_KEY,
    NODE_KEY,
    ROUTERS,
    SUBNET_V4_KEY,
    SUBNET_V6_KEY,
    VERSION,
    VRF_INSTANCES,
)
from netconf.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)
VRF_ID_MIN, VRF_ID_MAX = 1, 4095
# Spec fields an ADD sets on an advertisement it shares with other containers.
SHARED_SPEC_KEYS = ("routerRef", "addressFamily", "communities", "vrfID", "function")
# Spec fields an ADD completes on a VRF instance it found.
INSTANCE_KEYS = ("routerRef", "importRouteTargets", "exportRouteTargets")
MAX_ATTEMPTS = 10
MAX_PREFIXES = 256  # spec.prefixes maxItems of the CRD we ship
MAX_ANNOTATION_BYTES = 256 * 1024  # the API server's limit on all annotations of an object


def _list_selected(ctx: PublishContext, resource: Resource, field: str, value: str,
                   deadline: Deadline) -> list[dict[str, Any]]:
    """Objects whose `field` equals value, narrowed by the API server when the CRD allows."""
    try:
        return ctx.client.list(resource, namespace=ctx.namespace, deadline=deadline,
                               fields=f"{field}={value}")
    except ApiError as exc:
        if exc.status != 400:  # 400: this CRD declares no selectable field (upstream's)
            raise
    keys = field.split(".")
    items = []
    for item in ctx.client.list(resource, namespace=ctx.namespace, deadline=deadline):
        node: Any = item
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node == value:
            items.append(item)
    return items


def find_router(ctx: PublishContext, deadline: Deadline) -> Router:
    """The one BGPRouter whose targetRef names this node (code 7 otherwise)."""
    cached = ctx.source.routers(ctx.kubeconfig, ctx.namespace, ctx.node)
    candidates = cached if cached is not None else \
        _list_selected(ctx, ROUTERS, "spec.targetRef.name", ctx.node, deadline)
    found = [r for r in candidates
             if (r.get("spec", {}).get("targetRef") or {}).get("kind", "Node") == "Node"]
    if len(found) != 1:
        names = ", ".join(sorted(r["metadata"]["name"] for r in found)) or "none"
        raise CniError(INVALID_CONFIG, f"expected exactly one BGPRouter targeting node "
                       f"{ctx.node!r} in namespace {ctx.namespace!r}, found {len(found)}",
                       f"found: {names}")
    return Router.from_object(found[0])


def _instance_spec_ok(spec: dict[str, Any], router: Router, target: str) -> bool:
    has = all({"value": target} in (spec.get(key) or [])
              for key in ("importRouteTargets", "exportRouteTargets"))
    return has and (spec.get("routerRef") or {}).get("name") == router.name \
        and VRF_ID_MIN <= int(spec.get("vrfID") or 0) <= VRF_ID_MAX


def _fill_instance(obj: dict[str, Any], router: Router, target: str) -> bool:
    """Add our route target / router ref to an instance, keeping every other field."""
    spec = obj.setdefault("spec", {})
    if _instance_spec_ok(spec, router, target):
        return False
    spec["routerRef"] = {**(spec.get("routerRef") or {}), "name": router.name}
    for key in ("importRouteTargets", "exportRouteTargets"):
        targets = list(spec.get(key) or [])
        if {"value": target} not in targets:
            targets.append({"value": target})
        spec[key] = targets
    return True


def _router_instances(ctx: PublishContext, router: Router, deadline: Deadline, *,
                      cached: bool = False) -> list[dict[str, Any]]:
    """The router's VRF instances; `cached`: a synced watch cache will do (the agent's)."""
    if cached:
        found = ctx.source.instances(ctx.kubeconfig, ctx.namespace, router.name)
        if found is not None:
            return found
    return _list_selected(ctx, VRF_INSTANCES, "spec.routerRef.name", router.name, deadline)


def _lowest_free(used: Iterable[int]) -> int:
    taken = set(used)
    for candidate in range(VRF_ID_MIN, VRF_ID_MAX + 1):
        if candidate not in taken:
            return candidate
    raise CniError(TRY_AGAIN_LATER, "no free VRF ID left (1-4095) on this router")


def _vrf_id(obj: dict[str, Any]) -> int:
    return int((obj.get("spec") or {}).get("vrfID") or 0)


def _precedence(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("creationTimestamp") or "", meta["name"])


def ensure_vrf_instance(ctx: PublishContext, router: Router, rollback: Rollback,
                        deadline: Deadline) -> int:
    """The VRF ID of this VPC on this node, creating or completing its BGPVRFInstance."""
    conf = ctx.inv.conf
    name = naming.vrf_instance_name(conf.vpc, ctx.node)
    target = naming.route_target(router.local_asn, conf.vpc)
    recorded: list[bool] = []

    def fill(obj: dict[str, Any]) -> bool:
        before = {k: copy.deepcopy((obj.get("spec") or {}).get(k)) for k in INSTANCE_KEYS}
        if not _fill_instance(obj, router, target):
            return False
        if not recorded:  # recorded before the write: its answer may be lost
            written = {k: copy.deepcopy(obj["spec"].get(k)) for k in INSTANCE_KEYS}
            rollback.created(f"route target {target} on BGPVRFInstance {name}",
                             lambda d: _restore_instance(ctx, router, name, written, before, d))
            recorded.append(True)
        return True

    for _ in range(MAX_ATTEMPTS):
        existing = update_with_retry(ctx.client, VRF_INSTANCES, name, namespace=ctx.namespace,
                                     deadline=deadline, mutate=fill)
        if existing is not None:  # checked when created; checked again in case of a late rival
            return _resolve_collision(ctx, router, existing, deadline, cached=True)
        existing = _create_instance(ctx, router, name, target, rollback, deadline)
        if existing is not None:
            return _resolve_collision(ctx, router, existing, deadline)
        # lost a create race: read the winner's object
    raise CniError(TRY_AGAIN_LATER, f"BGPVRFInstance {name!r} keeps changing")


def _create_instance(ctx: PublishContext, router: Router, name: str, target: str,
                     rollback: Rollback, deadline: Deadline) -> dict[str, Any] | None:
    # Only this node's plugins create instances of its router: a node-wide lock makes their
    # choose-then-create atomic. Collisions with other writers are resolved afterwards.
    with file_lock(ctx.inv.lock_path(f"vrfid-{router.name}"), deadline.remaining()):
        return _create_instance_locked(ctx, router, name, target, rollback, deadline)


def _create_instance_locked(ctx: PublishContext, router: Router, name: str, target: str,
                            rollback: Rollback, deadline: Deadline) -> dict[str, Any] | None:
    vrf_id = _lowest_free(_vrf_id(i) for i in _router_instances(ctx, router, deadline))
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
        "metadata": {"name": name, "namespace": ctx.namespace},
        "spec": {"routerRef": {"name": router.name}, "vrfID": vrf_id,
                 "importRouteTargets": [{"value": target}],
                 "exportRouteTargets": [{"value": target}]},
    }

    def undo(found: dict[str, Any], d: Deadline) -> None:
        _undo_instance(ctx, router, name, found["metadata"]["uid"], d)

    return create(ctx, VRF_INSTANCES, body, rollback, undo, deadline)  # None: someone else's


def _resolve_collision(ctx: PublishContext, router: Router, ours: dict[str, Any],
                       deadline: Deadline, *, cached: bool = False) -> int:
    """If another instance of this router has our VRF ID, the later one (by creation time,
    then name) takes the lowest free ID; both sides reach the same verdict.

    `cached`: the first look may use the agent's watch cache. An instance found (not created
    by this ADD) was checked against a fresh list when it was created; looking again on
    every ADD only catches a rival created in the same second after that check, which a
    cache a few milliseconds old sees as well. A move is always decided on a fresh list."""
    name = ours["metadata"]["name"]
    for _ in range(MAX_ATTEMPTS):
        vrf_id = _vrf_id(ours)
        others = [i for i in _router_instances(ctx, router, deadline, cached=cached)
                  if i["metadata"]["name"] != name]
        rivals = [i for i in others if _vrf_id(i) == vrf_id]
        if not rivals or all(_precedence(ours) < _precedence(r) for r in rivals):
            return vrf_id
        if cached:
            cached = False
            continue  # look again on a fresh list before moving
        new_id = _lowest_free(_vrf_id(i) for i in others)
        log.info("VRF ID %d of %s collides with %s; moving to %d", vrf_id, name,
                 rivals[0]["metadata"]["name"], new_id)

        def move(obj: dict[str, Any], old: int = vrf_id, new: int = new_id) -> bool:
            if _vrf_id(obj) != old:
                return False  # someone already moved it
            obj["spec"]["vrfID"] = new
            return True

        updated = update_with_retry(ctx.client, VRF_INSTANCES, name, namespace=ctx.namespace,
                                    deadline=deadline, mutate=move)
        if updated is None:
            raise CniError(TRY_AGAIN_LATER, f"BGPVRFInstance {name!r} vanished")
        ours = updated
    raise CniError(TRY_AGAIN_LATER, f"VRF ID of {name!r} keeps colliding")


def _users(ctx: PublishContext, router: Router, instance: dict[str, Any], deadline: Deadline,
           *, ignoring: str | None = None) -> list[str]:
    """Advertisements of this VPC that rely on the instance: this router's with its VRF ID, or
    any recording a live container of this node (a shared advertisement names the router of
    its last writer, maybe another node's). `ignoring`: a container that does not count."""
    prefix = naming.hex_id(ctx.inv.conf.vpc) + "-"
    on_router = [a["metadata"]["name"] for a in
                 _list_selected(ctx, ADVERTISEMENTS, "spec.routerRef.name", router.name, deadline)
                 if a["metadata"]["name"].startswith(prefix) and _vrf_id(a) == _vrf_id(instance)]
    if on_router:
        return on_router
    # No selector narrows by annotation: the namespace's advertisements, read only here.
    return [a["metadata"]["name"] for a in
            ctx.client.list(ADVERTISEMENTS, namespace=ctx.namespace, deadline=deadline)
            if a["metadata"]["name"].startswith(prefix) and
            _live_containers(a["metadata"].get("annotations") or {}, ctx.node) - {ignoring}]


@contextmanager
def instance_in_use(ctx: PublishContext, deadline: Deadline) -> Iterator[None]:
    """Held (shared) by an ADD from reading the VPC's instance until its advertisement is
    written; an instance is deleted only under this lock held alone, so never in between."""
    name = naming.vrf_instance_name(ctx.inv.conf.vpc, ctx.node)
    with file_lock(_instance_lock(ctx, name), deadline.remaining(), shared=True):
        yield


def _instance_lock(ctx: PublishContext, name: str) -> str:
    return ctx.inv.lock_path(f"bgpvrfinstance-{name}")


def _delete_unless_used(ctx: PublishContext, router: Router, name: str,
                        kept_because: Callable[[dict[str, Any]], str | None],
                        deadline: Deadline, *, ignoring: str | None = None) -> bool:
    """Delete the instance unless kept_because(it) names a reason or an advertisement uses
    it; whether it was deleted. A concurrent change wins (uid + resourceVersion
    preconditions); an ADD about to rely on it holds `instance_in_use`."""
    with file_lock(_instance_lock(ctx, name), deadline.remaining()):
        current = ctx.client.get(VRF_INSTANCES, name, namespace=ctx.namespace, deadline=deadline)
        if current is None:
            return False
        reason = kept_because(current)
        if reason is None:
            users = _users(ctx, router, current, deadline, ignoring=ignoring)
            reason = f"BGPAdvertisement {users[0]} uses it" if users else None
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


def _undo_instance(ctx: PublishContext, router: Router, name: str, uid: str,
                   deadline: Deadline) -> None:
    """Delete an instance this ADD created, unless an advertisement now relies on it."""
    def kept_because(current: dict[str, Any]) -> str | None:
        return None if current["metadata"]["uid"] == uid else "not the one this ADD created"

    _delete_unless_used(ctx, router, name, kept_because, deadline,
                        ignoring=naming.annotation_cid(ctx.inv.env.container_id))


def collect_instance(ctx: PublishContext, router: Router, valid: set[tuple[str, str]],
                     attached: set[tuple[str, str]], deadline: Deadline) -> bool:
    """GC: delete this VPC's instance on this node if vpc-attach created it and nothing uses
    it any more (valid: the runtime's attachments; attached: owners of the VPC's links on
    this node); whether it was deleted."""
    vpc = ctx.inv.conf.vpc
    return _delete_unless_used(
        ctx, router, naming.vrf_instance_name(vpc, ctx.node),
        lambda current: gc_keeps_instance(current, router, vpc, valid, attached), deadline)


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
            any(spec.get(key) != ours for key in ("importRouteTargets", "exportRouteTargets")):
        return "another writer has added to it"
    if creator in valid:
        return f"the attachment that created it ({mark.rsplit('/', 1)[0]}) is valid"
    if attached:
        return "attachment {}/{} of the VPC is on this node".format(*min(attached))
    return None


def _restore_instance(ctx: PublishContext, router: Router, name: str,
                      written: dict[str, Any], before: dict[str, Any],
                      deadline: Deadline) -> None:
    """Put back the route targets and router ref an ADD added to an instance it found, unless
    someone changed them since or an advertisement now relies on the instance."""
    def put_back(obj: dict[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        if any(spec.get(k) != v for k, v in written.items()) or \
                _users(ctx, router, obj, deadline,
                       ignoring=naming.annotation_cid(ctx.inv.env.container_id)):
            return False
        for key, value in before.items():
            if value is None:
                spec.pop(key, None)
            else:
                spec[key] = value
        return True

    update_with_retry(ctx.client, VRF_INSTANCES, name, namespace=ctx.namespace,
                      deadline=deadline, mutate=put_back)


# Advertisements ---------------------------------------------------------------------------

def container_annotations(ctx: PublishContext, plan: Addressing) -> dict[str, str]:
    """This container's annotations on the advertisement (empty when nothing to advertise)."""
    cid = naming.annotation_cid(ctx.inv.env.container_id)
    # An earlier plugin's address carries its pool's prefix, shared with other nodes: advertise
    # the host alone (SPEC §6).
    host_only = ctx.inv.conf.attachment == "existing"
    values: dict[str, str] = {}
    for addr in plan.workload:
        if addr.version == 6 and SUBNET_V6_KEY + cid not in values:
            values[SUBNET_V6_KEY + cid] = f"{addr.ip}/128" if host_only else str(addr.network)
        elif addr.version == 4 and SUBNET_V4_KEY + cid not in values:
            values[SUBNET_V4_KEY + cid] = str(addr.ip)
    if not values:
        return {}
    values[NETNS_KEY + cid] = ctx.inv.env.netns
    values[NODE_KEY + cid] = ctx.node
    return values


def prefixes_of(annotations: dict[str, str]) -> list[str]:
    """The advertised set: union of every container's subnets, deduplicated and sorted."""
    found: set[str] = set()
    for key, value in annotations.items():
        try:
            if key.startswith(SUBNET_V6_KEY):
                found.add(str(ipaddress.IPv6Network(value, strict=False)))
            elif key.startswith(SUBNET_V4_KEY):
                found.add(str(ipaddress.IPv4Network(f"{value}/32")))
        except ValueError:
            log.warning("ignoring malformed annotation %s=%r", key, value)
    return sorted(found, key=lambda p: (ipaddress.ip_network(p).version,
                                        ipaddress.ip_network(p)))


def _stale_containers(annotations: dict[str, str], node: str, keep: str) -> set[str]:
    """Containers this node recorded whose netns no longer exists here."""
    stale = set()
    for key, value in annotations.items():
        if key.startswith(NODE_KEY) and value == node:
            cid = key[len(NODE_KEY):]
            netns = annotations.get(NETNS_KEY + cid, "")
            if cid != keep and netns and not os.path.exists(netns):
                stale.add(cid)
    return stale


def _live_containers(annotations: dict[str, str], node: str) -> set[str]:
    """Containers this node recorded whose netns is still there."""
    recorded = {key[len(NODE_KEY):] for key, value in annotations.items()
                if key.startswith(NODE_KEY) and value == node}
    return recorded - _stale_containers(annotations, node, keep="")


def _drop_containers(annotations: dict[str, str], cids: Iterable[str]) -> None:
    for cid in cids:
        for key in CONTAINER_KEYS:
            annotations.pop(key + cid, None)


def _advertisement_spec(router: Router, vrf_id: int, target: str,
                        prefixes: list[str]) -> dict[str, Any]:
    return {"routerRef": {"name": router.name}, "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
            "prefixes": prefixes, "communities": [target], "vrfID": vrf_id,
            "function": "End.DT46"}


def read_advertisement(ctx: PublishContext, deadline: Deadline) -> dict[str, Any] | None:
    """The attachment's BGPAdvertisement, or None."""
    conf = ctx.inv.conf
    name = naming.advertisement_name(conf.vpc, conf.vpcattachment)
    return ctx.client.get(ADVERTISEMENTS, name, namespace=ctx.namespace, deadline=deadline)


def ensure_advertisement(ctx: PublishContext, router: Router, vrf_id: int, plan: Addressing,
                         rollback: Rollback, deadline: Deadline,
                         read: dict[str, Any] | None) -> None:
    """Merge this container into the attachment's BGPAdvertisement (create it if missing).
    `read`: the object as `read_advertisement` found it a moment ago (None: absent), used for
    the first attempt (a write based on it is conditional: a stale read costs a conflict and a
    re-read, nothing else)."""
    ours = container_annotations(ctx, plan)
    if not ours:
        return  # nothing to advertise (an L2-only tap)
    conf = ctx.inv.conf
    name = naming.advertisement_name(conf.vpc, conf.vpcattachment)
    target = naming.route_target(router.local_asn, conf.vpc)
    cid = naming.annotation_cid(ctx.inv.env.container_id)

    def merge(obj: dict[str, Any]) -> bool:
        meta = obj.setdefault("metadata", {})
        annotations = dict(meta.get("annotations") or {})
        _drop_containers(annotations, _stale_containers(annotations, ctx.node, cid))
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
            existing = ctx.client.get(ADVERTISEMENTS, name, namespace=ctx.namespace,
                                      deadline=deadline)
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
    conf = ctx.inv.conf
    name = naming.advertisement_name(conf.vpc, conf.vpcattachment)
    cid = naming.annotation_cid(ctx.inv.env.container_id)
    for _ in range(MAX_ATTEMPTS):
        current = ctx.client.get(ADVERTISEMENTS, name, namespace=ctx.namespace, deadline=deadline)
        if current is None:
            return
        annotations = dict(current["metadata"].get("annotations") or {})
        if not any(key + cid in annotations for key in CONTAINER_KEYS):
            return
        _drop_containers(annotations, {cid} | _stale_containers(annotations, ctx.node, cid))
        prefixes = prefixes_of(annotations)
        if not prefixes:
            if not may_delete:
                log.info("leaving %s untouched: it would have no prefixes", name)
                return
            meta = current["metadata"]
            if ctx.client.delete(ADVERTISEMENTS, name, namespace=ctx.namespace, deadline=deadline,
                                 uid=meta["uid"], resource_version=meta["resourceVersion"]):
                return
            continue  # changed meanwhile (a concurrent ADD): re-read
        current["metadata"]["annotations"] = annotations
        current["spec"]["prefixes"] = prefixes
        if restore is not None:
            _restore_fields(current["spec"], *restore)
        if ctx.client.put_unless_changed(ADVERTISEMENTS, current, deadline=deadline):
            return
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")


def _restore_fields(spec: dict[str, Any], written: dict[str, Any],
                    before: dict[str, Any]) -> None:
    if any(spec.get(k) != v for k, v in written.items()):
        return  # changed by someone else since: theirs now
    for key, value in before.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value


def instance_vrf_id(ctx: PublishContext, deadline: Deadline) -> int | None:
    """The vrfID of the VPC's BGPVRFInstance on this node; None when it does not exist."""
    name = naming.vrf_instance_name(ctx.inv.conf.vpc, ctx.node)
    instance = ctx.client.get(VRF_INSTANCES, name, namespace=ctx.namespace, deadline=deadline)
    return None if instance is None else _vrf_id(instance)


def advertisement_differences(ctx: PublishContext, plan: Addressing,
                              deadline: Deadline) -> list[str]:
    """What CHECK finds wrong with this container's BGP state."""
    conf = ctx.inv.conf
    ours = container_annotations(ctx, plan)
    diffs: list[str] = []
    instance_name = naming.vrf_instance_name(conf.vpc, ctx.node)
    instance = ctx.client.get(VRF_INSTANCES, instance_name, namespace=ctx.namespace,
                              deadline=deadline)
    if instance is None:
        diffs.append(f"BGPVRFInstance {instance_name!r} is missing")
    if not ours:
        return diffs
    name = naming.advertisement_name(conf.vpc, conf.vpcattachment)
    adv = ctx.client.get(ADVERTISEMENTS, name, namespace=ctx.namespace, deadline=deadline)
    if adv is None:
        return [*diffs, f"BGPAdvertisement {name!r} is missing"]
    annotations = adv["metadata"].get("annotations") or {}
    for key, value in ours.items():
        if key.startswith(NODE_KEY):
            continue
        if annotations.get(key) != value:
            diffs.append(f"BGPAdvertisement {name!r} annotation {key} is "
                         f"{annotations.get(key)!r}, expected {value!r}")
    advertised = set(adv.get("spec", {}).get("prefixes") or [])
    for prefix in prefixes_of(ours):
        if prefix not in advertised:
            diffs.append(f"BGPAdvertisement {name!r} does not advertise {prefix}")
    if instance is not None and _vrf_id(adv) != _vrf_id(instance):
        diffs.append(f"BGPAdvertisement {name!r} has vrfID {_vrf_id(adv)}, "
                     f"instance says {_vrf_id(instance)}")
    return diffs
