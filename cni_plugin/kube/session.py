"""How a verb reaches the cluster: one `VerbCluster` per verb, opened by the verb and handed to
every step that needs the API (tenancy, publishing, IPAM's cluster blocks, KubeVirt's claims),
as lightkube hands one `Client` down. It holds at most one `ClusterSession` of the verb's
kubeconfig (its API client, and what synced watch caches know of this node's BGPRouters, its
router's BGPVRFInstances and its Pods), opened on first use, and reaches tenancy's view of
VPCBindings and namespaces.

The executable uses `ColdCluster` (a fresh client per verb, no caches); the node agent passes
its warm implementation (cni_plugin/agent/warm.py): pooled keep-alive clients and watch caches.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any, Protocol

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import KubeClient
from cni_plugin.kube.config import load_kubeconfig
from netconf.errors import INVALID_CONFIG, CniError

log = logging.getLogger(__name__)


class TenancyView(Protocol):
    """Synced watch caches of every VPCBinding and every namespace."""

    def bindings(self) -> list[dict[str, Any]] | None:
        """Every VPCBinding; None when the VPCBinding CRD is not installed."""

    def namespace(self, name: str) -> dict[str, Any] | None:
        """A namespace, or None when it does not exist."""


class ClusterSession(Protocol):
    """The cluster behind one kubeconfig as one verb sees it, until `close`."""

    def client(self) -> KubeClient:
        """The session's API client (borrowed on first use, used by one thread)."""

    def routers(self, namespace: str, node: str) -> list[dict[str, Any]] | None:
        """BGPRouters targeting node from a synced cache, or None (ask the API)."""

    def instances(self, namespace: str, router: str) -> list[dict[str, Any]] | None:
        """BGPVRFInstances of router from a synced cache, or None (ask the API)."""

    def pod(self, node: str, namespace: str, name: str) -> dict[str, Any] | None:
        """This node's Pod from a synced cache or as this verb read it, or None (ask the
        API)."""

    def remember_pod(self, pod: dict[str, Any]) -> None:
        """Keep a Pod this verb read from the API for the verb's later steps (the IPAMClaim
        step reads the Pod the EndpointSlice step then owns its slice by: one GET)."""

    def advertisements_holding(self, namespace: str, node: str,
                               deadline: Deadline) -> frozenset[str] | None:
        """Names of the BGPAdvertisements in namespace that hold containers of node, from a
        listing the source keeps, or None (not known: read each)."""

    def route_target_fits(self, target: str) -> bool:
        """Whether an earlier verb of this source found that the cluster's BGPVRFInstance CRD
        takes this route target (`remember_route_target_fits`)."""

    def remember_route_target_fits(self, target: str) -> None:
        """The CRD took this route target: later verbs need not ask again (where the source
        outlives one verb)."""

    def close(self) -> None:
        """Done with the client (closed, or kept for the next verb)."""


class ClusterSource(Protocol):
    """Sessions per kubeconfig, and tenancy's caches when the caller keeps them."""

    def session(self, kubeconfig: str) -> ClusterSession:
        """A session for one verb (nothing is read until it is used)."""

    def tenancy(self, kubeconfig: str, deadline: Deadline) -> TenancyView | None:
        """Synced caches of VPCBindings and namespaces (code 11 when they are kept but do not
        sync within the deadline: never a guess), or None when none are kept (ask the API)."""


class ColdSession:
    """A fresh client, no caches."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self._client: KubeClient | None = None
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}

    def _connect(self) -> KubeClient:
        return KubeClient(load_kubeconfig(self.kubeconfig))

    def client(self) -> KubeClient:
        """A new client on first use."""
        if self._client is None:
            self._client = self._connect()
        return self._client

    def routers(self, namespace: str, node: str) -> list[dict[str, Any]] | None:
        """No cache."""
        return None

    def instances(self, namespace: str, router: str) -> list[dict[str, Any]] | None:
        """No cache."""
        return None

    def pod(self, node: str, namespace: str, name: str) -> dict[str, Any] | None:
        """No cache: only a Pod this verb read already."""
        return self._pods.get((namespace, name))

    def remember_pod(self, pod: dict[str, Any]) -> None:
        """Kept for this verb only."""
        meta = pod.get("metadata") or {}
        self._pods[(str(meta.get("namespace")), str(meta.get("name")))] = pod

    def advertisements_holding(self, namespace: str, node: str,
                               deadline: Deadline) -> frozenset[str] | None:
        """Not known: read each."""
        return None

    def route_target_fits(self, target: str) -> bool:
        """Not known: a verb alone asks."""
        return False

    def remember_route_target_fits(self, target: str) -> None:
        """Forgotten with the verb."""

    def close(self) -> None:
        """Close the client, if one was made."""
        if self._client is not None:
            self._client.close()
            self._client = None


class ColdCluster:
    """A fresh client per verb, no caches."""

    def session(self, kubeconfig: str) -> ClusterSession:
        """A `ColdSession`."""
        return ColdSession(kubeconfig)

    def tenancy(self, kubeconfig: str, deadline: Deadline) -> TenancyView | None:
        """No cache."""
        return None


class VerbCluster:
    """One verb's way to the cluster: at most one `ClusterSession` of its source for the verb's
    kubeconfig, opened on first use and closed when the verb ends (after any rollback), so the
    verb borrows one API client and reuses its connection for every step."""

    def __init__(self, source: ClusterSource, kubeconfig: str | None,
                 container_id: str = "") -> None:
        self._source = source  # reached only through this session, so no step opens its own
        self.kubeconfig = kubeconfig
        self._container_id = container_id
        self._session: ClusterSession | None = None

    def session(self) -> ClusterSession:
        """The verb's session (opened now if it is the first use); code 7 without a
        kubeconfig (callers name the setting that needs one first)."""
        if self._session is None:
            if not self.kubeconfig:
                raise CniError(INVALID_CONFIG, "reaching the Kubernetes API needs a kubeconfig")
            # Tests count these lines: one per verb that reaches the API (e2e/test_api_sessions.py).
            log.debug("cluster session opened for container %s", self._container_id)
            self._session = self._source.session(self.kubeconfig)
        return self._session

    def tenancy(self, deadline: Deadline) -> TenancyView | None:
        """The source's synced caches of VPCBindings and namespaces, or None (ask the API)."""
        if not self.kubeconfig:
            return None
        return self._source.tenancy(self.kubeconfig, deadline)

    def close(self) -> None:
        """End the session, if one was opened (its client closed, or back to the pool)."""
        if self._session is not None:
            session, self._session = self._session, None
            session.close()

    def __enter__(self) -> VerbCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
