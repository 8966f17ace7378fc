"""Where the policy step reads the cluster: the policies of a Pod's namespace first (most ADDs
stop there: no policy selects the Pod), then, only when one does, everything its peers may
name. In-process that is the verb's API client (`ApiPolicyView`); the agent answers from its
watch caches (agent/policies.py)."""

from __future__ import annotations

from typing import Any, Protocol

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, Resource
from cni_plugin.kube.kinds import NAMESPACES, PODS
from cni_plugin.kube.session import ClusterSession
from cni_plugin.policy.compile import Endpoint, World
from cni_plugin.policy.model import MULTI, NETWORK_POLICY, Policy, parse_policy
from cni_plugin.policy.world import build_world
from cni_plugin.publish.resources import ENDPOINT_SLICES, MANAGED_BY, MANAGED_BY_LABEL

MULTI_POLICIES = Resource("k8s.cni.cncf.io", "v1beta1", "multi-networkpolicies", MULTI)
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", NETWORK_POLICY)
ATTACHMENT_DEFINITIONS = Resource("k8s.cni.cncf.io", "v1", "network-attachment-definitions",
                                  "NetworkAttachmentDefinition")
OUR_SLICES = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


class PolicyView(Protocol):
    """What the policy step reads."""

    def pod(self, namespace: str, name: str, deadline: Deadline) -> dict[str, Any] | None:
        """The Pod being attached."""

    def policies(self, namespace: str, network_policy: bool,
                 deadline: Deadline) -> list[Policy]:
        """The namespace's MultiNetworkPolicies (and NetworkPolicies, where the node
        enforces them)."""

    def world(self, policies: list[Policy], local: list[Endpoint], network_policy: bool,
              deadline: Deadline) -> World:
        """Everything the policies' peers may name, with this node's attachments."""


class ApiPolicyView:
    """The view through the verb's session: the Pod as the session knows it (the agent's
    watch, or this verb's one GET, which publishing reuses), the rest asked of its client."""

    def __init__(self, session: ClusterSession, node: str) -> None:
        self._session = session
        self._client = session.client()
        self._node = node

    def pod(self, namespace: str, name: str, deadline: Deadline) -> dict[str, Any] | None:
        """The Pod from the session, else one GET (remembered for the verb's later steps)."""
        found = self._session.pod(self._node, namespace, name)
        if found is None:
            found = self._client.get(PODS, name, namespace=namespace, deadline=deadline)
            if found is not None:
                self._session.remember_pod(found)
        return found

    def policies(self, namespace: str, network_policy: bool,
                 deadline: Deadline) -> list[Policy]:
        """LIST the namespace's policies (no MultiNetworkPolicy CRD: none of that kind)."""
        found = [parse_policy(item, MULTI)
                 for item in self._absent_is_empty(MULTI_POLICIES, namespace, deadline)]
        if network_policy:
            found += [parse_policy(item, NETWORK_POLICY)
                      for item in self._client.list(NETWORK_POLICIES, namespace=namespace,
                                                    deadline=deadline)]
        return found

    def world(self, policies: list[Policy], local: list[Endpoint], network_policy: bool,
              deadline: Deadline) -> World:
        """LIST Pods, namespaces and vpc-attach's EndpointSlices, everywhere."""
        pods = self._client.list(PODS, deadline=deadline)
        namespaces = self._client.list(NAMESPACES, deadline=deadline)
        slices = self._client.list(ENDPOINT_SLICES, deadline=deadline, labels=OUR_SLICES)
        return build_world(policies, pods, namespaces, slices, local, network_policy)

    def _absent_is_empty(self, resource: Resource, namespace: str,
                         deadline: Deadline) -> list[dict[str, Any]]:
        try:
            return self._client.list(resource, namespace=namespace, deadline=deadline)
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise
