"""The agent's warm cluster source: keep-alive API clients pooled across verb threads, and
watch caches (`kube/watch.py`) of this node's BGPRouters, its router's BGPVRFInstances and its
Pods, and of every VPCBinding and namespace (so an ADD does not ask the API server what it can
know already), each started by an explicit `watch_*`; `WarmSession`: one verb's pooled client
and cache reads."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Protocol

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, ApiObserver, KubeClient, Resource
from cni_plugin.kube.config import KubeCredentials, load_kubeconfig
from cni_plugin.kube.kinds import BINDINGS, NAMESPACES, PODS
from cni_plugin.kube.watch import WatchCache
from cni_plugin.kubevirt.cutovers import MigrationCutovers
from cni_plugin.publish.bgp.spec import recorded_containers
from cni_plugin.publish.resources import ADVERTISEMENTS, ROUTERS, VRF_INSTANCES
from netconf.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)
# Idle API clients kept per kubeconfig: about the verbs that publish at once.
MAX_IDLE_CLIENTS = 16  # at shutdown; what is left is swept by the next agent or a GC
# An ADD waits at most this long (within its deadline) for the tenancy caches' first sync.
TENANCY_SYNC_SECONDS = 5.0
PRIME_LIST_SECONDS = 30.0  # the start-up listing of BGPAdvertisements (no ADD waits on it)


class PodListener(Protocol):
    """What hears the Pod watch (the node's migration cut-overs)."""

    def pods_listed(self, pods: list[dict[str, Any]]) -> None:
        """Every (re)listing."""

    def pod_changed(self, pod: dict[str, Any]) -> None:
        """An added or modified Pod."""


class CachedTenancy:
    """A `TenancyView` over the agent's watches of VPCBindings and namespaces."""

    def __init__(self, bindings: WatchCache, namespaces: WatchCache) -> None:
        self._bindings = bindings
        self._namespaces = namespaces

    def bindings(self) -> list[dict[str, Any]] | None:
        """Every VPCBinding (None: the CRD is not installed)."""
        if self._bindings.missing:
            return None
        # Out of sync since `tenancy` checked: nothing admits, and a denial is confirmed
        # against the API server before it is answered.
        return self._bindings.items() or []

    def namespace(self, name: str) -> dict[str, Any] | None:
        """A namespace from the watch."""
        return self._namespaces.get("", name)


class WarmCluster:
    """A `ClusterSource` that outlives one invocation (the agent's)."""

    def __init__(self, api_observer: ApiObserver | None = None) -> None:
        self._observe = api_observer  # the agent's metrics, told about every API request
        self._lock = threading.Lock()
        self._creds: dict[str, tuple[float, KubeCredentials]] = {}
        self._idle: dict[str, list[KubeClient]] = {}  # released clients, per kubeconfig
        self._watches: dict[tuple[str, str, str], WatchCache] = {}
        # (kubeconfig, namespace, node): advertisements holding the node's containers, listed once
        self._holders: dict[tuple[str, str, str], frozenset[str]] = {}
        self._cutovers: dict[tuple[str, str], MigrationCutovers] = {}
        # (kubeconfig, route target): targets the cluster's BGPVRFInstance CRD took
        self._fitting: set[tuple[str, str]] = set()

    def _credentials(self, kubeconfig: str) -> KubeCredentials:
        try:
            mtime = os.stat(kubeconfig).st_mtime
        except OSError as exc:  # code 7 as in-process (load_kubeconfig's), never a 199
            raise CniError(INVALID_CONFIG, f"cannot read kubeconfig {kubeconfig!r}",
                           str(exc)) from None
        with self._lock:
            known = self._creds.get(kubeconfig)
            if known is not None and known[0] == mtime:
                return known[1]
        creds = load_kubeconfig(kubeconfig)
        with self._lock:
            self._creds[kubeconfig] = (mtime, creds)
        return creds

    def client(self, kubeconfig: str) -> KubeClient:
        """An idle keep-alive client for kubeconfig, or a new one (each verb runs on a thread
        of its own, so clients are pooled, not per thread); none from an older kubeconfig."""
        creds = self._credentials(kubeconfig)
        stale: list[KubeClient] = []
        found = None
        with self._lock:
            idle = self._idle.get(kubeconfig, [])
            while idle and found is None:
                client = idle.pop()
                if client.creds is creds:
                    found = client
                else:
                    stale.append(client)
        for client in stale:
            client.close()
        return found or KubeClient(creds, self._observe)

    def release(self, kubeconfig: str, client: KubeClient) -> None:
        """Keep the client for the next verb (at most MAX_IDLE_CLIENTS per kubeconfig)."""
        with self._lock:
            current = self._creds.get(kubeconfig)
            idle = self._idle.setdefault(kubeconfig, [])
            if current is not None and client.creds is current[1] and \
                    len(idle) < MAX_IDLE_CLIENTS:
                idle.append(client)
                return
        client.close()

    def _watch(self, kubeconfig: str, resource: Resource, selector: str,
               absent_ok: bool = False, *, namespace: str | None = None,
               listener: PodListener | None = None) -> WatchCache:
        key = (kubeconfig, resource.path(namespace), selector)
        creds = self._credentials(kubeconfig)
        with self._lock:  # created under the lock: racing first uses start one watch, not two
            cache = self._watches.get(key)
            if cache is None:
                cache = self._watches[key] = WatchCache(
                    creds, resource, selector, self._observe, absent_ok, namespace=namespace,
                    on_listed=listener.pods_listed if listener else None,
                    on_changed=listener.pod_changed if listener else None).start()
        return cache

    def holders(self, kubeconfig: str, namespace: str, node: str, client: KubeClient,
                deadline: Deadline) -> frozenset[str] | None:
        """Names of the BGPAdvertisements in namespace that hold containers of node, listed
        once per agent (one request instead of a GET of the shared form on every ADD that
        creates a per-node advertisement). Only this node writes its containers, and this
        version never into the shared form: the set can only shrink, so a name in it is at
        worst read for nothing. None when the list is refused (read each time)."""
        key = (kubeconfig, namespace, node)
        with self._lock:
            known = self._holders.get(key)
        if known is not None:
            return known
        try:
            items = client.list(ADVERTISEMENTS, namespace=namespace, deadline=deadline)
        except ApiError as exc:
            log.info("cannot list BGPAdvertisements in %s (%s): each new advertisement reads "
                     "the shared form first", namespace, exc)
            return None
        found = frozenset(item["metadata"]["name"] for item in items
                          if recorded_containers(item["metadata"].get("annotations") or {}, node))
        with self._lock:
            return self._holders.setdefault(key, found)

    def route_target_fits(self, kubeconfig: str, target: str) -> bool:
        """Whether a verb of this agent found that kubeconfig's cluster's BGPVRFInstance CRD
        takes this route target (a CRD replaced since is caught by the instance's write)."""
        with self._lock:
            return (kubeconfig, target) in self._fitting

    def remember_route_target_fits(self, kubeconfig: str, target: str) -> None:
        """The CRD took this route target: not asked again while the agent runs."""
        with self._lock:
            self._fitting.add((kubeconfig, target))

    def session(self, kubeconfig: str) -> WarmSession:
        """A `WarmSession`: a pooled client and the watch caches for kubeconfig."""
        return WarmSession(self, kubeconfig)

    def prime(self, kubeconfig: str, namespace: str, node: str, lock_dir: str = "") -> None:
        """Start the watches of this node's routers and Pods, and of the VPCBindings and
        namespaces, and list the advertisements holding this node's containers, now, not on
        the first Pod; the migration targets pending under lock_dir are looked after from now
        (those a previous agent left)."""
        self.watch_routers(kubeconfig, namespace, node)
        if lock_dir:
            self.migrations(kubeconfig, node).expect(lock_dir)
        self.watch_pods(kubeconfig, node)
        self.watch_tenancy(kubeconfig)
        threading.Thread(target=self._list_holders, args=(kubeconfig, namespace, node),
                         name="list advertisements", daemon=True).start()

    def _list_holders(self, kubeconfig: str, namespace: str, node: str) -> None:
        """`holders` listed now, not by the first ADD (which lists them itself if this has
        not succeeded by then)."""
        try:
            client = self.client(kubeconfig)
            try:
                self.holders(kubeconfig, namespace, node, client, Deadline(PRIME_LIST_SECONDS))
            finally:
                self.release(kubeconfig, client)
        except Exception as exc:  # best effort: the first ADD lists them itself
            log.info("agent: cannot list BGPAdvertisements yet (the first ADD will): %s", exc)

    def watch_routers(self, kubeconfig: str, namespace: str, node: str) -> WatchCache:
        """The watch of the BGPRouters targeting node (started if it is not yet)."""
        return self._watch(kubeconfig, ROUTERS, f"spec.targetRef.name={node}",
                           namespace=namespace)

    def watch_instances(self, kubeconfig: str, namespace: str, router: str) -> WatchCache:
        """The watch of router's BGPVRFInstances (started if it is not yet)."""
        return self._watch(kubeconfig, VRF_INSTANCES, f"spec.routerRef.name={router}",
                           namespace=namespace)

    def watch_pods(self, kubeconfig: str, node: str) -> WatchCache:
        """The watch of this node's Pods (started if it is not yet), which tells this node's
        migration cut-overs of every Pod it sees change."""
        return self._watch(kubeconfig, PODS, f"spec.nodeName={node}",
                           listener=self.migrations(kubeconfig, node))

    def migrations(self, kubeconfig: str, node: str) -> MigrationCutovers:
        """This node's live-migration targets waiting for KubeVirt's ready mark (made on
        first use)."""
        with self._lock:
            found = self._cutovers.get((kubeconfig, node))
            if found is None:
                found = self._cutovers[(kubeconfig, node)] = MigrationCutovers(
                    self, kubeconfig, node)
        return found

    def expect_migration_targets(self, kubeconfig: str, node: str, lock_dir: str) -> None:
        """A migration target is pending under lock_dir (KubeVirt's `MigrationTargets`): the
        Pod watch cuts it over on KubeVirt's ready mark (checked once now too, in case it came
        already)."""
        self.watch_pods(kubeconfig, node)
        self.migrations(kubeconfig, node).expect(lock_dir)

    def watch_tenancy(self, kubeconfig: str) -> tuple[WatchCache, WatchCache]:
        """The watches of every VPCBinding and every namespace (started if they are not yet)."""
        return (self._watch(kubeconfig, BINDINGS, "", absent_ok=True),
                self._watch(kubeconfig, NAMESPACES, ""))

    def tenancy(self, kubeconfig: str, deadline: Deadline) -> CachedTenancy:
        """The VPCBindings and namespaces from their watches (started on first use), once in
        sync; code 11 when they are not in sync within the deadline (never a guess)."""
        caches = self.watch_tenancy(kubeconfig)
        for cache in caches:
            if not cache.wait_synced(min(deadline.remaining(floor=0), TENANCY_SYNC_SECONDS)):
                raise CniError(TRY_AGAIN_LATER, "Kubernetes API unavailable to the node "
                               f"agent's watch of {cache.describe()}: not in sync",
                               f"{cache.problem}; VPCBindings are checked from it, never "
                               "guessed: the runtime retries")
        return CachedTenancy(*caches)

    def kubeconfigs(self) -> list[str]:
        """The kubeconfigs verbs have used (readiness asks the API server with each)."""
        with self._lock:
            return sorted({*self._creds, *(key[0] for key in self._watches)})

    def unsynced(self) -> list[str]:
        """The watches whose cache is not in sync with the API server now (a watch a verb
        started moments ago and still on its first list is not one of them)."""
        with self._lock:
            caches = list(self._watches.values())
        return [cache.describe() for cache in caches
                if cache.items() is None and not cache.first_listing()]

    def close(self) -> None:
        """Close idle clients, stop every watch."""
        with self._lock:
            idle = [client for clients in self._idle.values() for client in clients]
            self._idle.clear()
        for client in idle:
            client.close()
        with self._lock:
            for cache in self._watches.values():
                cache.stop()


class WarmSession:
    """One verb's session of a `WarmCluster`: a pooled client borrowed on first use, and the
    watch caches (each started on first use, so the next verb finds it in sync)."""

    def __init__(self, cluster: WarmCluster, kubeconfig: str) -> None:
        self._cluster = cluster
        self._kubeconfig = kubeconfig
        self._client: KubeClient | None = None
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}

    def client(self) -> KubeClient:
        """The borrowed client."""
        if self._client is None:
            self._client = self._cluster.client(self._kubeconfig)
        return self._client

    def routers(self, namespace: str, node: str) -> list[dict[str, Any]] | None:
        """This node's routers from their watch. Once it knows the node's router, the watch of
        that router's VRF instances is started too, so the next ADD finds it in sync (STATUS,
        polled every few seconds, asks for routers)."""
        found = self._cluster.watch_routers(self._kubeconfig, namespace, node).items()
        for router in found or []:
            self._cluster.watch_instances(self._kubeconfig, namespace, router["metadata"]["name"])
        return found

    def instances(self, namespace: str, router: str) -> list[dict[str, Any]] | None:
        """The router's VRF instances from their watch."""
        return self._cluster.watch_instances(self._kubeconfig, namespace, router).items()

    def pod(self, node: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Pod from the watch of this node's Pods, else as this verb read it."""
        cached = self._cluster.watch_pods(self._kubeconfig, node).get(namespace, name)
        return cached if cached is not None else self._pods.get((namespace, name))

    def remember_pod(self, pod: dict[str, Any]) -> None:
        """Kept for this verb only (the watch had not seen it yet)."""
        meta = pod.get("metadata") or {}
        self._pods[(str(meta.get("namespace")), str(meta.get("name")))] = pod

    def advertisements_holding(self, namespace: str, node: str,
                               deadline: Deadline) -> frozenset[str] | None:
        """The agent's one listing of the advertisements holding node's containers."""
        return self._cluster.holders(self._kubeconfig, namespace, node, self.client(), deadline)

    def route_target_fits(self, target: str) -> bool:
        """Known to fit from an earlier verb of this agent."""
        return self._cluster.route_target_fits(self._kubeconfig, target)

    def remember_route_target_fits(self, target: str) -> None:
        """Kept by the agent."""
        self._cluster.remember_route_target_fits(self._kubeconfig, target)

    def close(self) -> None:
        """Hand the client back to the pool."""
        if self._client is not None:
            self._cluster.release(self._kubeconfig, self._client)
            self._client = None
