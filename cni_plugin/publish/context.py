"""What every publishing step needs: the invocation, an API client, the node and its router."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni_plugin.core.request import Invocation
from cni_plugin.kube.client import ApiError, KubeClient
from netconf.errors import INVALID_CONFIG, PUBLISH_FAILURE, TRY_AGAIN_LATER, CniError


@dataclass
class PublishContext:
    """One invocation's view of the cluster."""

    inv: Invocation
    client: KubeClient
    node: str

    @classmethod
    def open(cls, inv: Invocation) -> PublishContext:
        """Connect with the host's kubeconfig (settings were checked by preflight)."""
        if not inv.host.kubeconfig or not inv.host.node_name:
            raise CniError(INVALID_CONFIG, "publishing needs a node name and a kubeconfig")
        return cls(inv, inv.services.kube_client(inv.host.kubeconfig), inv.host.node_name)

    @property
    def kubeconfig(self) -> str:
        """The kubeconfig path (the key of the services' caches)."""
        return self.inv.host.kubeconfig or ""

    def close(self) -> None:
        """Hand the client back to the services (closed, or kept warm for the next verb)."""
        self.inv.services.release_client(self.kubeconfig, self.client)

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


def api_failure(exc: ApiError, doing: str) -> CniError:
    """A non-transient API refusal as code 104 naming what was being done.

    401 is code 11: the plugin's token is rotated by the DaemonSet, so a rejected credential
    is expected to heal (a retried DEL must not be stuck on it)."""
    if exc.status == 401:
        return CniError(TRY_AGAIN_LATER, f"failed to {doing}: the API server rejected the "
                        "plugin's credentials (token expired or being rotated?)", exc.message)
    hint = " (check the vpc-attach ClusterRole)" if exc.status == 403 else ""
    return CniError(PUBLISH_FAILURE, f"failed to {doing}: {exc.status} {exc.reason}{hint}",
                    exc.message)
