"""`vpc-attach doctor`'s checks of KubeVirt's room (SPEC §16): the IPAMClaims whose addresses
this node holds, the addresses lent to this node for a claim's VM and this node's addresses
lent to others (`ipam.claims`, `ipam.lends.*`), and the live-migration targets waiting for
KubeVirt's ready timestamp (`migration.targets`). A doctor check module: it sits with the
doctor's layer (tests/test_layers.py), in the room whose state it reads."""

from __future__ import annotations

from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.doctor.node import API_SECONDS, FAIL, OK, SKIP, WARN, Finding, Node, host_file_of
from cni_plugin.ipam.plugin import claimed
from cni_plugin.ipam.plugin.block_claims import HELD, LENT_LABEL, node_of
from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS
from cni_plugin.ipam.plugin.lending import BORROWED
from cni_plugin.ipam.plugin.store import BlockRecord, PoolState, Record, pool_directories
from cni_plugin.kube.client import ApiError
from cni_plugin.kube.kinds import PODS
from cni_plugin.kubevirt.migration import PendingTarget, pending_targets, target_ready
from netconf.errors import CniError
from netconf.host import ipam_data_root

SHOWN = 10  # claims, lends or targets listed in one line


def ipam_claims(node: Node) -> list[Finding]:
    """Which claims hold which addresses here (attached to a container or kept for the next
    Pod), which addresses this node borrowed, which of its own it lent out."""
    try:
        root = ipam_data_root(node.environ, host_file_of(node))
    except CniError:
        return []  # reported by host_settings
    findings = [_claims_held(root)]
    borrowed, held = _lends_and_blocks(node)
    findings.extend(_borrowed(node, borrowed))
    findings.extend(_lent_out(node, held))
    return findings


def _claims_held(root: str) -> Finding:
    parts: list[str] = []
    for uid in claimed.uids(root):
        records = [r for path in claimed.pools_of(root, uid)
                   for r in PoolState(path, API_SECONDS).claimed(uid)]
        if not records:
            continue
        addresses = ", ".join(f"{r.name} ({_holder(r)})" for r in records)
        parts.append(f"{records[0].claim}: {addresses}")
    if not parts:
        return Finding("ipam.claims", OK, "no IPAMClaim holds addresses on this node")
    return Finding("ipam.claims", OK, f"{len(parts)} IPAMClaim(s) hold addresses here: "
                   + "; ".join(parts[:SHOWN]), "a claim's addresses are freed when the claim "
                   "is deleted (docs/operations.md: freeing a stuck claim)")


def _holder(record: Record) -> str:
    holder = record.attachment
    return f"attached to {holder.container_id[:12]}/{holder.ifname}" if holder is not None \
        else "kept for the claim's next Pod"


def _lends_and_blocks(node: Node) -> tuple[list[BlockRecord], set[str]]:
    borrowed: list[BlockRecord] = []
    held: set[str] = set()
    for data_dir in dict.fromkeys(node.ipam_data_dirs):
        for _, _, path in pool_directories(data_dir):
            try:
                blocks = PoolState(path, API_SECONDS).blocks()
            except CniError:
                continue  # reported by ipam.blocks
            borrowed.extend(b for b in blocks if b.state == BORROWED)
            held.update(b.name for b in blocks if b.state == HELD)
    return borrowed, held


def _lends(node: Node) -> list[dict[str, Any]] | None:
    if node.client is None:
        return None
    try:
        return node.client.list(IPAM_BLOCKS, deadline=Deadline(API_SECONDS),
                                labels=f"{LENT_LABEL}=true")
    except (CniError, ApiError):
        return None


def _borrowed(node: Node, borrowed: list[BlockRecord]) -> list[Finding]:
    if not borrowed:
        return []
    lends = _lends(node)
    shown = ", ".join(b.cidr for b in borrowed[:SHOWN])
    if lends is None:
        return [Finding("ipam.lends.borrowed", SKIP, f"{len(borrowed)} address(es) borrowed "
                        f"for IPAMClaims: {shown}; the API server is not reachable to compare")]
    by_name = {str(o["metadata"]["name"]): o for o in lends}
    moved = [f"{b.cidr} (now node {node_of(by_name[b.name])!r})" for b in borrowed
             if b.name in by_name and node_of(by_name[b.name]) != node.settings.node_name]
    missing = [b.cidr for b in borrowed if b.name not in by_name]
    findings = [Finding("ipam.lends.borrowed", OK, f"{len(borrowed)} address(es) of other "
                        f"nodes' blocks borrowed for IPAMClaims' VMs: {shown}")]
    if moved or missing:
        findings.append(Finding(
            "ipam.lends.borrowed", WARN, f"{len(moved) + len(missing)} borrowed address(es) "
            f"no longer lent to this node: {', '.join((moved + missing)[:SHOWN])}",
            "the claim's VM runs elsewhere now (or back on the node holding the address); "
            "this node's next GC of the network forgets them (they keep nothing: a node never "
            "allocates in another node's block)"))
    return findings


def _lent_out(node: Node, held: set[str]) -> list[Finding]:
    if not held:
        return []
    lends = _lends(node)
    if lends is None:
        return []
    out = [o for o in lends if (o.get("spec") or {}).get("lentFrom") in held]
    if not out:
        return [Finding("ipam.lends.out", OK, "no address of this node's blocks is lent out")]
    parts = [f"{o['spec']['cidr']} to node {node_of(o)!r} for IPAMClaim {o['spec'].get('claim')}"
             for o in out]
    return [Finding("ipam.lends.out", OK, f"{len(out)} address(es) of this node's blocks lent "
                    f"to other nodes: {'; '.join(parts[:SHOWN])}", "this node keeps each "
                    "claim's record, so it never hands them out")]



def migration_targets(node: Node) -> list[Finding]:
    """The pending targets under the node's lockDir; WARN for one whose Pod KubeVirt marked
    ready (its cut-over is overdue: no agent, or the API refused it)."""
    try:
        pending = pending_targets(node.settings.lock_dir)
    except CniError as exc:  # a newer release's records (code 108): state.formats names them
        return [Finding("migration.targets", FAIL, exc.msg, exc.details)]
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
