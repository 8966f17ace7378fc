"""The plugin's Kubernetes credentials, from the installer's ServiceAccount.

The kubeconfig names a token *file* that the installer keeps refreshed (`--watch`): projected
tokens expire, and the plugin's client re-reads `tokenFile` on every request.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from cni_plugin.install.errors import InstallError
from cni_plugin.install.targets import FileTarget

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CONTEXT_NAME = "vpc-attach"


@dataclass(frozen=True)
class ServiceAccount:
    """What the kubelet projects into the installer's Pod."""

    token: bytes
    ca_pem: bytes
    namespace: str | None


def read_service_account(token_file: Path, ca_file: Path,
                         namespace_file: Path) -> ServiceAccount:
    """Read the projected token, CA and namespace (errors name the missing file)."""
    token = _read(token_file, "ServiceAccount token").strip()
    if not token:
        raise InstallError(f"ServiceAccount token {token_file} is empty")
    ca_pem = _read(ca_file, "cluster CA certificate")
    if b"BEGIN CERTIFICATE" not in ca_pem:
        raise InstallError(f"cluster CA certificate {ca_file} holds no PEM certificate")
    try:
        namespace = namespace_file.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        namespace = None  # optional: only the kubeconfig context's default namespace
    return ServiceAccount(token + b"\n", ca_pem, namespace)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InstallError(f"{what} {path} not found",
                           "run in a Pod with a ServiceAccount token mounted, point "
                           "--serviceaccount-dir at one, or pass --no-kubeconfig") from None
    except OSError as exc:
        raise InstallError(f"cannot read {what} {path}: {exc}") from None


def api_server(override: str | None, environ: Mapping[str, str]) -> str:
    """The API server URL: --server, else KUBERNETES_SERVICE_HOST/PORT (as in-cluster clients)."""
    if override:
        if not override.startswith("https://"):
            raise InstallError(f"--server {override!r} must be an https:// URL")
        return override.rstrip("/")
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "") or "443"
    if not host:
        raise InstallError("KUBERNETES_SERVICE_HOST is not set",
                           "run in a Pod, or pass --server https://HOST:PORT")
    if not port.isdigit():
        raise InstallError(f"KUBERNETES_SERVICE_PORT {port!r} is not a port number")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def credential_targets(account: ServiceAccount, server: str, kubeconfig: str, token_file: str,
                       node_name: str | None) -> list[FileTarget]:
    """The token copy and the kubeconfig referencing it (both host paths, mode 0600)."""
    user = f"vpc-attach-{node_name}" if node_name else "vpc-attach"
    context: dict[str, str] = {"cluster": CONTEXT_NAME, "user": user}
    if account.namespace:
        context["namespace"] = account.namespace
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT_NAME, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(account.ca_pem).decode()}}],
        "users": [{"name": user, "user": {"tokenFile": token_file}}],
        "contexts": [{"name": CONTEXT_NAME, "context": context}],
        "current-context": CONTEXT_NAME,
    }
    header = "# Written by `vpc-attach install`; the token file is refreshed by its --watch mode.\n"
    text = header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    return [FileTarget(token_file, account.token, 0o600),
            FileTarget(kubeconfig, text.encode(), 0o600)]


def token_expiry(token: bytes) -> float | None:
    """The `exp` claim of a JWT (not verified: only to warn before it lapses), if any."""
    parts = token.strip().split(b".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4)))
        expiry = payload.get("exp") if isinstance(payload, dict) else None
    except ValueError:
        return None
    return float(expiry) if isinstance(expiry, int | float) else None


def describe_expiry(expiry: float | None) -> str:
    """Human text for an expiry time (never the token itself)."""
    if expiry is None:
        return "no expiry"
    return "expires " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry))
