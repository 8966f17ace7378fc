"""Policy inside a VPC (SPEC §17): MultiNetworkPolicy and NetworkPolicy, one compiler for both
(`model`, `compile`, `world`), rendered for where each kind of attachment is enforced: an
nftables table in a veth Pod's netns (`nft`), stateful tc filters on a tap (`tc`), written by
`enforce`; ADD's step (`step`: its no-op form, `steps`: the form that acts), the node's
records of its attachments (`records`), one agent pass (`sync`); which network an attachment
was made from (`networks`), where the step reads the cluster (`source`: the API, or the agent's
caches), what a transport lends the step (`services`). docs/architecture.md, "Policy inside a
VPC", says why there.

This module is ADD's way in, and light: most ADDs (a conflist attachment where the node leaves
NetworkPolicy to another component) stop at the Pod's network and load nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.kinds import PODS
from cni_plugin.policy import records
from cni_plugin.policy.networks import PRIMARY, network_of
from cni_plugin.policy.services import AttachmentFacts, PolicyServices
from cni_plugin.policy.step import NO_POLICY, PolicyStep

if TYPE_CHECKING:
    from cni_plugin.kube.session import ClusterSession


def api_read_policies(services: PolicyServices, session: ClusterSession, node: str, *,
                      lock_dir: str, namespace: str | None, name: str | None, ifname: str,
                      network_policy: bool, multi_network_policy: bool,
                      deadline: Deadline) -> PolicyStep:
    """ADD's policy step: the Pod read through the verb's session (its one GET, which
    publishing reuses), its network, and where a policy can apply the namespace's policies.
    Nothing is read where the node enforces neither kind."""
    if not namespace or not name or not (network_policy or multi_network_policy):
        return NO_POLICY
    pod = _pod(session, node, namespace, name, deadline)
    if pod is None:
        return NO_POLICY
    network = network_of(pod, ifname)
    if network is PRIMARY and not network_policy:
        return NO_POLICY  # NetworkPolicy is another component's on this node
    if network is not PRIMARY and not multi_network_policy:
        return NO_POLICY
    from cni_plugin.policy.steps import Policies  # only now: compiler and enforcement
    return Policies.api_read(services, services.view_for(session, node), pod,
                             lock_dir=lock_dir, network=network, network_policy=network_policy,
                             deadline=deadline)


def _pod(session: ClusterSession, node: str, namespace: str, name: str,
         deadline: Deadline) -> dict[str, Any] | None:
    found = session.pod(node, namespace, name)
    if found is None:
        found = session.client().get(PODS, name, namespace=namespace, deadline=deadline)
        if found is not None:
            session.remember_pod(found)
    return found


def forget(services: PolicyServices, lock_dir: str, container_id: str, ifname: str) -> None:
    """DEL: the attachment's record gone (its rules go with its netns or tap)."""
    records.remove(lock_dir, container_id, ifname)
    if services.enforcer is not None:
        services.enforcer.forget(f"{container_id}/{ifname}")
    if services.changed is not None:
        services.changed()


__all__ = ["NO_POLICY", "AttachmentFacts", "PolicyServices", "PolicyStep", "api_read_policies",
           "forget"]
