"""Admin access to a test control plane through the official `kubernetes` client.

Independent of the code under test (the plugin's own API client is never used to check what
the plugin did): raw REST paths over a `kubernetes.client.ApiClient` (its configuration, TLS
and connection pool), JSON in and out as dicts, every request with a timeout. The harness
bootstraps clusters with it (manifests, conditions, tokens) and the tests arrange and inspect
the cluster with it (the `kube` fixture).
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, overload

import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

REQUEST_TIMEOUT_S = 10.0
FIELD_MANAGER = "vpc-attach-e2e"
JSON = "application/json"
APPLY_PATCH = "application/apply-patch+yaml"

JsonObject = dict[str, Any]
Query = dict[str, str]
Event = tuple[str, str]  # a watch event as (type, object name)


class WatchFailed(RuntimeError):
    """A watch ended other than by its block's end: an ERROR event, a broken stream, a line
    that is no event."""


class WatchEvents(Sequence[Event]):
    """The events a watch recorded so far, in the API server's order. Reading them raises
    WatchFailed once the watch failed, so a test waiting on them fails at once with the reason
    instead of waiting out its timeout."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.failure: str | None = None
        self._events: list[Event] = []

    def record(self, event: Event) -> None:
        """The reader's: one more event."""
        self._events.append(event)

    def _readable(self) -> list[Event]:
        if self.failure is not None:
            raise WatchFailed(f"the watch of {self.path} failed: {self.failure}")
        return self._events

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        return self._readable()[index]

    def __len__(self) -> int:
        return len(self._readable())

    def __repr__(self) -> str:
        return repr(self._events) + (f" (failed: {self.failure})" if self.failure else "")


class ApiError(RuntimeError):
    """A non-2xx answer: the HTTP status and the message of the API server's Status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        self.message = _status_message(body)
        super().__init__(f"{method} {path}: HTTP {status}: {self.message[:500]}")


class Kube:
    """One API server, one identity (client certificate, bearer token, or none)."""

    def __init__(self, configuration: Configuration, token: str | None = None,
                 timeout: float = REQUEST_TIMEOUT_S) -> None:
        self._api = ApiClient(configuration)
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self._resources: dict[str, dict[str, tuple[str, bool]]] = {}

    @classmethod
    def with_certificate(cls, server: str, ca_file: Path, cert_file: Path,
                         key_file: Path) -> Kube:
        """Authenticated by a client certificate (the cluster admin's)."""
        configuration = _configuration(server, ca_file)
        configuration.cert_file = str(cert_file)
        configuration.key_file = str(key_file)
        return cls(configuration)

    @classmethod
    def with_token(cls, server: str, ca_file: Path, token: str) -> Kube:
        """Authenticated by a bearer token only (a ServiceAccount's)."""
        return cls(_configuration(server, ca_file), token=token)

    @classmethod
    def anonymous(cls, server: str, ca_file: Path) -> Kube:
        """No credentials: for health endpoints that are always allowed."""
        return cls(_configuration(server, ca_file))

    def close(self) -> None:
        """Close the pooled connections."""
        self._api.rest_client.pool_manager.clear()

    def __enter__(self) -> Kube:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # Requests --------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: JsonObject | None = None, *,
                query: Query | None = None, content_type: str = JSON) -> JsonObject:
        """Send one request; the decoded JSON answer, or ApiError for a non-2xx status."""
        status, text = self._send(method, path, body, query, content_type)
        if not 200 <= status < 300:
            raise ApiError(method, path, status, text)
        if not text:
            return {}
        decoded: JsonObject = json.loads(text)
        return decoded

    def get_text(self, path: str) -> tuple[int, str]:
        """GET a non-JSON endpoint such as /readyz: (status, body), whatever the status."""
        return self._send("GET", path, None, None, None)

    def get(self, path: str) -> JsonObject | None:
        """An object, or None when there is none."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, body: JsonObject, *, dry_run: bool = False) -> JsonObject:
        """POST to a collection (with dry_run, validated and admitted, never persisted)."""
        return self.request("POST", path, body, query=_dry_run(dry_run))

    def put(self, path: str, body: JsonObject, *, dry_run: bool = False) -> JsonObject:
        """PUT (replace) an object."""
        return self.request("PUT", path, body, query=_dry_run(dry_run))

    def delete(self, path: str, *, grace_period_seconds: int | None = None) -> bool:
        """DELETE an object; False when it was not there."""
        query = None if grace_period_seconds is None else \
            {"gracePeriodSeconds": str(grace_period_seconds)}
        try:
            self.request("DELETE", path, query=query)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list(self, path: str, labels: str | None = None,
             fields: str | None = None) -> list[JsonObject]:
        """The items of a collection, narrowed by label and field selectors."""
        query = {}
        if labels is not None:
            query["labelSelector"] = labels
        if fields is not None:
            query["fieldSelector"] = fields
        items: list[JsonObject] = self.request("GET", path, query=query).get("items") or []
        return items

    @contextlib.contextmanager
    def watching(self, path: str, window_s: float = 120.0) -> Iterator[WatchEvents]:
        """Record a collection's watch events from now on, in the API server's order, as
        (type, name) pairs appended while the block runs (at most ``window_s``); a test waits
        on their content, never on time. A watch that fails before the block ends makes
        reading them raise (WatchFailed); its stream cut by the block's end does not."""
        listing = self.request("GET", path, query={"limit": "1"})
        query = urllib.parse.urlencode({
            "watch": "1", "resourceVersion": listing["metadata"]["resourceVersion"],
            "timeoutSeconds": str(int(window_s)), "allowWatchBookmarks": "false"})
        headers = {**self._auth, "Accept": JSON}
        response = self._api.rest_client.pool_manager.request(
            "GET", f"{self._api.configuration.host}{path}?{query}", headers=headers,
            preload_content=False, timeout=urllib3.Timeout(connect=self.timeout,
                                                           read=window_s + self.timeout))
        if response.status != 200:
            raise ApiError("GET", path, response.status, response.read().decode())
        events = WatchEvents(path)
        ended = threading.Event()  # set when the block ends: the stream is cut on purpose

        def read() -> None:
            try:
                buffer = b""
                for chunk in response.stream(4096):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in filter(None, lines):
                        events.record(watch_event(line))
            except Exception as exc:  # any failure is recorded, and raised to the reader
                if not ended.is_set():
                    events.failure = f"{type(exc).__name__}: {exc}"
                return
            if not ended.is_set():  # the API server closed it (its window ran out)
                events.failure = f"the API server ended the watch within {window_s:.0f} s"

        reader = threading.Thread(target=read, name="watch recorder", daemon=True)
        reader.start()
        try:
            yield events
        finally:
            ended.set()
            if reader.is_alive():
                # Its stream is cut; one that ended meanwhile went back to the pool already.
                with contextlib.suppress(RuntimeError):
                    response.shutdown()
            reader.join(self.timeout)
            response.close()

    def apply(self, manifest: JsonObject, *, dry_run: bool = False,
              field_manager: str = FIELD_MANAGER) -> JsonObject:
        """Server-side apply a manifest (create or update, idempotent)."""
        query = {**_dry_run(dry_run), "fieldManager": field_manager, "force": "true"}
        return self.request("PATCH", self.object_path(manifest), manifest, query=query,
                            content_type=APPLY_PATCH)

    def object_path(self, manifest: JsonObject, namespace_default: str = "default") -> str:
        """The REST path of the object a manifest describes (its resource found by discovery)."""
        api_version = manifest["apiVersion"]
        plural, namespaced = self._resource_for(api_version, manifest["kind"])
        name = urllib.parse.quote(manifest["metadata"]["name"], safe="")
        if namespaced:
            namespace = manifest["metadata"].get("namespace", namespace_default)
            return f"{_group_path(api_version)}/namespaces/{namespace}/{plural}/{name}"
        return f"{_group_path(api_version)}/{plural}/{name}"

    def _resource_for(self, api_version: str, kind: str) -> tuple[str, bool]:
        resources = self._resources.get(api_version)
        if resources is None or kind not in resources:
            listing = self.request("GET", _group_path(api_version))
            resources = {
                entry["kind"]: (entry["name"], bool(entry["namespaced"]))
                for entry in listing.get("resources", [])
                if "/" not in entry["name"]  # skip subresources such as pods/status
            }
            self._resources[api_version] = resources
        if kind not in resources:
            raise ApiError("GET", _group_path(api_version), 404,
                           f"kind {kind} not served by {api_version}")
        return resources[kind]

    def _send(self, method: str, path: str, body: JsonObject | None, query: Query | None,
              content_type: str | None) -> tuple[int, str]:
        url = self._api.configuration.host + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {**self._api.default_headers, **self._auth}
        if content_type:
            headers.update({"Accept": JSON, "Content-Type": content_type})
        try:
            # ApiClient's REST layer: the same call in every client generation (ApiClient.call_api
            # changed shape in 37), unlike the generated per-resource methods.
            response = self._api.rest_client.request(  # type: ignore[no-untyped-call]  # unannotated
                method, url, headers=headers, body=body, _request_timeout=self.timeout)
        except ApiException as exc:  # clients before 37 raise on a non-2xx status; all on TLS (0)
            if not exc.status:
                raise ConnectionError(f"{method} {path}: {exc}") from exc
            return int(exc.status), str(exc.body or "")
        except urllib3.exceptions.HTTPError as exc:
            raise ConnectionError(f"{method} {path}: {exc}") from exc
        # 37 reads the body on demand; earlier clients have read it already.
        raw: bytes = response.data if response.data is not None else response.response.data
        status: int = response.status
        return status, raw.decode(errors="replace")


def crd_established(kube: Kube, name: str) -> bool:
    """Whether the CustomResourceDefinition `name` has condition Established=True."""
    crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions: Iterable[JsonObject] = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _configuration(server: str, ca_file: Path) -> Configuration:
    configuration = Configuration(host=server)
    configuration.ssl_ca_cert = str(ca_file)  # always verified, never insecure-skip
    return configuration


def _group_path(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def _dry_run(dry_run: bool) -> Query:
    return {"dryRun": "All"} if dry_run else {}


def _status_message(body: str) -> str:
    """The `message` of a Status answer, or the body as it came."""
    try:
        status = json.loads(body)
    except ValueError:
        return body
    message = status.get("message") if isinstance(status, dict) else None
    return str(message) if message else body


def watch_event(line: bytes) -> Event:
    """One line of a watch stream as (type, object name); an ERROR event (the API server's
    Status, e.g. 410 Gone) or a line that is no event raises WatchFailed."""
    try:
        event = json.loads(line)
        kind, obj = event["type"], event["object"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WatchFailed(f"not a watch event ({exc}): {line[:200]!r}") from None
    if kind == "ERROR":
        raise WatchFailed(f"ERROR event: {obj.get('code')} {obj.get('reason')}: "
                          f"{obj.get('message')}")
    return str(kind), str(obj["metadata"]["name"])
