"""What every publishing step needs: the invocation, an API client, the node and its router."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni_plugin.core.request import Invocation
from cni_plugin.kube.client import KubeClient
from cni_plugin.publish.source import ClusterSource


@dataclass
class PublishContext:
    """One invocation's view of the cluster: its client is held until `close`."""

    inv: Invocation
    client: KubeClient
    node: str
    source: ClusterSource
    kubeconfig: str

    @classmethod
    def open(cls, inv: Invocation, source: ClusterSource, kubeconfig: str,
             node: str) -> PublishContext:
        """Borrow a client from source for kubeconfig (settings were checked before)."""
        return cls(inv, source.client(kubeconfig), node, source, kubeconfig)

    def close(self) -> None:
        """Hand the client back to its source."""
        self.source.release(self.kubeconfig, self.client)

    @property
    def namespace(self) -> str:
        """Namespace of the BGP resources."""
        return self.inv.namespace


@dataclass(frozen=True)
class Router:
    """The BGPRouter targeting this node."""

    name: str
    local_asn: int
    srv6_locator: str | None
    node_id: int | None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Router:
        """Read the fields we use."""
        spec = obj.get("spec") or {}
        return cls(obj["metadata"]["name"], int(spec["localASN"]), spec.get("srv6Locator"),
                   spec.get("nodeID"))
