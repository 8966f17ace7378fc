"""Where publishing gets its API clients and its view of this node's BGPRouters and Pods (and
tenancy its view of VPCBindings and namespaces).

The executable uses `ColdCluster` (a fresh client per verb, no caches); the node agent passes
its warm implementation (cni_plugin/agent/warm.py): pooled keep-alive clients and watch caches.
"""

from __future__ import annotations

from typing import Any, Protocol

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import KubeClient
from cni_plugin.kube.config import load_kubeconfig


class TenancyView(Protocol):
    """Synced watch caches of every VPCBinding and every namespace."""

    def bindings(self) -> list[dict[str, Any]] | None:
        """Every VPCBinding; None when the VPCBinding CRD is not installed."""

    def namespace(self, name: str) -> dict[str, Any] | None:
        """A namespace, or None when it does not exist."""


class ClusterSource(Protocol):
    """API clients, and cached objects when the caller keeps a synced watch."""

    def client(self, kubeconfig: str) -> KubeClient:
        """An API client for kubeconfig, used by one thread until `release`."""

    def release(self, kubeconfig: str, client: KubeClient) -> None:
        """Done with a client of `client` (closed, or kept for the next verb)."""

    def routers(self, kubeconfig: str, namespace: str, node: str) -> list[dict[str, Any]] | None:
        """BGPRouters targeting node from a synced cache, or None (ask the API)."""

    def instances(self, kubeconfig: str, namespace: str,
                  router: str) -> list[dict[str, Any]] | None:
        """BGPVRFInstances of router from a synced cache, or None (ask the API)."""

    def pod(self, kubeconfig: str, node: str, namespace: str, name: str) -> dict[str, Any] | None:
        """This node's Pod from a synced cache, or None (ask the API)."""

    def tenancy(self, kubeconfig: str, deadline: Deadline) -> TenancyView | None:
        """Synced caches of VPCBindings and namespaces (code 11 when they are kept but do not
        sync within the deadline: never a guess), or None when none are kept (ask the API)."""


class ColdCluster:
    """A fresh client per verb, no caches."""

    def client(self, kubeconfig: str) -> KubeClient:
        """A new client."""
        return KubeClient(load_kubeconfig(kubeconfig))

    def release(self, kubeconfig: str, client: KubeClient) -> None:
        """Close it."""
        client.close()

    def routers(self, kubeconfig: str, namespace: str, node: str) -> list[dict[str, Any]] | None:
        """No cache."""
        return None

    def instances(self, kubeconfig: str, namespace: str,
                  router: str) -> list[dict[str, Any]] | None:
        """No cache."""
        return None

    def pod(self, kubeconfig: str, node: str, namespace: str, name: str) -> dict[str, Any] | None:
        """No cache."""
        return None

    def tenancy(self, kubeconfig: str, deadline: Deadline) -> TenancyView | None:
        """No cache."""
        return None
