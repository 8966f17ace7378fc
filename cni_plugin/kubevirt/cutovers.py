"""The agent announces this node's live-migration targets the moment KubeVirt marks them ready
(SPEC §16): its watch of the node's Pods tells it of every change; a Pod carrying
`kubevirt.io/migration-target-ready-timestamp` with a pending record here is cut over
(`publish.migration.api_cut_over`: the target announced, then the source withdrawn) on a thread
of its own, so the watch keeps reading. Every (re)listing of the Pods looks at every record, so
a target marked while no agent ran (a restart mid-way) is cut over when the next one starts.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, KubeClient
from cni_plugin.kubevirt import migration
from netconf.errors import CniError

log = logging.getLogger(__name__)
CUT_OVER_SECONDS = 30.0  # one cut-over's API requests; a failed one is tried on the next event
RETRY_SECONDS = 2.0  # a failed cut-over is tried again after this, while its Pod is ready


class PodCache(Protocol):
    """The watch cache of the node's Pods."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Pod, or None (absent, or the cache not in sync)."""


class WarmClients(Protocol):
    """What the cut-overs use of the agent's warm cluster (`WarmCluster`)."""

    def watch_pods(self, kubeconfig: str, node: str) -> PodCache:
        """The node's Pods."""

    def client(self, kubeconfig: str) -> KubeClient:
        """A pooled client."""

    def release(self, kubeconfig: str, client: KubeClient) -> None:
        """The client back to the pool."""


class MigrationCutovers:
    """One node's pending migration targets (under the lockDirs verbs recorded them in)."""

    def __init__(self, cluster: WarmClients, kubeconfig: str, node: str) -> None:
        self._cluster = cluster
        self._kubeconfig = kubeconfig
        self._node = node
        self._lock = threading.Lock()
        self._lock_dirs: set[str] = set()
        self._running = threading.Lock()  # one cut-over pass at a time
        self._again = threading.Event()  # something changed during the pass

    def expect(self, lock_dir: str) -> None:
        """Look after the targets recorded under lock_dir, and look at them now."""
        with self._lock:
            self._lock_dirs.add(lock_dir)
        self._start()

    def pods_listed(self, pods: list[dict[str, Any]]) -> None:
        """The watch (re)listed the node's Pods: any target may be ready."""
        if any(migration.target_ready(pod) for pod in pods):
            self._start()

    def pod_changed(self, pod: dict[str, Any]) -> None:
        """A Pod changed: only one marked ready can be a target to cut over."""
        if migration.target_ready(pod):
            self._start()

    def _start(self) -> None:
        with self._lock:
            if not self._lock_dirs:
                return
        self._again.set()
        threading.Thread(target=self._pass, name="migration cut-over", daemon=True).start()

    def _pass(self) -> None:
        while self._again.is_set():  # also set after the running pass's last look: go again
            if not self._running.acquire(blocking=False):
                return  # the running pass goes round again (`_again` is set)
            try:
                while self._again.is_set():
                    self._again.clear()
                    if not self._cut_over_ready():
                        self._again.wait(RETRY_SECONDS)
                        self._again.set()
            finally:
                self._running.release()

    def _cut_over_ready(self) -> bool:
        """Cut over every ready target; False when one failed (retried) and is still there."""
        pods = self._cluster.watch_pods(self._kubeconfig, self._node)
        with self._lock:
            lock_dirs = sorted(self._lock_dirs)
        client = self._cluster.client(self._kubeconfig)
        try:
            for lock_dir in lock_dirs:
                migration.api_complete_ready(client, lock_dir, Deadline(CUT_OVER_SECONDS),
                                             pods.get)
        except (ApiError, CniError, OSError) as exc:
            log.warning("agent: migration cut-over failed, retried: %s",
                        getattr(exc, "msg", exc))
            return not any(migration.target_ready(pods.get(p.pod_namespace, p.pod_name))
                           for d in lock_dirs for p in migration.pending_targets(d))
        finally:
            self._cluster.release(self._kubeconfig, client)
        return True
