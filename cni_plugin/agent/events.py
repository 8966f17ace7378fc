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
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cni_plugin.agent.warm import WarmCluster, WarmSession
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Request
from cni_plugin.kube.client import MERGE_PATCH, ApiError, KubeClient, Target
from cni_plugin.kube.events import EVENTS, micro_time, pod_event_body, truncated
from cni_plugin.publish.resources import PODS
from netconf.config import lookup_ci
from netconf.errors import TENANCY_DENIED, CniError
from netconf.host import HostSettings, resolve_host_settings

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


def pod_event(request: Request, status: int, payload: Mapping[str, Any] | None
              ) -> PodEvent | None:
    """The Event an answered ADD deserves; None when no Pod is named or no kubeconfig and node
    name are configured. Read leniently: a failed ADD's config may not even parse."""
    config = _config(request.stdin)
    args = _cni_args(request.environ.get("CNI_ARGS", ""))
    config_args = lookup_ci(config, "args")
    cni = lookup_ci(config_args, "cni") if isinstance(config_args, dict) else None
    if isinstance(cni, dict):  # config args.cni wins over CNI_ARGS (SPEC §3)
        args.update({str(k): str(v) for k, v in cni.items()})
    namespace, pod = args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME")
    if not namespace or not pod:
        return None
    host = _host(config, request.environ)
    if host is None:
        return None
    if not host.kubeconfig or not host.node_name:
        return None
    ifname = request.environ.get("CNI_IFNAME", "?")
    what = f"VPC {lookup_ci(config, 'vpc') or '?'} attachment " \
           f"{lookup_ci(config, 'vpcattachment') or '?'}"
    if status == 0:
        reason, kind = ATTACHED, "Normal"
        addresses = [str(ip.get("address")) for ip in (payload or {}).get("ips") or []
                     if isinstance(ip, dict)]
        note = f"{what} attached as {ifname}: {', '.join(addresses) or 'no addresses'}"
    elif (payload or {}).get("code") == TENANCY_DENIED:  # the message names what was refused
        reason, kind = DENIED, "Warning"
        note = f"{(payload or {}).get('msg', '')} ({(payload or {}).get('details', '')})"
    else:
        reason, kind = FAILED, "Warning"
        code = (payload or {}).get("code", "?")
        message = (payload or {}).get("msg", "")
        note = f"{what} on {ifname}: ADD failed with CNI error {code}: {message}"
    return PodEvent(host.kubeconfig, host.node_name, namespace, pod,
                    args.get("K8S_POD_UID") or None, reason, kind, truncated(note))


def _host(config: dict[str, Any], environ: Mapping[str, str]) -> HostSettings | None:
    """Whose identity posts the Event: the config's host settings where the node allows them;
    the node's own when it refused them (that refusal is what the Event reports)."""
    for source in (config, {}):
        try:
            return resolve_host_settings(source, environ)
        except CniError:
            continue
    return None


def _config(stdin: bytes) -> dict[str, Any]:
    try:
        config = json.loads(stdin)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return config if isinstance(config, dict) else {}


def _cni_args(text: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in text.split(";") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}


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

    def answered(self, request: Request, status: int, payload: Mapping[str, Any] | None
                 ) -> None:
        """An ADD was answered: queue its Event (never blocks, never raises)."""
        if request.command != "ADD":
            return
        try:
            event = pod_event(request, status, payload)
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
