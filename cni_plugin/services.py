"""Long-lived resources a verb may borrow: Kubernetes clients and watch caches.

The executable uses `Services()` — nothing is kept between invocations. The node agent keeps
one `WarmServices` (cni_plugin/agent/warm.py) for its lifetime: a pool of keep-alive API
connections and watch caches of this node's BGPRouter and Pods, and it deletes retired links
after answering (cni_plugin/kernel/links.py).
"""

from __future__ import annotations

from typing import Any

from cni_plugin.kube.client import KubeClient
from cni_plugin.kube.config import load_kubeconfig


class Services:
    """Cold services: a fresh client per call, no caches."""

    # Whether DEL may retire links and leave their deletion to delete_retired_later.
    defers_link_deletion = False

    def kube_client(self, kubeconfig: str) -> KubeClient:
        """An API client for kubeconfig, used by one thread until release_client."""
        return KubeClient(load_kubeconfig(kubeconfig))

    def release_client(self, kubeconfig: str, client: KubeClient) -> None:
        """Done with a client of kube_client (cold services close it)."""
        client.close()

    def cached_routers(self, kubeconfig: str, namespace: str,
                       node: str) -> list[dict[str, Any]] | None:
        """BGPRouters targeting node from a synced watch cache, or None (ask the API)."""
        return None

    def cached_pod(self, kubeconfig: str, node: str, namespace: str,
                   name: str) -> dict[str, Any] | None:
        """This node's Pod from a synced watch cache, or None (ask the API)."""
        return None

    def delete_retired_later(self, name: str) -> None:
        """Delete the retired host link called name after the verb answers (or now)."""
        raise NotImplementedError("only services that defer link deletion retire links")
