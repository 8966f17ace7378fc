"""Which Pods hold an IPAMClaim at once, and this Pod's part in a live migration (pure).

KubeVirt runs a VM's source and target virt-launcher Pods side by side during a live migration,
both naming the VM network's claim. As OVN-Kubernetes reads them (`DiscoverLiveMigrationStatus`):
a Pod that completed (phase Succeeded or Failed) holds nothing, two living Pods are source and
target, a third is an unexpected state. Here a Pod being deleted holds nothing either: its DEL
is on the way, and the next Pod must not wait for it to announce. The target is the newer Pod
(OVN-Kubernetes sorts by creation time); of two made in the same second, the one that is not
the claim's `ownerPod` (the Pod that last attached with it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cni_plugin.kube.networks import NETWORKS_ANNOTATION, SelectionError, parse_network_selections

VM_NAME_LABEL = "vm.kubevirt.io/name"  # on every virt-launcher Pod of a VM (virt-controller)
COMPLETED_PHASES = ("Succeeded", "Failed")
MAX_HOLDERS = 2  # a live migration's source and target


@dataclass(frozen=True, order=True)
class Holder:
    """A living Pod that names the claim."""

    created: str  # metadata.creationTimestamp (RFC 3339, so it sorts as text)
    namespace: str
    name: str
    uid: str
    node: str  # spec.nodeName ("" while unscheduled)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} on node {self.node or '(none)'}"


def names_claim(pod: Mapping[str, Any], claim: str) -> bool:
    """Whether any network-selection element of the Pod names the claim (a malformed
    annotation names none)."""
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(NETWORKS_ANNOTATION) or ""
    try:
        selections = parse_network_selections(str(value), str(meta.get("namespace") or ""))
    except SelectionError:
        return False
    return any(s.claim == claim for s in selections)


def living(pod: Mapping[str, Any]) -> bool:
    """Neither completed nor being deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") not in COMPLETED_PHASES


def holders(pods: Iterable[Mapping[str, Any]], claim: str, *, but: str) -> list[Holder]:
    """The living Pods naming the claim, except the one of uid `but`, oldest first."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if str(meta.get("uid") or "") == but or not living(pod) or not names_claim(pod, claim):
            continue
        found.append(Holder(str(meta.get("creationTimestamp") or ""),
                            str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                            str(meta.get("uid") or ""),
                            str((pod.get("spec") or {}).get("nodeName") or "")))
    return sorted(found)


def migration_source(others: list[Holder], pod: Mapping[str, Any],
                     owner_pod: str | None) -> Holder | None:
    """The source this Pod takes the claim over from, when it is a live migration's target:
    exactly one other holder, created before it (KubeVirt makes the target after the source)
    or, made in the same second (the timestamps count seconds), the claim's owner (the Pod
    that attached with the claim last). None: this Pod announces at once (no other holder; a
    newer one, so this is the source attached again; or one that attached nothing yet). More
    than one other holder is refused before (`MAX_HOLDERS`)."""
    if len(others) != 1:
        return None
    other = others[0]
    created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    if other.created < created or (other.created == created and other.name == owner_pod):
        return other
    return None
