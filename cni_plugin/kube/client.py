"""The one HTTP client for the API server: requests with per-request timeouts and retries
inside a deadline, and watches (used by the verbs and by the agent's caches alike).

Transient failures (connection errors, timeouts, 429, 5xx) are retried with backoff until the
invocation's deadline, then answered as code 11. Other API errors raise `ApiError` with the
status, so callers decide what a 404 or a 409 means for them; whatever they leave becomes a CNI
error in one place, `api_failure`.
"""

from __future__ import annotations

import copy
import http.client
import json
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.config import KubeCredentials
from netconf.errors import PUBLISH_FAILURE, TRY_AGAIN_LATER, CniError

REQUEST_TIMEOUT_CAP = 10.0
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
NOT_PROCESSED_STATUS = frozenset({429, 503})  # the server says it did not act on the request
CONFLICT_PAUSE_CAP = 0.5  # seconds: longest pause between two conflicting writes
# Every pause between two tries goes through this name, so a test can record the pauses without
# replacing time.sleep for the threads beside it (the VM harness sleeps on one of its own).
pause_between_tries: Callable[[float], None] = time.sleep
# Every object vpc-attach creates records which invocation created it (SPEC §7), so a create
# whose answer was lost can be repeated: its 409 is recognised as our own.
CREATED_BY_ANNOTATION = "vpc-attach.datum.net/created-by"
# Kinds whose create stores nothing (reviews): repeating one is harmless.
UNSTORED_KINDS = frozenset({"SelfSubjectAccessReview"})
DRY_RUN = "All"  # the `dryRun` query of a write the API server validates and does not store
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


# Told about every exchange with the API server: (method, HTTP status or "error", seconds).
# The agent counts them; a watch is reported as method "WATCH" once its answer starts.
ApiObserver = Callable[[str, str, float], None]

_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


class ApiError(Exception):
    """A non-transient error answer of the API server, with what the request was about."""

    def __init__(self, status: int, reason: str, message: str, method: str, path: str,
                 target: Target | None = None, fields: tuple[str, ...] = ()) -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        self.path = path
        self.target = target  # None: a path that names no resource (e.g. /version)
        # The fields its causes name (a 422's details.causes[].field): what was refused, as
        # against an admission policy's denial, which names none.
        self.fields = fields

    def doing(self) -> str:
        """What the request was about, e.g. 'update BGPAdvertisement galactic-system/3e-3e'."""
        if self.target is None:
            return f"{self.method} {self.path}"
        return self.target.describe(self.method)


def api_failure(exc: ApiError, doing: str) -> CniError:
    """The CNI error for an API refusal nobody handled (SPEC §3), naming the object.

    401 is code 11: the plugin's token is rotated by the DaemonSet, so a rejected credential
    is expected to heal (a retried DEL must not be stuck on it); any other refusal is 104."""
    target = exc.doing()
    if exc.status == 401:
        return CniError(TRY_AGAIN_LATER, f"failed to {doing}: {target}: the API server rejected "
                        "the plugin's credentials (token expired or being rotated?)", exc.message)
    hint = " (check the vpc-attach ClusterRole)" if exc.status == 403 else ""
    return CniError(PUBLISH_FAILURE, f"failed to {doing}: {target}: {exc.status} "
                    f"{exc.reason}{hint}", exc.message)


@dataclass(frozen=True)
class Resource:
    """A REST resource: group/version/plural, namespaced or not."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The URL path of the collection, or of one object when name is given."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{urllib.parse.quote(namespace)}"
        base += f"/{self.plural}"
        return base + (f"/{urllib.parse.quote(name)}" if name else "")


@dataclass(frozen=True)
class Target:
    """What a request is about: a resource's collection (in a namespace, if given), or one
    object of it by name, or a subresource of that object (e.g. `status`)."""

    resource: Resource
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    def path(self) -> str:
        """The URL path of the collection, object or subresource."""
        path = self.resource.path(self.namespace, self.name)
        return f"{path}/{self.subresource}" if self.name and self.subresource else path

    def describe(self, method: str) -> str:
        """E.g. 'update BGPAdvertisement galactic-system/3e-3e', 'list Pod',
        'update IPAMClaim vms/vm-a.blue/status'."""
        namespace = self.namespace if self.resource.namespaced else None
        where = "/".join(p for p in (namespace, self.name, self.subresource) if p)
        verb = "list" if method == "GET" and not self.name else _VERBS.get(method, "")
        return " ".join(p for p in (verb, self.resource.kind, where) if p)


class KubeClient:
    """A connection to one API server (reused across requests)."""

    def __init__(self, creds: KubeCredentials, observe: ApiObserver | None = None) -> None:
        self.creds = creds
        self.observe = observe
        parsed = urllib.parse.urlsplit(creds.server)
        self._scheme = parsed.scheme
        self._host = parsed.hostname or "localhost"
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._prefix = parsed.path.rstrip("/")
        self._ssl = creds.ssl_context() if parsed.scheme == "https" else None
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        """Close the keep-alive connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _new_connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._ssl is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = self._new_connection(timeout)
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "vpc-attach"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        token = self.creds.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _once(self, method: str, path: str, body: bytes | None, content_type: str,
              timeout: float) -> tuple[int, bytes, float | None]:
        """(status, body, Retry-After seconds if given) of one exchange."""
        headers = self._headers(content_type if body is not None else None)
        conn = self._connection(timeout)
        began = time.monotonic()
        try:
            conn.request(method, self._prefix + path, body=body, headers=headers)
            response = conn.getresponse()
            answer = response.status, response.read(), _seconds(response.getheader("Retry-After"))
        except BaseException:
            self.close()  # never reuse a connection in an unknown state
            self._observed(method, "error", began)
            raise
        self._observed(method, str(answer[0]), began)
        return answer

    def _observed(self, method: str, code: str, began: float) -> None:
        if self.observe is not None:
            self.observe(method, code, time.monotonic() - began)

    def request(self, method: str, target: Target | str, deadline: Deadline, *,
                body: Any = None, query: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        """Send one request about target (or to a path that names no resource, e.g.
        /version), retrying transient failures until the deadline; parsed JSON back.

        A write is repeated after a lost answer only when repeating it is safe (see
        `repeatable`); Retry-After is honoured when it fits in the deadline."""
        about = target if isinstance(target, Target) else None
        path = target.path() if isinstance(target, Target) else target
        if query:
            path += "?" + urllib.parse.urlencode(query)
        payload = json.dumps(body).encode() if body is not None else None
        safe = repeatable(method, body, query)
        attempt = 0
        last = ""
        while True:
            attempt += 1
            retry_after = None
            try:
                status, data, retry_after = self._once(
                    method, path, payload, content_type,
                    min(deadline.remaining(), REQUEST_TIMEOUT_CAP))
            except (TimeoutError, OSError, http.client.HTTPException, ssl.SSLError) as exc:
                status, data, last = 0, b"", f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                return json.loads(data) if data else None
            if status and status not in TRANSIENT_STATUS:
                raise _api_error(status, data, method, path, about)
            if status:
                last = f"HTTP {status}"
            if not safe and status not in NOT_PROCESSED_STATUS:
                raise CniError(TRY_AGAIN_LATER, f"Kubernetes API: no answer to {method} {path}",
                               f"{last}; not repeated: it may have been applied")
            backoff = min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random() / 2)
            wait = max(backoff, retry_after or 0.0)
            if deadline.remaining(floor=0) <= wait:
                asked = f"; the server asked to retry after {retry_after:g}s" \
                    if retry_after else ""
                raise CniError(TRY_AGAIN_LATER, f"Kubernetes API unavailable: {method} {path}",
                               f"{last} after {attempt} attempt(s) within the deadline{asked}")
            pause_between_tries(wait)

    def watch(self, resource: Resource, query: Mapping[str, str], timeout: float, *,
              namespace: str | None = None) -> Iterator[dict[str, Any]]:
        """Events of a watch (`watch=1` is added) of resource's collection on a connection of
        its own, until the server ends it; any read waits at most timeout. Raises
        ConnectionError on a non-200 answer."""
        path = resource.path(namespace)
        full = f"{self._prefix}{path}?{urllib.parse.urlencode({**query, 'watch': '1'})}"
        conn = self._new_connection(timeout)
        began = time.monotonic()
        try:
            try:
                conn.request("GET", full, headers=self._headers())
                response = conn.getresponse()
            except BaseException:
                self._observed("WATCH", "error", began)
                raise
            self._observed("WATCH", str(response.status), began)
            if response.status != 200:
                raise ConnectionError(f"watch {path} answered HTTP {response.status}")
            while line := response.readline():
                event: dict[str, Any] = json.loads(line)
                yield event
        finally:
            conn.close()

    # Convenience verbs -----------------------------------------------------------------

    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            deadline: Deadline) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            result: dict[str, Any] = self.request("GET", Target(resource, namespace, name),
                                                  deadline)
            return result
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, resource: Resource, *, namespace: str | None = None, deadline: Deadline,
             labels: str | None = None, fields: str | None = None) -> list[dict[str, Any]]:
        """Items of a collection (in namespace, or everywhere), narrowed by label and field
        selectors."""
        query: dict[str, str] = {}
        if labels:
            query["labelSelector"] = labels
        if fields:
            query["fieldSelector"] = fields
        result = self.request("GET", Target(resource, namespace), deadline, query=query)
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    def create(self, resource: Resource, body: dict[str, Any], *,
               namespace: str | None = None, deadline: Deadline,
               dry_run: bool = False) -> Any:
        """POST body to resource's collection (in namespace); the answer. `dry_run`: validated
        and admitted as a create would be, stored nowhere (safe to repeat)."""
        query = {"dryRun": DRY_RUN} if dry_run else None
        return self.request("POST", Target(resource, namespace), deadline, body=body,
                            query=query)

    def put_unless_changed(self, resource: Resource, body: dict[str, Any], *,
                           deadline: Deadline) -> bool:
        """PUT body (named by its metadata); False when the object changed (409) or vanished
        (404) since it was read."""
        meta = body["metadata"]
        return self._unless_changed("PUT", Target(resource, meta.get("namespace"), meta["name"]),
                                    deadline, body)

    def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
               deadline: Deadline, uid: str | None = None,
               resource_version: str | None = None) -> bool:
        """Delete with preconditions; False when it was already gone or preconditions failed."""
        preconditions: dict[str, str] = {}
        if uid:
            preconditions["uid"] = uid
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions}
        return self._unless_changed("DELETE", Target(resource, namespace, name), deadline, body)

    def _unless_changed(self, method: str, target: Target, deadline: Deadline,
                        body: dict[str, Any]) -> bool:
        try:
            self.request(method, target, deadline, body=body)
            return True
        except ApiError as exc:
            if exc.status in (404, 409):  # gone, or a precondition / resourceVersion failed
                return False
            raise


def repeatable(method: str, body: Any, query: Mapping[str, str] | None = None) -> bool:
    """Whether sending this request twice does no harm: reads and dry runs (they change
    nothing); creates that carry CREATED_BY_ANNOTATION (the second one's 409 is recognised) or
    store nothing; updates with a resourceVersion and deletes with preconditions (the second
    one fails cleanly)."""
    if method == "GET" or (query or {}).get("dryRun") == DRY_RUN:
        return True
    if not isinstance(body, dict):
        return False
    meta = body.get("metadata") or {}
    if method == "POST":
        return CREATED_BY_ANNOTATION in (meta.get("annotations") or {}) \
            or body.get("kind") in UNSTORED_KINDS
    if method == "PUT":
        return bool(meta.get("resourceVersion"))
    if method == "DELETE":
        return bool(body.get("preconditions"))
    return False


def _seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds (the HTTP-date form is not used by the API server)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def _api_error(status: int, data: bytes, method: str, path: str,
               target: Target | None) -> ApiError:
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return ApiError(status, "", data[:200].decode(errors="replace"), method, path, target)
    return ApiError(status, str(body.get("reason", "")), str(body.get("message", "")),
                    method, path, target, _cause_fields(body))


def _cause_fields(status: dict[str, Any]) -> tuple[str, ...]:
    """The fields a Status's details.causes name (what a 422 refused), in order."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if not isinstance(causes, list):
        return ()
    return tuple(str(c["field"]) for c in causes if isinstance(c, dict) and c.get("field"))


def update_with_retry(client: KubeClient, resource: Resource, name: str, *,
                      namespace: str | None = None, deadline: Deadline,
                      mutate: Callable[[dict[str, Any]], bool],
                      read: dict[str, Any] | None = None,
                      subresource: str | None = None) -> dict[str, Any] | None:
    """Read-modify-write with re-read on 409 until the deadline; None if the object does not
    exist.

    `mutate` edits the object in place and returns False when nothing needs writing. `read`:
    the object as the caller read it a moment ago, used (a copy) instead of the first GET; the
    PUT carries its resourceVersion, so a stale read costs a conflict and a re-read. Between
    conflicts a short random pause spreads writers that keep colliding (many nodes merging
    into one shared object at once). `subresource` (e.g. "status"): the PUT goes there, so
    only what that subresource owns changes; the object is still read whole."""
    target = Target(resource, namespace, name, subresource)
    conflicts = 0
    first = copy.deepcopy(read) if read is not None else None
    while True:
        current = first or client.get(resource, name, namespace=namespace, deadline=deadline)
        first = None
        if current is None:
            return None
        if not mutate(current):
            return current
        try:
            updated: dict[str, Any] = client.request("PUT", target, deadline, body=current)
            return updated
        except ApiError as exc:
            if exc.status == 404:
                continue  # deleted since it was read: the GET says so
            if exc.status != 409:
                raise
        conflicts += 1
        pause = random.uniform(0, min(CONFLICT_PAUSE_CAP, 0.01 * 2 ** conflicts))
        if deadline.remaining(floor=0) <= pause:
            raise CniError(TRY_AGAIN_LATER, f"too many update conflicts on {target.path()}",
                           f"{conflicts} conflicting writes within the deadline")
        pause_between_tries(pause)
