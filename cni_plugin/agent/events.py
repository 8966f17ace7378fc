"""Kubernetes Events on the Pod (SPEC §12), written by the agent after it answered an ADD.

`VPCAttached` (Normal) after a successful ADD, `VPCAttachFailed` (Warning, with the CNI code)
after a failed one, `VPCAttachDenied` (Warning) when no VPCBinding admitted it (code 106, or
allowed under `tenancy: audit`), `events.k8s.io/v1`, reported by
`vpc-attach.datum.net/agent` on this node. They never delay or fail a verb: answered ADDs are
queued (bounded) and one thread writes them; a write that fails is logged and dropped. The same
Event repeated for a Pod updates that Event's series (a merge patch) instead of creating another
object, as client-go's recorder does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cni_plugin.agent.warm import WarmCluster, WarmSession
from cni_plugin.core.deadline import Deadline
from cni_plugin.dispatch import Outcome
from cni_plugin.kube.client import MERGE_PATCH, ApiError, KubeClient, Target
from cni_plugin.kube.events import EVENTS, micro_time, pod_event_body, truncated
from cni_plugin.kube.kinds import PODS
from netconf.config import lookup_ci
from netconf.errors import TENANCY_DENIED, CniError
from netconf.host import lenient_host_settings

log = logging.getLogger(__name__)
ATTACHED, FAILED, DENIED = "VPCAttached", "VPCAttachFailed", "VPCAttachDenied"
MAX_QUEUED = 1024  # beyond this many unwritten Events (API server down), new ones are dropped
WRITE_SECONDS = 10.0
# A repeat within this long of the last one extends its series; later, a new Event starts.
SERIES_WINDOW_SECONDS = 30 * 60
MAX_SERIES = 4096


@dataclass(frozen=True)
class PodEvent:
    """One Event to write about a Pod."""

    kubeconfig: str
    node: str
    namespace: str
    pod: str
    uid: str | None
    reason: str
    type: str  # Normal | Warning
    note: str

    @property
    def key(self) -> tuple[str, ...]:
        """What makes a repeat of this Event (and so a series)."""
        return (self.kubeconfig, self.namespace, self.pod, self.uid or "", self.reason,
                self.note)


@dataclass
class _Series:
    name: str
    count: int
    last: float = field(default_factory=time.monotonic)


def pod_event(outcome: Outcome) -> PodEvent | None:
    """The Event an answered ADD deserves; None when no Pod is named or no kubeconfig and node
    name are configured. Read from the validated invocation; an ADD that failed before it
    parsed is read leniently from what its request says."""
    inv, request = outcome.invocation, outcome.request
    if inv is not None:
        namespace, pod, uid = inv.pod.namespace, inv.pod.name, inv.pod.uid
        host = inv.host
        what = f"VPC {inv.conf.vpc or '?'} attachment {inv.conf.vpcattachment or '?'}"
    else:
        config = request.readable_config()
        args = {**request.cni_args.pairs, **_config_cni_args(config)}  # args.cni wins
        namespace, pod = args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME")
        uid = args.get("K8S_POD_UID")
        # The config's host settings where the node allows them; the node's own when it
        # refused them (that refusal is what the Event reports).
        host = lenient_host_settings(config, request.environ, request.readable_host_file())
        what = f"VPC {lookup_ci(config, 'vpc') or '?'} attachment " \
               f"{lookup_ci(config, 'vpcattachment') or '?'}"
    if not namespace or not pod or not host.kubeconfig or not host.node_name:
        return None
    ifname = request.environ.get("CNI_IFNAME", "?")
    payload = outcome.payload or {}
    if outcome.status == 0:
        reason, kind = ATTACHED, "Normal"
        addresses = [str(ip.get("address")) for ip in payload.get("ips") or []
                     if isinstance(ip, dict)]
        note = f"{what} attached as {ifname}: {', '.join(addresses) or 'no addresses'}"
    elif outcome.code == TENANCY_DENIED:  # the message names what was refused
        reason, kind = DENIED, "Warning"
        note = f"{outcome.message} ({payload.get('details', '')})"
    else:
        reason, kind = FAILED, "Warning"
        note = f"{what} on {ifname}: ADD failed with CNI error {outcome.code}: {outcome.message}"
    return PodEvent(host.kubeconfig, host.node_name, namespace, pod, uid or None, reason, kind,
                    truncated(note))


def _config_cni_args(config: Mapping[str, Any]) -> dict[str, str]:
    args = lookup_ci(config, "args")
    cni = lookup_ci(args, "cni") if isinstance(args, dict) else None
    return {str(k): str(v) for k, v in cni.items()} if isinstance(cni, dict) else {}


class EventRecorder:
    """The queue of Events to write and the thread writing them."""

    def __init__(self, cluster: WarmCluster, max_queued: int = MAX_QUEUED) -> None:
        self.cluster = cluster
        self.max_queued = max_queued
        self._queue: deque[PodEvent] = deque()
        self._busy = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._series: OrderedDict[tuple[str, ...], _Series] = OrderedDict()  # writer's own
        self._warned: set[str] = set()  # kubeconfigs whose refusal was logged at warning

    def audited(self, event: PodEvent) -> None:
        """An ADD allowed under `tenancy: audit` that no binding admitted: queue its Event."""
        self._queue_event(event)

    def answered(self, outcome: Outcome) -> None:
        """An ADD was answered: queue its Event (never blocks, never raises)."""
        if outcome.command != "ADD":
            return
        try:
            event = pod_event(outcome)
        except Exception:  # a bug here must not touch the verb thread
            log.exception("events: cannot describe an answered ADD")
            return
        if event is not None:
            self._queue_event(event)

    def _queue_event(self, event: PodEvent) -> None:
        with self._cond:
            if len(self._queue) >= self.max_queued:
                log.info("events: %d unwritten; dropping %s for %s/%s", len(self._queue),
                         event.reason, event.namespace, event.pod)
                return
            self._queue.append(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vpc-attach-events",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued Event was written (or given up); whether in time."""
        give_up = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = give_up - time.monotonic()
                if left <= 0:
                    log.info("events: %d not written at shutdown", len(self._queue))
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                event = self._queue.popleft()
                self._busy = True
            try:
                self._write(event)
            except Exception as exc:  # best effort: log, drop, go on with the next
                self._refused(event, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _refused(self, event: PodEvent, exc: Exception) -> None:
        detail = exc.msg if isinstance(exc, CniError) else str(exc)
        if isinstance(exc, ApiError) and exc.status == 403:
            detail += " (grant create and patch on events.events.k8s.io: packaging/rbac)"
        level = logging.DEBUG if event.kubeconfig in self._warned else logging.WARNING
        self._warned.add(event.kubeconfig)
        log.log(level, "events: could not record %s on Pod %s/%s: %s", event.reason,
                event.namespace, event.pod, detail)

    def _write(self, event: PodEvent) -> None:
        with contextlib.closing(self.cluster.session(event.kubeconfig)) as session:
            client = session.client()
            deadline = Deadline(WRITE_SECONDS)
            if not self._extend_series(client, event, deadline):
                self._create(client, session, event, deadline)

    def _extend_series(self, client: KubeClient, event: PodEvent, deadline: Deadline) -> bool:
        """Count a repeat in the existing Event's series; False when there is none to extend."""
        series = self._series.get(event.key)
        if series is None or time.monotonic() - series.last > SERIES_WINDOW_SECONDS:
            return False
        body = {"series": {"count": series.count + 1, "lastObservedTime": micro_time(time.time())}}
        try:
            client.request("PATCH", Target(EVENTS, event.namespace, series.name), deadline,
                           body=body, content_type=MERGE_PATCH)
        except ApiError as exc:
            if exc.status != 404:  # expired (Events live an hour): start a new one
                raise
            del self._series[event.key]
            return False
        series.count += 1
        series.last = time.monotonic()
        self._series.move_to_end(event.key)
        return True

    def _create(self, client: KubeClient, session: WarmSession, event: PodEvent,
                deadline: Deadline) -> None:
        uid = event.uid or self._pod_uid(client, session, event, deadline)
        body = pod_event_body(event.namespace, event.pod, uid, event.node, event.reason,
                              event.type, event.note)
        client.create(EVENTS, body, namespace=event.namespace, deadline=deadline)
        self._series[event.key] = _Series(body["metadata"]["name"], 1)
        while len(self._series) > MAX_SERIES:
            self._series.popitem(last=False)

    def _pod_uid(self, client: KubeClient, session: WarmSession, event: PodEvent,
                 deadline: Deadline) -> str | None:
        """The Pod's UID from the node's Pod cache, else the API (None when it is gone)."""
        pod = session.pod(event.node, event.namespace, event.pod)
        if pod is None:
            with contextlib.suppress(ApiError, CniError):
                pod = client.get(PODS, event.pod, namespace=event.namespace, deadline=deadline)
        uid = ((pod or {}).get("metadata") or {}).get("uid")
        return uid if isinstance(uid, str) else None
