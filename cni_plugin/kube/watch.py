"""A list+watch of one collection kept in memory (`WatchCache`): the engine under the agent's
caches (`agent/warm.py`) and the watches of the rooms that react to the cluster (KubeVirt's
IPAMClaims)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, ApiObserver, KubeClient, Resource, Target
from cni_plugin.kube.config import KubeCredentials
from netconf.errors import CniError

log = logging.getLogger(__name__)
WATCH_SECONDS = 300  # the server ends each watch after this; we resume from the last version
RETRY_SECONDS = 2.0
# A watch a verb has just started is still listing, not out of sync: readiness counts it after this.
FIRST_LIST_GRACE_SECONDS = 10.0


class WatchCache:
    """A list+watch of one collection narrowed by a field selector, kept in memory.

    `items()` is None until the first list succeeded and whenever the watch is broken, so
    callers fall back to asking the API server: a cache is never trusted when stale. With
    `absent_ok`, a collection whose CRD is not installed (404) is in sync and `missing`, and
    is listed again every RETRY_SECONDS until it appears. `on_listed` hears every (re)listing,
    `on_changed` every added or modified object (once the cache holds it) and `on_deleted`
    every deleted object, in the watch's thread (their failures are logged).
    """

    def __init__(self, creds: KubeCredentials, resource: Resource, field_selector: str,
                 observe: ApiObserver | None = None, absent_ok: bool = False, *,
                 namespace: str | None = None, labels: str | None = None,
                 on_listed: Callable[[list[dict[str, Any]]], None] | None = None,
                 on_changed: Callable[[dict[str, Any]], None] | None = None,
                 on_deleted: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._creds = creds
        self._observe = observe
        self._resource = resource
        self._namespace = namespace
        self._path = resource.path(namespace)
        self._selector = field_selector
        self._labels = labels  # a label selector, also narrowing the list and watch
        self._absent_ok = absent_ok
        self._on_listed, self._on_deleted = on_listed, on_deleted
        self._on_changed = on_changed
        self._objects: dict[str, dict[str, Any]] = {}
        self._synced = False
        self.missing = False
        self.problem = "not listed yet"  # why the cache is not in sync, when it is not
        self._in_sync = threading.Event()
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch {self._path}",
                                        daemon=True)

    def start(self) -> WatchCache:
        """Start listing and watching in a thread of its own."""
        self._started = time.monotonic()
        self._thread.start()
        return self

    def first_listing(self) -> bool:
        """Whether it is still on its first list, started moments ago (nothing went wrong)."""
        return not self._in_sync.is_set() and self.problem == "not listed yet" and \
            time.monotonic() - self._started < FIRST_LIST_GRACE_SECONDS

    def items(self) -> list[dict[str, Any]] | None:
        """Current objects, or None when not in sync."""
        with self._lock:
            return list(self._objects.values()) if self._synced else None

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One object by namespace/name (None if absent or not in sync)."""
        with self._lock:
            return self._objects.get(f"{namespace}/{name}") if self._synced else None

    def wait_synced(self, seconds: float) -> bool:
        """Whether the cache is in sync, waiting up to seconds for it."""
        return self._in_sync.wait(max(0.0, seconds)) and self.items() is not None

    def stop(self) -> None:
        """End the watch thread."""
        self._stop.set()

    def describe(self) -> str:
        """What is watched, for a readiness reason."""
        return f"{self._path}?fieldSelector={self._selector}" if self._selector else self._path

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except ApiError as exc:
                if not (self._absent_ok and exc.status == 404):
                    self._interrupted(exc)
                else:  # no CRD: known to be empty, and looked for again in a while
                    with self._lock:
                        self._objects, self._synced, self.missing = {}, True, True
                    self._in_sync.set()
                    self._stop.wait(RETRY_SECONDS)
                    continue
            except Exception as exc:  # any failure: distrust the cache and start over
                self._interrupted(exc)
            self._stop.wait(RETRY_SECONDS)

    def _interrupted(self, exc: Exception) -> None:
        log.info("watch %s interrupted: %s", self.describe(), exc)
        self.problem = exc.msg if isinstance(exc, CniError) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._synced = False
            self._in_sync.clear()

    def _list_and_watch(self) -> None:
        client = KubeClient(self._creds, self._observe)
        query = {"fieldSelector": self._selector} if self._selector else {}
        if self._labels:
            query["labelSelector"] = self._labels
        try:
            listing = client.request("GET", Target(self._resource, self._namespace), Deadline(30),
                                     query=query)
            with self._lock:
                self._objects = {_key(o): o for o in listing.get("items") or []}
                self._synced, self.missing = True, False
                self._in_sync.set()
            if self._on_listed is not None:
                self._hear(self._on_listed, list(listing.get("items") or []))
            version = str(listing["metadata"]["resourceVersion"])
            while not self._stop.is_set():  # each watch resumes where the last one ended
                version = self._watch(client, version)
        finally:
            client.close()

    def _watch(self, client: KubeClient, version: str) -> str:
        """Apply events until the server ends the watch; the last resourceVersion seen."""
        query = {"resourceVersion": version, "timeoutSeconds": str(WATCH_SECONDS),
                 "allowWatchBookmarks": "true"}
        if self._selector:
            query["fieldSelector"] = self._selector
        if self._labels:
            query["labelSelector"] = self._labels
        for event in client.watch(self._resource, query, WATCH_SECONDS + 30,
                                  namespace=self._namespace):
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
        if kind == "DELETED" and self._on_deleted is not None:
            self._hear(self._on_deleted, obj)
        elif kind in ("ADDED", "MODIFIED") and self._on_changed is not None:
            self._hear(self._on_changed, obj)
        return str(version) if version else None

    def _hear(self, listener: Callable[[Any], None], what: Any) -> None:
        try:
            listener(what)
        except Exception:  # a listener's bug must not stop the watch
            log.exception("watch %s: listener failed", self.describe())


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
