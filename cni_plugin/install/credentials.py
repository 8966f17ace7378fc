"""The plugin's Kubernetes credentials, from the installer's ServiceAccount.

The kubeconfig names a token *file* that the installer keeps refreshed (`--watch`), and the
plugin's client re-reads `tokenFile` on every request. The token is the plugin's
ServiceAccount's, bound to the Node (TokenRequest) when the installer runs as another
ServiceAccount allowed to ask for it (the DaemonSet's `vpc-attach-installer`): it stays valid
while the DaemonSet's Pod is replaced, so the executable's in-process verbs keep working
during a roll. An installer running as the plugin's own ServiceAccount copies its projected
token instead (earlier releases' way), which the API server refuses once the Pod is gone.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from cni_plugin.core.deadline import Deadline
from cni_plugin.install.errors import InstallError
from cni_plugin.install.targets import FileTarget
from cni_plugin.kube.client import ApiError, KubeClient
from cni_plugin.kube.config import KubeCredentials
from netconf.errors import CniError

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CONTEXT_NAME = "vpc-attach"
PLUGIN_SERVICE_ACCOUNT = "vpc-attach"  # the identity the ClusterRole binds
HOST_TOKEN_SECONDS = 3600  # asked for; the API server may shorten it
RENEW_AFTER = 0.8  # of a host token's life, as the kubelet rotates projected tokens
TOKEN_REQUEST_S = 15.0


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
    expiry = _claims(token).get("exp")
    return float(expiry) if isinstance(expiry, int | float) else None


def service_account_of(token: bytes) -> tuple[str, str] | None:
    """(namespace, name) of the ServiceAccount a token's `sub` names (not verified: the
    installer's own mounted token), if it names one."""
    subject = _claims(token).get("sub")
    parts = subject.split(":") if isinstance(subject, str) else []
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and all(parts[2:]):
        return parts[2], parts[3]
    return None


def _claims(token: bytes) -> dict[str, Any]:
    parts = token.strip().split(b".")
    if len(parts) != 3:
        return {}
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4)))
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


TokenRequester = Callable[[str, "ServiceAccount", str, str, str, int], bytes]


def request_node_token(server: str, account: ServiceAccount, namespace: str, name: str,
                       node_name: str, seconds: int) -> bytes:
    """A token of ServiceAccount namespace/name bound to Node node_name (TokenRequest),
    asked as `account`."""
    credentials = KubeCredentials(server, account.ca_pem.decode(), False,
                                  account.token.decode().strip(), None, None, None)
    path = (f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/serviceaccounts/"
            f"{urllib.parse.quote(name)}/token")
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": node_name}}}
    client: KubeClient | None = None
    try:
        client = KubeClient(credentials)
        answer = client.request("POST", path, Deadline(TOKEN_REQUEST_S), body=body)
    except (ApiError, CniError, OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        reason = exc.msg if isinstance(exc, CniError) else str(exc)
        raise InstallError(f"cannot get a token of ServiceAccount {namespace}/{name} bound to "
                           f"Node {node_name}: {reason}", "the installer's ServiceAccount needs "
                           "`create` on serviceaccounts/token for it "
                           "(packaging/rbac/installer.yaml)") from None
    finally:
        if client is not None:
            client.close()
    token = ((answer or {}).get("status") or {}).get("token")
    if not isinstance(token, str) or not token:
        raise InstallError(f"the TokenRequest for {namespace}/{name} answered no token")
    return token.encode() + b"\n"


@dataclass
class HostToken:
    """The token the host's kubeconfig names: the plugin's ServiceAccount's, bound to the
    Node, asked for again once RENEW_AFTER of its life passed; or the installer's own
    projected token when the installer runs as the plugin's ServiceAccount."""

    server: str
    node_name: str | None
    plugin_account: str = PLUGIN_SERVICE_ACCOUNT
    seconds: int = HOST_TOKEN_SECONDS
    request: TokenRequester = request_node_token
    _held: bytes | None = field(default=None, repr=False)
    _renew_after: float = 0.0

    def for_host(self, account: ServiceAccount) -> ServiceAccount:
        """`account` with the token the host gets."""
        own = service_account_of(account.token)
        if own is None or own[1] == self.plugin_account or not self.node_name:
            return account  # the Pod's own token: bound to the Pod (see the module's doc)
        now = time.time()
        if self._held is None or now >= self._renew_after:
            token = self.request(self.server, account, own[0], self.plugin_account,
                                 self.node_name, self.seconds)
            expiry = token_expiry(token) or now + self.seconds
            self._held, self._renew_after = token, now + RENEW_AFTER * (expiry - now)
        return replace(account, token=self._held)


def describe_expiry(expiry: float | None) -> str:
    """Human text for an expiry time (never the token itself)."""
    if expiry is None:
        return "no expiry"
    return "expires " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry))
