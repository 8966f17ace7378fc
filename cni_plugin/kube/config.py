"""Load the parts of a kubeconfig we need: server, CA, and client credentials."""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass
from typing import Any

import yaml

from netconf.errors import INVALID_CONFIG, CniError


@dataclass(frozen=True)
class KubeCredentials:
    """Where and as whom to talk to the API server."""

    server: str
    ca_pem: str | None
    insecure: bool
    token: str | None
    token_file: str | None
    client_cert_pem: bytes | None
    client_key_pem: bytes | None

    def bearer_token(self) -> str | None:
        """The token, re-read from token_file each call (projected tokens rotate)."""
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as handle:
                    return handle.read().strip()
            except OSError as exc:
                raise CniError(INVALID_CONFIG, f"cannot read token file {self.token_file!r}",
                               str(exc)) from None
        return self.token

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context verifying the server with the CA and presenting client certs."""
        # Not create_default_context(): it loads the whole system CA store on every call, and
        # a kubeconfig names the one CA that matters.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_pem:
            ctx.load_verify_locations(cadata=self.ca_pem)
        else:
            ctx.load_default_certs()
        if self.client_cert_pem and self.client_key_pem:
            _load_cert_chain_in_memory(ctx, self.client_cert_pem, self.client_key_pem)
        return ctx


def _load_cert_chain_in_memory(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl only loads certificates from paths: use anonymous memory files, never temp files.
    fds = []
    try:
        for name, data in (("cert", cert), ("key", key)):
            fd = os.memfd_create(f"vpc-attach-{name}", os.MFD_CLOEXEC)
            os.write(fd, data)
            fds.append(fd)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)


def _data_or_file(section: dict[str, Any], key: str, base_dir: str) -> bytes | None:
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = section.get(key)
    if path:
        full = path if os.path.isabs(path) else os.path.join(base_dir, path)
        with open(full, "rb") as handle:
            return handle.read()
    return None


def load_kubeconfig(path: str) -> KubeCredentials:
    """Parse the current context of a kubeconfig (code 7 naming what is wrong)."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as exc:
        raise CniError(INVALID_CONFIG, f"cannot read kubeconfig {path!r}", str(exc)) from None
    try:
        context_name = doc["current-context"]
        context = _named(doc["contexts"], context_name)["context"]
        cluster = _named(doc["clusters"], context["cluster"])["cluster"]
        user = _named(doc.get("users") or [], context["user"])["user"] if context.get("user") \
            else {}
        _refuse_unsupported_auth(path, context.get("user"), user)
        base_dir = os.path.dirname(os.path.abspath(path))
        ca = _data_or_file(cluster, "certificate-authority", base_dir)
        token_file = user.get("tokenFile")
        if token_file and not os.path.isabs(token_file):
            token_file = os.path.join(base_dir, token_file)
        return KubeCredentials(
            server=str(cluster["server"]).rstrip("/"),
            ca_pem=ca.decode() if ca else None,
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            token=user.get("token"),
            token_file=token_file,
            client_cert_pem=_data_or_file(user, "client-certificate", base_dir),
            client_key_pem=_data_or_file(user, "client-key", base_dir),
        )
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise CniError(INVALID_CONFIG, f"kubeconfig {path!r} is not usable",
                       f"{type(exc).__name__}: {exc}") from None


# Ways a kubeconfig user can authenticate that this client does not perform. Ignoring one would
# send anonymous requests, and the 401 that follows reads like a rotating token.
UNSUPPORTED_AUTH = ("exec", "auth-provider", "username", "password")


def _refuse_unsupported_auth(path: str, name: object, user: dict[str, Any]) -> None:
    found = [key for key in UNSUPPORTED_AUTH if user.get(key)]
    if found:
        raise CniError(INVALID_CONFIG, f"kubeconfig {path!r}: user {name!r} authenticates with "
                       f"{found[0]!r}, which vpc-attach does not support",
                       "use a token, tokenFile or client certificate (vpc-attach install "
                       "writes such a kubeconfig for the plugin's ServiceAccount)")


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise KeyError(name)
