"""ADD's policy step where a policy can apply (SPEC §17), the form of `step.PolicyStep` that
acts: the new attachment's rules are in the kernel before it has an address, in-process as
through the agent, so no packet reaches or leaves it unprotected; its record tells the agent to
keep them current afterwards.

`cni_plugin.policy.api_read_policies` decides (light) whether this step is needed and makes it:
the namespace's policies are listed before any kernel change (an API failure then changes
nothing). Only when one selects the Pod does `kernel_install` read what the peers may name.
"""

from __future__ import annotations

import logging

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.policy import records
from cni_plugin.policy.compile import (
    Compiled,
    NetworkRef,
    PodFacts,
    Target,
    World,
    compile_target,
    selecting,
)
from cni_plugin.policy.enforce import Enforced
from cni_plugin.policy.model import Policy
from cni_plugin.policy.networks import PodKey, pod_key
from cni_plugin.policy.records import LocalAttachment
from cni_plugin.policy.services import AttachmentFacts, PolicyServices
from cni_plugin.policy.source import PolicyView
from cni_plugin.policy.step import PolicyStep
from cni_plugin.policy.world import pod_facts

log = logging.getLogger(__name__)


class Policies(PolicyStep):
    """The policy step of one ADD, once it knows the Pod and its namespace's policies."""

    def __init__(self, services: PolicyServices, view: PolicyView, lock_dir: str, pod: PodKey,
                 facts: PodFacts, network: NetworkRef, policies: list[Policy],
                 network_policy: bool) -> None:
        self._services = services
        self._view = view
        self._enforcer = services.enforcer_for_verb()
        self._lock_dir = lock_dir
        self._pod = pod
        self._facts = facts
        self._network = network
        self._policies = policies
        self._network_policy = network_policy

    @classmethod
    def api_read(cls, services: PolicyServices, view: PolicyView, pod: dict[str, object], *,
                 lock_dir: str, network: NetworkRef, network_policy: bool,
                 deadline: Deadline) -> Policies:
        """The step for the Pod's attachment: its namespace's policies listed."""
        key = pod_key(pod)
        return cls(services, view, lock_dir, key, pod_facts(pod), network,
                   view.policies(key.namespace, network_policy, deadline), network_policy)

    def kernel_install(self, facts: AttachmentFacts, rollback: Rollback,
                       deadline: Deadline) -> Enforced:
        """The attachment's rules written and its record kept, both undone by the rollback."""
        attachment = LocalAttachment(
            facts.container_id, facts.ifname, facts.kind, facts.netns, facts.host_link,
            facts.vpc, facts.vpcattachment, facts.table, self._pod, self._network,
            facts.addresses, facts.network_name)
        target = Target(self._pod.namespace, self._pod.name, self._network, facts.vpc)
        compiled = Compiled()  # nothing selects it: whatever an earlier ADD left is removed
        if selecting(self._selection_world(), target):
            local = [a.endpoint() for a in records.read_all(self._lock_dir)
                     if a.key != attachment.key] + [attachment.endpoint()]
            world = self._view.world(self._policies, local, self._network_policy, deadline)
            compiled = compile_target(world, target)
        rollback.created(f"policy rules of {facts.ifname}",
                         lambda _deadline: self._enforcer.forget(attachment.key))
        enforced = self._enforcer.apply(attachment, compiled, deadline)
        if enforced.unenforced:
            log.warning("policy of %s: %s", attachment.describe(), enforced.unenforced)
        rollback.created(f"policy record of {facts.ifname}", lambda _deadline: records.remove(
            self._lock_dir, facts.container_id, facts.ifname))
        records.write(self._lock_dir, attachment)
        if self._services.changed is not None:  # others' rules may name it as a peer
            self._services.changed()
        return enforced

    def _selection_world(self) -> World:
        """Enough of the world to tell whether a policy selects the Pod: its labels."""
        key = (self._pod.namespace, self._pod.name)
        return World(self._policies, {key: self._facts}, {}, (), self._network_policy)
