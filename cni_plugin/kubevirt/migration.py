"""A live migration's target attachment (SPEC §16, issue 32 item 4): made by ADD but announced
only once KubeVirt marks the target Pod ready (`kubevirt.io/migration-target-ready-timestamp`,
which virt-controller adds when the domain runs on the target node). Until then it is a pending
record on the target node (what ADD would have merged into this node's BGPAdvertisement, its
EndpointSlices written not ready); the cut-over merges it, withdraws the source container's
annotations from the source node's advertisement, then flips the slices. Who runs it: the
target node's agent on its Pod watch, else STATUS (docs/architecture.md, "Live migration").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.locks import container_lock_path, file_lock
from cni_plugin.core.records import directory_format, mark_directory, write_record
from cni_plugin.kube.client import CREATED_BY_ANNOTATION, ApiError, KubeClient
from cni_plugin.publish.bgp.advertisement import write_or_delete
from cni_plugin.publish.bgp.spec import MAX_ATTEMPTS, drop_containers, prefixes_of
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    CONTAINER_ID_ANNOTATION,
    ENDPOINT_SLICES,
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_KEY,
    SUBNET_V4_KEY,
    SUBNET_V6_KEY,
    VERSION,
)
from netconf.errors import IO_FAILURE, TRY_AGAIN_LATER, CniError
from netconf.formats import check_format

log = logging.getLogger(__name__)
READY_ANNOTATION = "kubevirt.io/migration-target-ready-timestamp"
RECORDS_DIR = "migrations"  # under the host's lockDir: one file per pending target
WHAT = "the pending migration target"


def target_ready(pod: dict[str, Any] | None) -> bool:
    """Whether KubeVirt marked the Pod as the migration target ready for traffic (the
    annotation's presence, as OVN-Kubernetes reads it)."""
    annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(READY_ANNOTATION))


@dataclass(frozen=True)
class MigrationSource:
    """The other living Pod of the IPAMClaim, whose announcement the target takes over."""

    namespace: str
    name: str
    node: str


@dataclass(frozen=True)
class PendingTarget:
    """What the cut-over writes, computed by ADD (no Invocation needed to finish it)."""

    network: str
    container_id: str
    ifname: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    node: str
    bgp_namespace: str
    advertisement: str  # this node's advertisement of the attachment
    annotations: dict[str, str]  # this container's, as ADD would have merged them
    spec: dict[str, Any]  # the advertisement's spec but prefixes (used when creating it)
    owner_references: list[dict[str, Any]]
    created_by: str
    slices: list[str]  # this Pod's EndpointSlices, written not ready
    source: MigrationSource
    source_advertisement: str
    source_slices: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """The record's text."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, path: str = "") -> PendingTarget:
        """A record read back; fields it does not know (a later release's) are left out, a
        newer format refused (code 108)."""
        body = json.loads(text)
        check_format(body, path, WHAT)
        source = {k: v for k, v in body["source"].items() if k in _FIELDS_OF_SOURCE}
        known = {k: v for k, v in body.items() if k in _FIELDS}
        return cls(**{**known, "source": MigrationSource(**source)})

    @property
    def cid(self) -> str:
        """The container as the advertisement's annotation keys name it."""
        return next((key[len(NODE_KEY):] for key in self.annotations
                     if key.startswith(NODE_KEY)), "")

    @property
    def prefixes(self) -> set[str]:
        """What the target announces: the claim's addresses, as prefixes."""
        return set(prefixes_of(self.annotations))


_FIELDS = {f.name for f in fields(PendingTarget)}
_FIELDS_OF_SOURCE = {f.name for f in fields(MigrationSource)}


def record_path(lock_dir: str, container_id: str, ifname: str) -> str:
    """Where the pending target (container, ifname) is recorded."""
    return os.path.join(lock_dir, RECORDS_DIR, f"{container_id}@{ifname}.json")


def write_pending(lock_dir: str, pending: PendingTarget) -> str:
    """Record the pending target (atomically); its path. The record carries no formatVersion:
    the previous release reads it into its dataclass and refuses any key it does not know;
    the directory's marker says its format."""
    path = record_path(lock_dir, pending.container_id, pending.ifname)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot record {WHAT} in {directory!r}",
                       exc.strerror or str(exc)) from None
    mark_directory(directory, WHAT)
    write_record(path, pending.to_json(), WHAT)
    return path


def remove_pending(lock_dir: str, container_id: str, ifname: str) -> None:
    """Forget the pending target (cut over, DEL, rollback)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(lock_dir, container_id, ifname))


def pending_targets(lock_dir: str) -> list[PendingTarget]:
    """Every pending target recorded on this node (unreadable records skipped, logged; code
    108 when a newer release wrote them)."""
    directory = os.path.join(lock_dir, RECORDS_DIR)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    directory_format(directory, WHAT)
    found = []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as handle:
                found.append(PendingTarget.from_json(handle.read(), path))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring unreadable migration record %s: %s", name, exc)
    return found


def api_cut_over(client: KubeClient, pending: PendingTarget, deadline: Deadline) -> None:
    """Announce the target, then withdraw the source's announcement, then mark the target's
    slices ready and the source's not; each step idempotent, so a cut-over interrupted (an
    agent restarted) is simply run again from its record."""
    withdrawn: set[str] = set()
    if pending.annotations:  # BGP published: the advertisements change hands
        _api_merge_target(client, pending, deadline)
        withdrawn = api_withdraw_source(client, pending.bgp_namespace,
                                        pending.source_advertisement, pending.source.node,
                                        pending.prefixes, deadline, keep=pending.cid)
    _api_set_slices_ready(client, pending.pod_namespace, pending.slices, True, deadline,
                          owner=pending.container_id)
    _api_set_slices_ready(client, pending.source.namespace, pending.source_slices, False,
                          deadline, owner=None)
    log.info("migration target %s/%s announced from node %s; source %s/%s withdrawn from "
             "node %s (containers %s)", pending.pod_namespace, pending.pod_name, pending.node,
             pending.source.namespace, pending.source.name, pending.source.node,
             ", ".join(sorted(withdrawn)) or "none")


def _api_merge_target(client: KubeClient, pending: PendingTarget, deadline: Deadline) -> None:
    """This container's annotations merged into the target node's advertisement (created with
    the record's spec, owner and created-by mark when missing)."""
    name, namespace = pending.advertisement, pending.bgp_namespace
    for _ in range(MAX_ATTEMPTS):
        current = client.get(ADVERTISEMENTS, name, namespace=namespace, deadline=deadline)
        if current is None:
            annotations = {**pending.annotations, CREATED_BY_ANNOTATION: pending.created_by}
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPAdvertisement",
                    "metadata": {"name": name, "namespace": namespace,
                                 "annotations": annotations,
                                 "ownerReferences": pending.owner_references},
                    "spec": {**pending.spec, "prefixes": prefixes_of(pending.annotations)}}
            try:
                client.create(ADVERTISEMENTS, body, namespace=namespace, deadline=deadline)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
                continue  # created meanwhile: merge into it
        annotations = dict(current["metadata"].get("annotations") or {})
        if all(annotations.get(k) == v for k, v in pending.annotations.items()):
            return
        annotations.update(pending.annotations)
        current["metadata"]["annotations"] = annotations
        current["spec"]["prefixes"] = prefixes_of(annotations)
        if client.put_unless_changed(ADVERTISEMENTS, current, deadline=deadline):
            return
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")


def source_containers(annotations: dict[str, str], node: str, prefixes: set[str]) -> set[str]:
    """The containers `node` recorded whose every advertised prefix is one of `prefixes` (the
    claim's addresses): the migration source's. A container advertising anything else is
    another Pod's and is never touched."""
    found = set()
    for key, value in annotations.items():
        if not key.startswith(NODE_KEY) or value != node:
            continue
        cid = key[len(NODE_KEY):]
        own = {k: v for k, v in annotations.items()
               if k in (SUBNET_V6_KEY + cid, SUBNET_V4_KEY + cid)}
        advertised = set(prefixes_of(own))
        if advertised and advertised <= prefixes:
            found.add(cid)
    return found


def api_withdraw_source(client: KubeClient, namespace: str, name: str, node: str,
                        prefixes: set[str], deadline: Deadline,
                        keep: str = "") -> set[str]:
    """Drop the source's containers (`source_containers`, never `keep`) from the source node's
    advertisement; delete it when that leaves no prefixes (uid + resourceVersion
    preconditions: a concurrent writer keeps it). The containers dropped."""
    for _ in range(MAX_ATTEMPTS):
        current = client.get(ADVERTISEMENTS, name, namespace=namespace, deadline=deadline)
        if current is None:
            return set()
        meta = current["metadata"]
        annotations = dict(meta.get("annotations") or {})
        gone = source_containers(annotations, node, prefixes) - {keep}
        if not gone:
            return set()
        drop_containers(annotations, gone)
        if write_or_delete(client, namespace, current, annotations, deadline):
            return gone
    raise CniError(TRY_AGAIN_LATER, f"BGPAdvertisement {name!r} keeps changing")


def _api_set_slices_ready(client: KubeClient, namespace: str, names: list[str], ready: bool,
                          deadline: Deadline, owner: str | None) -> None:
    """Set the endpoints' ready and serving conditions of these slices (vpc-attach's only, and
    those of `owner`'s container only, when given)."""
    for name in names:
        for _ in range(MAX_ATTEMPTS):
            found = client.get(ENDPOINT_SLICES, name, namespace=namespace, deadline=deadline)
            if found is None:
                break
            recorded = (found["metadata"].get("annotations") or {}).get(CONTAINER_ID_ANNOTATION)
            labels = found["metadata"].get("labels") or {}
            if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or \
                    (owner is not None and recorded != owner):
                break  # not ours to change (SPEC §6), or another container's now
            endpoints = found.get("endpoints") or []
            if all((e.get("conditions") or {}).get("ready") is ready for e in endpoints):
                break
            for endpoint in endpoints:
                endpoint["conditions"] = {**(endpoint.get("conditions") or {}),
                                          "ready": ready, "serving": ready}
            if client.put_unless_changed(ENDPOINT_SLICES, found, deadline=deadline):
                break


def api_complete_ready(client: KubeClient, lock_dir: str, deadline: Deadline,
                       read_pod: Callable[[str, str], dict[str, Any] | None],
                       network: str | None = None) -> list[PendingTarget]:
    """Cut over every pending target of this node (of `network`, when given) whose Pod is
    marked ready, under the container's lock; a record whose Pod is gone or recreated is left
    to DEL and GC. The ones cut over."""
    done = []
    for pending in pending_targets(lock_dir):
        if network is not None and pending.network != network:
            continue
        pod = read_pod(pending.pod_namespace, pending.pod_name)
        recreated = pending.pod_uid and str(pod["metadata"].get("uid")) != pending.pod_uid \
            if pod is not None else False
        if pod is None or recreated or not target_ready(pod):
            continue
        # Never beside the container's ADD (whose rollback may drop the record) or its DEL.
        with file_lock(container_lock_path(lock_dir, pending.container_id, pending.ifname),
                       deadline.remaining()):
            if not os.path.exists(record_path(lock_dir, pending.container_id, pending.ifname)):
                continue  # rolled back, deleted or cut over meanwhile
            api_cut_over(client, pending, deadline)
            remove_pending(lock_dir, pending.container_id, pending.ifname)
        done.append(pending)
    return done
