"""The step object the verbs reach KubeVirt's room through (`kubevirt_steps`,
`api_read_pod_claim` in the room's `__init__`), in its no-op form: what every verb does without
the feature. `kubevirt/steps.py` holds the forms that do something.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cni_plugin.core.request import Invocation
    from cni_plugin.core.rollback import Rollback
    from cni_plugin.ipam.delegate import IpamBackend, PendingAdd
    from cni_plugin.publish.publisher import Unannounced
    from netconf.result import Result


class MigrationTargets(Protocol):
    """Who cuts a recorded migration target over when KubeVirt marks its Pod ready (the agent's
    Pod watch; without an agent, STATUS does)."""

    def expect_migration_targets(self, kubeconfig: str, node: str, lock_dir: str) -> None:
        """A target was recorded under lock_dir on node."""


class KubeVirt:
    """The verbs' KubeVirt steps; this form does nothing (no `allowPersistentIPs`, or an ADD
    whose Pod names no IPAMClaim for this interface)."""

    # ADD ---------------------------------------------------------------------------------

    def start_ipam_add(self, ipam: IpamBackend, inv: Invocation) -> PendingAdd:
        """The IPAM delegate's ADD, started (with the claim: vpc-attach-ipam in-process)."""
        return ipam.start_add(inv.stdin, inv.deadline)

    def api_record_failure(self, pending: PendingAdd) -> None:
        """A claim's failed condition when its allocation failed (before the error ends ADD)."""

    @property
    def announces(self) -> bool:
        """Whether ADD announces the attachment (a migration's target waits for KubeVirt)."""
        return True

    def record_target(self, unannounced: Unannounced | None, rollback: Rollback) -> None:
        """A migration target's record, from what publishing held back (undone by rollback)."""

    def api_record_allocation(self, allocated: Result) -> None:
        """The claim's status after the allocation (last: a claim holding other addresses
        rolls the whole ADD back); a target KubeVirt marked ready already is cut over."""

    # DEL, CHECK, STATUS, GC --------------------------------------------------------------

    def forget_target(self) -> None:
        """DEL: a migration target that never cut over is forgotten."""

    def announced(self) -> bool:
        """CHECK: whether this container is announced (a pending target is not, on purpose)."""
        return True

    def api_status(self) -> None:
        """STATUS: code 50 unless the claims' permissions are there; cut over the ready
        targets (the runtime polls STATUS: without an agent, that is what announces them)."""

    def api_free_gone_claims(self) -> None:
        """GC: free this node's records of IPAMClaims that no longer exist."""

    def forget_targets_except(self, valid: set[tuple[str, str]]) -> None:
        """GC: drop the network's pending targets of containers no longer valid."""
