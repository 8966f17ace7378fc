"""`vpc-attach doctor`: the live-migration targets on this node waiting for KubeVirt's ready
timestamp (SPEC §16), and any whose Pod is marked ready but was not announced yet."""

from __future__ import annotations

from cni_plugin.core.deadline import Deadline
from cni_plugin.doctor.checks import API_SECONDS, OK, WARN, Finding, Node
from cni_plugin.kube.client import ApiError
from cni_plugin.kube.kinds import PODS
from cni_plugin.publish.migration import PendingTarget, pending_targets, target_ready
from netconf.errors import CniError

SHOWN = 10  # targets listed in one line


def migration_targets(node: Node) -> list[Finding]:
    """The pending targets under the node's lockDir; WARN for one whose Pod KubeVirt marked
    ready (its cut-over is overdue: no agent, or the API refused it)."""
    pending = pending_targets(node.settings.lock_dir)
    if not pending:
        return [Finding("migration.targets", OK,
                        "no live-migration target waits for KubeVirt's ready timestamp here")]
    overdue = [p for p in pending if _marked_ready(node, p)]
    listed = "; ".join(f"{p.pod_namespace}/{p.pod_name} (container {p.container_id[:12]}, "
                       f"source {p.source.namespace}/{p.source.name} on node {p.source.node})"
                       for p in pending[:SHOWN])
    if overdue:
        return [Finding("migration.targets", WARN,
                        f"{len(overdue)} of {len(pending)} live-migration target(s) are marked "
                        f"ready but not announced: {listed}",
                        "the node agent announces them on its Pod watch; without it, run "
                        "STATUS with the VM network's config (docs/operations.md: a VM's live "
                        "migration)")]
    return [Finding("migration.targets", OK, f"{len(pending)} live-migration target(s) wait "
                    f"for KubeVirt's ready timestamp: {listed}")]


def _marked_ready(node: Node, pending: PendingTarget) -> bool:
    if node.client is None:
        return False
    try:
        pod = node.client.get(PODS, pending.pod_name, namespace=pending.pod_namespace,
                              deadline=Deadline(API_SECONDS))
    except (ApiError, CniError):
        return False
    if pod is None or not target_ready(pod):
        return False
    return not pending.pod_uid or str(pod["metadata"].get("uid")) == pending.pod_uid
