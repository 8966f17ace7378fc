"""The body of an `events.k8s.io/v1` Event on a Pod, as vpc-attach reports them (SPEC §12)."""

from __future__ import annotations

import datetime
import time
from typing import Any

from cni_plugin.kube.client import Resource

EVENTS = Resource("events.k8s.io", "v1", "events", "Event")
REPORTING_CONTROLLER = "vpc-attach.datum.net/agent"
ACTION = "Attach"
NOTE_LIMIT = 1024  # bytes, the API server's limit on `note`
NAME_LIMIT = 128  # the API server's limit on reportingInstance


def micro_time(seconds: float) -> str:
    """A MicroTime: RFC 3339 in UTC with microseconds."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def truncated(note: str) -> str:
    """note cut to the API server's limit."""
    data = note.encode()
    if len(data) <= NOTE_LIMIT:
        return note
    return data[:NOTE_LIMIT - 3].decode(errors="ignore") + "..."


def pod_event_body(namespace: str, pod: str, uid: str | None, node: str, reason: str,
                   kind: str, note: str) -> dict[str, Any]:
    """A new Event about a Pod (named like client-go's recorder names them)."""
    regarding: dict[str, str] = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                                 "name": pod}
    if uid:
        regarding["uid"] = uid  # `kubectl describe pod` selects Events by it
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{pod}.{time.time_ns():x}", "namespace": namespace},
            "eventTime": micro_time(time.time()), "type": kind, "reason": reason,
            "action": ACTION, "note": truncated(note), "regarding": regarding,
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": node[:NAME_LIMIT]}


def object_event_body(regarding: dict[str, str], node: str, reason: str, kind: str, note: str,
                      action: str) -> dict[str, Any]:
    """A new Event about any namespaced object (`regarding`: apiVersion, kind, namespace, name,
    uid), e.g. a policy the node cannot enforce."""
    namespace = regarding["namespace"]
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{regarding['name']}.{time.time_ns():x}",
                         "namespace": namespace},
            "eventTime": micro_time(time.time()), "type": kind, "reason": reason,
            "action": action, "note": truncated(note), "regarding": regarding,
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": node[:NAME_LIMIT]}
