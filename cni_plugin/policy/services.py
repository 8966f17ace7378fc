"""What a transport lends the policy step (kept apart, and light: every verb's collaborators
name it, and the step's own modules load only where a policy can apply)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cni_plugin.kube.session import ClusterSession
    from cni_plugin.policy.enforce import Enforcer
    from cni_plugin.policy.source import PolicyView


@dataclass(frozen=True)
class PolicyServices:
    """Where the policy step reads (given the verb's session and the node's name; None: the
    API through that session), the `Enforcer` that remembers what was written (None: a fresh
    one per verb, as the executable has), and who hears that the node's attachments changed
    (the agent's keeper)."""

    view: Callable[[ClusterSession, str], PolicyView] | None = None
    enforcer: Enforcer | None = None
    changed: Callable[[], None] | None = None

    def view_for(self, session: ClusterSession, node: str) -> PolicyView:
        """The view for one verb."""
        if self.view is not None:
            return self.view(session, node)
        from cni_plugin.policy.source import ApiPolicyView
        return ApiPolicyView(session, node)

    def enforcer_for_verb(self) -> Enforcer:
        """The shared enforcer, or a fresh one."""
        if self.enforcer is not None:
            return self.enforcer
        from cni_plugin.policy.enforce import Enforcer
        return Enforcer()


@dataclass(frozen=True)
class AttachmentFacts:
    """What the kernel steps made, as the policy step needs it."""

    container_id: str
    ifname: str
    kind: str  # veth or tap
    netns: str
    host_link: str
    vpc: str
    vpcattachment: str
    table: int  # the VPC's table id (a tap's conntrack zone)
    addresses: tuple[str, ...]
    network_name: str  # the CNI network (config name)
