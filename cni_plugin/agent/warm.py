"""The agent's warm cluster source: keep-alive API clients pooled across verb threads, and
watch caches of this node's BGPRouters, its router's BGPVRFInstances and its Pods (so an ADD
does not ask the API server what it can know already)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiObserver, KubeClient
from cni_plugin.kube.config import KubeCredentials, load_kubeconfig
from cni_plugin.publish.resources import PODS, ROUTERS, VRF_INSTANCES

log = logging.getLogger(__name__)
WATCH_SECONDS = 300  # the server ends each watch after this; we resume from the last version
RETRY_SECONDS = 2.0
# Idle API clients kept per kubeconfig: about the verbs that publish at once.
MAX_IDLE_CLIENTS = 16  # at shutdown; what is left is swept by the next agent or a GC


class WatchCache:
    """A list+watch of one collection narrowed by a field selector, kept in memory.

    `items()` is None until the first list succeeded and whenever the watch is broken, so
    callers fall back to asking the API server: a cache is never trusted when stale.
    """

    def __init__(self, creds: KubeCredentials, path: str, field_selector: str,
                 observe: ApiObserver | None = None) -> None:
        self._creds = creds
        self._observe = observe
        self._path = path
        self._selector = field_selector
        self._objects: dict[str, dict[str, Any]] = {}
        self._synced = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch {path}", daemon=True)

    def start(self) -> WatchCache:
        """Start listing and watching in a thread of its own."""
        self._thread.start()
        return self

    def items(self) -> list[dict[str, Any]] | None:
        """Current objects, or None when not in sync."""
        with self._lock:
            return list(self._objects.values()) if self._synced else None

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One object by namespace/name (None if absent or not in sync)."""
        with self._lock:
            return self._objects.get(f"{namespace}/{name}") if self._synced else None

    def stop(self) -> None:
        """End the watch thread."""
        self._stop.set()

    def describe(self) -> str:
        """What is watched, for a readiness reason."""
        return f"{self._path}?fieldSelector={self._selector}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except Exception as exc:  # any failure: distrust the cache and start over
                log.info("watch %s?%s interrupted: %s", self._path, self._selector, exc)
            with self._lock:
                self._synced = False
            self._stop.wait(RETRY_SECONDS)

    def _list_and_watch(self) -> None:
        client = KubeClient(self._creds, self._observe)
        try:
            listing = client.request("GET", self._path, Deadline(30),
                                     query={"fieldSelector": self._selector})
            with self._lock:
                self._objects = {_key(o): o for o in listing.get("items") or []}
                self._synced = True
            version = str(listing["metadata"]["resourceVersion"])
            while not self._stop.is_set():  # each watch resumes where the last one ended
                version = self._watch(client, version)
        finally:
            client.close()

    def _watch(self, client: KubeClient, version: str) -> str:
        """Apply events until the server ends the watch; the last resourceVersion seen."""
        query = {"resourceVersion": version, "fieldSelector": self._selector,
                 "timeoutSeconds": str(WATCH_SECONDS), "allowWatchBookmarks": "true"}
        for event in client.watch(self._path, query, WATCH_SECONDS + 30):
            if self._stop.is_set():
                break
            version = self._apply(event) or version
        return version

    def _apply(self, event: dict[str, Any]) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # e.g. 410 Gone: our version is too old; re-list
            raise ConnectionError(f"watch error: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind != "BOOKMARK":
            with self._lock:
                if kind == "DELETED":
                    self._objects.pop(_key(obj), None)
                else:
                    self._objects[_key(obj)] = obj
        return str(version) if version else None


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class WarmCluster:
    """A `ClusterSource` that outlives one invocation (the agent's)."""

    def __init__(self, api_observer: ApiObserver | None = None) -> None:
        self._observe = api_observer  # the agent's metrics, told about every API request
        self._lock = threading.Lock()
        self._creds: dict[str, tuple[float, KubeCredentials]] = {}
        self._idle: dict[str, list[KubeClient]] = {}  # released clients, per kubeconfig
        self._watches: dict[tuple[str, str, str], WatchCache] = {}

    def _credentials(self, kubeconfig: str) -> KubeCredentials:
        mtime = os.stat(kubeconfig).st_mtime
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

    def _watch(self, kubeconfig: str, path: str, selector: str) -> WatchCache:
        key = (kubeconfig, path, selector)
        creds = self._credentials(kubeconfig)
        with self._lock:  # created under the lock: racing first uses start one watch, not two
            cache = self._watches.get(key)
            if cache is None:
                cache = self._watches[key] = WatchCache(creds, path, selector,
                                                        self._observe).start()
        return cache

    def prime(self, kubeconfig: str, namespace: str, node: str) -> None:
        """Start the watches of this node's routers and Pods now, not on the first Pod."""
        self.routers(kubeconfig, namespace, node)
        self.pod(kubeconfig, node, "", "")

    def kubeconfigs(self) -> list[str]:
        """The kubeconfigs verbs have used (readiness asks the API server with each)."""
        with self._lock:
            return sorted({*self._creds, *(key[0] for key in self._watches)})

    def unsynced(self) -> list[str]:
        """The watches whose cache is not in sync with the API server now."""
        with self._lock:
            caches = list(self._watches.values())
        return [cache.describe() for cache in caches if cache.items() is None]

    def routers(self, kubeconfig: str, namespace: str, node: str) -> list[dict[str, Any]] | None:
        """This node's routers from the watch (started on first use). Once it knows the
        node's router, the watch of that router's VRF instances is started too, so the
        next ADD finds it in sync (STATUS, polled every few seconds, asks for routers)."""
        found = self._watch(kubeconfig, ROUTERS.path(namespace),
                            f"spec.targetRef.name={node}").items()
        for router in found or []:
            self.instances(kubeconfig, namespace, router["metadata"]["name"])
        return found

    def instances(self, kubeconfig: str, namespace: str,
                  router: str) -> list[dict[str, Any]] | None:
        """The router's VRF instances from their watch (started on first use)."""
        return self._watch(kubeconfig, VRF_INSTANCES.path(namespace),
                           f"spec.routerRef.name={router}").items()

    def pod(self, kubeconfig: str, node: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Pod from the watch of this node's Pods (started on first use)."""
        return self._watch(kubeconfig, PODS.path(), f"spec.nodeName={node}").get(namespace, name)

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
