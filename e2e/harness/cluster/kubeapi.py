"""A deliberately small Kubernetes API client for bootstrapping the test control plane.

Standard library only (http.client + ssl), every request with a timeout. The tests use the
real `kubernetes` client against the kubeconfigs; this module only has to apply manifests,
wait for conditions and mint a token.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT_S = 10.0
FIELD_MANAGER = "vpc-attach-e2e"

JsonObject = dict[str, Any]


class ApiError(RuntimeError):
    """A non-2xx answer from the API server; carries the status code and the Status body."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")


class KubeApi:
    """HTTPS access to one API server with a client certificate or a bearer token."""

    def __init__(
        self,
        host: str,
        port: int,
        ca_file: Path,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        token: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._token = token
        self._context = ssl.create_default_context(cafile=str(ca_file))
        if cert_file is not None:
            self._context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        self._resources: dict[str, dict[str, tuple[str, bool]]] = {}

    def request(
        self,
        method: str,
        path: str,
        body: JsonObject | None = None,
        content_type: str = "application/json",
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> JsonObject:
        """Send one request; return the decoded JSON answer or raise ApiError."""
        connection = http.client.HTTPSConnection(
            self.host, self.port, context=self._context, timeout=timeout
        )
        headers = {"Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            connection.close()
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, text)
        if not text:
            return {}
        try:
            decoded: JsonObject = json.loads(text)
        except json.JSONDecodeError:
            return {"raw": text}
        return decoded

    def get_text(self, path: str, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, str]:
        """GET a non-JSON endpoint such as /readyz; return (status, body)."""
        connection = http.client.HTTPSConnection(
            self.host, self.port, context=self._context, timeout=timeout
        )
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            connection.close()

    def object_path(self, manifest: JsonObject, namespace_default: str = "default") -> str:
        """The REST path of the object described by ``manifest`` (resolved via discovery)."""
        api_version = manifest["apiVersion"]
        plural, namespaced = self._resource_for(api_version, manifest["kind"])
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        name = urllib.parse.quote(manifest["metadata"]["name"], safe="")
        if namespaced:
            namespace = manifest["metadata"].get("namespace", namespace_default)
            return f"{base}/namespaces/{namespace}/{plural}/{name}"
        return f"{base}/{plural}/{name}"

    def apply(self, manifest: JsonObject) -> JsonObject:
        """Server-side apply ``manifest`` (create or update, idempotent)."""
        path = self.object_path(manifest)
        query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        return self.request(
            "PATCH", f"{path}?{query}", manifest, content_type="application/apply-patch+yaml"
        )

    def _resource_for(self, api_version: str, kind: str) -> tuple[str, bool]:
        resources = self._resources.get(api_version)
        if resources is None or kind not in resources:
            path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            listing = self.request("GET", path)
            resources = {
                entry["kind"]: (entry["name"], bool(entry["namespaced"]))
                for entry in listing.get("resources", [])
                if "/" not in entry["name"]  # skip subresources such as pods/status
            }
            self._resources[api_version] = resources
        if kind not in resources:
            raise ApiError("GET", api_version, 404, f"kind {kind} not served by {api_version}")
        return resources[kind]


def wait_until(
    what: str,
    condition: Callable[[], bool],
    timeout: float,
    interval: float = 0.2,
    alive: Callable[[], None] | None = None,
) -> None:
    """Poll ``condition`` until it is true; raise TimeoutError naming ``what`` otherwise.

    ``alive`` is called on every round and may raise to abort early (e.g. a process died).
    Exceptions from ``condition`` count as "not yet" and the last one is reported.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        if alive is not None:
            alive()
        try:
            if condition():
                return
        except (OSError, ApiError, ssl.SSLError, http.client.HTTPException) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f": last error: {last_error}" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def crd_established(api: KubeApi, name: str) -> bool:
    """Whether the CustomResourceDefinition ``name`` has condition Established=True."""
    crd = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions: Iterable[JsonObject] = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
