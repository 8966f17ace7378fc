"""The step object ADD reaches policy's room through (`api_read_policies` in the room's
`__init__`), in its no-op form: what ADD does where no policy can apply (no kubeconfig, an
`existing` interface, a conflist attachment where the node leaves NetworkPolicy to another
component). `policy/steps.py` holds the form that acts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cni_plugin.core.deadline import Deadline
    from cni_plugin.core.rollback import Rollback
    from cni_plugin.policy.enforce import Enforced
    from cni_plugin.policy.services import AttachmentFacts


class PolicyStep:
    """ADD's policy step; this form reads, writes and records nothing."""

    def kernel_install(self, facts: AttachmentFacts, rollback: Rollback,
                       deadline: Deadline) -> Enforced | None:
        """The attachment's rules in place before it has an address (here: none apply)."""
        return None


NO_POLICY = PolicyStep()
