"""The Pod's EndpointSlices (SPEC §6): one per (Pod, attachment, address family), owned by
the Pod so the garbage collector removes them with it, deleted by DEL only while they still
record this container (uid + resourceVersion preconditions)."""

from __future__ import annotations

import hashlib
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import CREATED_BY_ANNOTATION
from cni_plugin.kube.kinds import PODS
from cni_plugin.publish.context import PublishContext, create, created_by
from cni_plugin.publish.resources import (
    ATTACHMENT_LABEL,
    CONTAINER_ID_ANNOTATION,
    ENDPOINT_SLICES,
    IFNAME_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SRV6_SID_ANNOTATION,
    TENANT_LABEL,
)
from netconf.errors import PUBLISH_FAILURE, TRY_AGAIN_LATER, CniError

MAX_NAME = 253
FAMILY_SUFFIX = {"IPv6": "ipv6", "IPv4": "ipv4"}
FAMILY_VERSION = {"IPv6": 6, "IPv4": 4}


def slice_name(pod: str, vpc: str, attachment: str, family: str) -> str:
    """{pod}-{hex(vpc)}-{hex(att)}-{ipv6|ipv4}, shortened with a hash if too long."""
    suffix = f"-{naming.hex_id(vpc)}-{naming.hex_id(attachment)}-{FAMILY_SUFFIX[family]}"
    if len(pod) + len(suffix) <= MAX_NAME:
        return pod + suffix
    digest = hashlib.sha256(pod.encode()).hexdigest()[:10]
    return f"{pod[:MAX_NAME - len(suffix) - 11]}-{digest}{suffix}"


def pod_object(ctx: PublishContext, deadline: Deadline) -> dict[str, Any] | None:
    """The verb's Pod: from the session (the agent's cache, or what the verb read already),
    else one GET when it is not there or the cache lags behind a recreated Pod."""
    pod = ctx.inv.pod
    namespace, name = pod.namespace or "", pod.name or ""
    obj = ctx.session.pod(ctx.node, namespace, name)
    if obj is None or (pod.uid and pod.uid != obj["metadata"]["uid"]):
        obj = ctx.client.get(PODS, name, namespace=namespace, deadline=deadline)
    return obj


def _pod_identity(ctx: PublishContext, deadline: Deadline) -> tuple[str, str, str]:
    pod = ctx.inv.pod
    if not pod.namespace or not pod.name:
        raise CniError(PUBLISH_FAILURE, "publishing an EndpointSlice needs the Pod",
                       "K8S_POD_NAMESPACE and K8S_POD_NAME are missing from CNI_ARGS")
    obj = pod_object(ctx, deadline)
    if obj is None:
        raise CniError(PUBLISH_FAILURE, f"Pod {pod.namespace}/{pod.name} does not exist")
    uid = str(obj["metadata"]["uid"])
    if pod.uid and pod.uid != uid:
        raise CniError(PUBLISH_FAILURE, f"Pod {pod.namespace}/{pod.name} was recreated",
                       f"sandbox belongs to uid {pod.uid}, the Pod now has uid {uid}")
    return pod.namespace, pod.name, uid


def _slice_body(ctx: PublishContext, namespace: str, pod: str, uid: str, name: str,
                family: str, address: str, sid: str | None, ready: bool) -> dict[str, Any]:
    conf = ctx.inv.conf
    tenant = naming.tenant_id(conf.vpc, conf.vpcattachment)
    annotations = {TENANT_LABEL: tenant, CONTAINER_ID_ANNOTATION: ctx.inv.env.container_id,
                   IFNAME_ANNOTATION: ctx.inv.env.ifname}
    if sid:
        annotations[SRV6_SID_ANNOTATION] = sid
    labels = {ATTACHMENT_LABEL: tenant, MANAGED_BY_LABEL: MANAGED_BY}
    if family == "IPv6":  # galactic's sidecar takes any slice it selects for an IPv6 backend
        labels[TENANT_LABEL] = tenant
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}],
        },
        "addressType": family,
        "endpoints": [{
            "addresses": [address],
            "conditions": {"ready": ready, "serving": ready},
            "nodeName": ctx.node,
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod, "uid": uid},
        }],
        "ports": [],
    }


def ensure_slices(ctx: PublishContext, addressing: Addressing, sid: str | None, rollback: Rollback,
                  deadline: Deadline, *, ready: bool = True) -> list[str]:
    """Create or refresh a slice per configured family the attachment has an address of (its
    endpoint not ready while a migration target waits for KubeVirt); their names."""
    families = [f for f in ctx.inv.conf.publish.endpoint_slice_families
                if any(a.version == FAMILY_VERSION[f] for a in addressing.workload)]
    if not families:
        return []
    namespace, pod, uid = _pod_identity(ctx, deadline)
    names = []
    conf = ctx.inv.conf
    for family in families:
        address = next(str(a.ip) for a in addressing.workload
                       if a.version == FAMILY_VERSION[family])
        name = slice_name(pod, conf.vpc, conf.vpcattachment, family)
        body = _slice_body(ctx, namespace, pod, uid, name, family, address, sid, ready)
        _write_slice(ctx, namespace, name, body, rollback, deadline)
        names.append(name)
    return names


def _write_slice(ctx: PublishContext, namespace: str, name: str, body: dict[str, Any],
                 rollback: Rollback, deadline: Deadline) -> None:
    def undo(found: dict[str, Any], d: Deadline) -> None:
        ctx.client.delete(ENDPOINT_SLICES, name, namespace=namespace, deadline=d,
                          uid=found["metadata"]["uid"])

    fresh = True  # a new Pod's slice does not exist yet: create it without reading first
    for _ in range(10):
        existing = None if fresh else ctx.client.get(ENDPOINT_SLICES, name, namespace=namespace,
                                                     deadline=deadline)
        fresh = False
        if existing is None:
            if create(ctx, ENDPOINT_SLICES, body, rollback, undo, deadline) is not None:
                return
            continue  # someone else's: check it is ours to update
        labels = existing["metadata"].get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
            raise CniError(PUBLISH_FAILURE, f"EndpointSlice {namespace}/{name} exists and is not "
                           f"managed by {MANAGED_BY}", f"its {MANAGED_BY_LABEL} label is "
                           f"{labels.get(MANAGED_BY_LABEL)!r}; it is left untouched")
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        mark = created_by(existing)
        if mark is not None:  # who created it stays recorded (SPEC §7)
            body["metadata"]["annotations"][CREATED_BY_ANNOTATION] = mark
        if ctx.client.put_unless_changed(ENDPOINT_SLICES, body, deadline=deadline):
            return
    raise CniError(TRY_AGAIN_LATER, f"EndpointSlice {namespace}/{name} keeps changing",
                   "too many write conflicts; retry")


def delete_slices(ctx: PublishContext, deadline: Deadline) -> None:
    """Delete this container's slices; a slice recreated for a new Pod is left alone."""
    pod = ctx.inv.pod
    if not pod.namespace or not pod.name:
        return
    conf = ctx.inv.conf
    for family in FAMILY_SUFFIX:
        name = slice_name(pod.name, conf.vpc, conf.vpcattachment, family)
        existing = ctx.client.get(ENDPOINT_SLICES, name, namespace=pod.namespace,
                                  deadline=deadline)
        if existing is None:
            continue
        meta = existing["metadata"]
        if (meta.get("annotations") or {}).get(CONTAINER_ID_ANNOTATION) != \
                ctx.inv.env.container_id:
            continue
        ctx.client.delete(ENDPOINT_SLICES, name, namespace=pod.namespace, deadline=deadline,
                          uid=meta["uid"], resource_version=meta["resourceVersion"])


def slice_differences(ctx: PublishContext, addressing: Addressing, deadline: Deadline) -> list[str]:
    """What CHECK finds wrong with this container's slices."""
    pod = ctx.inv.pod
    if not pod.namespace or not pod.name:
        return []
    conf = ctx.inv.conf
    diffs = []
    for family in conf.publish.endpoint_slice_families:
        addrs = [str(a.ip) for a in addressing.workload if a.version == FAMILY_VERSION[family]]
        if not addrs:
            continue
        name = slice_name(pod.name, conf.vpc, conf.vpcattachment, family)
        found = ctx.client.get(ENDPOINT_SLICES, name, namespace=pod.namespace, deadline=deadline)
        if found is None:
            diffs.append(f"EndpointSlice {pod.namespace}/{name} is missing")
            continue
        owner = (found["metadata"].get("annotations") or {}).get(CONTAINER_ID_ANNOTATION)
        if owner != ctx.inv.env.container_id:
            diffs.append(f"EndpointSlice {pod.namespace}/{name} belongs to container {owner!r}")
        published = [a for e in found.get("endpoints") or [] for a in e.get("addresses") or []]
        if addrs[0] not in published:
            diffs.append(f"EndpointSlice {pod.namespace}/{name} lacks address {addrs[0]}")
    return diffs


def collect_slices(ctx: PublishContext, valid: set[tuple[str, str]], deadline: Deadline) -> int:
    """Delete this node's slices of this attachment whose container is not valid."""
    conf = ctx.inv.conf
    tenant = naming.tenant_id(conf.vpc, conf.vpcattachment)
    found: dict[str, dict[str, Any]] = {}
    # Older versions labelled IPv4 slices with galactic's label only: both selectors find ours.
    for label in (ATTACHMENT_LABEL, TENANT_LABEL):
        selector = f"{MANAGED_BY_LABEL}={MANAGED_BY},{label}={tenant}"
        for item in ctx.client.list(ENDPOINT_SLICES, deadline=deadline, labels=selector):
            found[item["metadata"]["uid"]] = item
    removed = 0
    for item in found.values():
        meta = item["metadata"]
        annotations = meta.get("annotations") or {}
        owner = (annotations.get(CONTAINER_ID_ANNOTATION, ""),
                 annotations.get(IFNAME_ANNOTATION, ""))
        on_this_node = any(e.get("nodeName") == ctx.node for e in item.get("endpoints") or [])
        if on_this_node and owner not in valid:
            removed += ctx.client.delete(ENDPOINT_SLICES, meta["name"],
                                         namespace=meta["namespace"], deadline=deadline,
                                         uid=meta["uid"],
                                         resource_version=meta["resourceVersion"])
    return removed
