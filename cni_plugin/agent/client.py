"""The executable's side: forward one invocation to the agent, or say it cannot (None).

Runs on every CNI call, so only `_socket`: no `os`, `json` or `typing` (docs/architecture.md,
"The agent's wire protocol"). Once the request is sent, a lost agent is code 11, never a re-run.
"""

from __future__ import annotations

import _socket

from cni_plugin.agent.protocol import (
    ProtocolError,
    VersionMismatch,
    encode_request,
    read_reply,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_SOCKET = "/run/vpc-attach/agent.sock"
DEFAULT_HOST_CONFIG = "/etc/vpc-attach/host.json"
CONNECT_TIMEOUT = 1.0
# The agent enforces the invocation deadline itself; this only bounds a wedged agent.
ANSWER_TIMEOUT = 120.0
FORWARDED_PREFIXES = ("CNI_", "VPC_ATTACH_")


def json_string_value(document: bytes, key: bytes) -> str | None:
    """The string value of `"key": "..."` in a JSON object, without importing json.

    Only used for the agent socket's path and a lost agent's cniVersion; the key is matched
    case-insensitively like every stanza key. Anything unusual (escapes, non-strings) answers
    None and the caller falls back to the next source — the verb validates the real config.
    """
    lowered = document.lower()
    start = lowered.find(b'"' + key.lower() + b'"')
    if start < 0:
        return None
    rest = document[start + len(key) + 2:].lstrip()
    if not rest.startswith(b":"):
        return None
    rest = rest[1:].lstrip()
    if not rest.startswith(b'"'):
        return None
    end = rest.find(b'"', 1)
    value = rest[1:end] if end > 0 else b""
    if not value or b"\\" in value:
        return None
    return value.decode("utf-8", "replace")


def socket_path(environ: Mapping[str, str], stdin: bytes) -> str:
    """Where the agent listens: stanza `agentSocket`, env, host file, default (SPEC §4)."""
    from_stanza = json_string_value(stdin, b"agentSocket")
    if from_stanza:
        return from_stanza
    if environ.get("VPC_ATTACH_AGENT_SOCKET"):
        return environ["VPC_ATTACH_AGENT_SOCKET"]
    try:
        with open(environ.get("VPC_ATTACH_HOST_CONFIG") or DEFAULT_HOST_CONFIG, "rb") as handle:
            from_host = json_string_value(handle.read(65536), b"agentSocket")
    except OSError:
        from_host = None
    return from_host or DEFAULT_SOCKET


def forward(environ: Mapping[str, str], stdin: bytes, path: str) -> tuple[int, bytes] | None:
    """The agent's (status, answer JSON text), or None when the caller should run the verb."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except (OSError, ValueError):
            return None  # absent, refused, a stale socket file, or no path: run in-process
        forwarded = {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES)}
        try:
            sock.sendall(encode_request(forwarded, stdin))
        except OSError:
            return None  # nothing reached the agent
        sock.settimeout(ANSWER_TIMEOUT)
        try:
            return read_reply(sock)
        except VersionMismatch:
            return None  # another protocol version: it did not run the verb
        except (OSError, ProtocolError) as exc:
            return 1, lost_agent(environ, stdin, exc)
    finally:
        sock.close()


def lost_agent(environ: Mapping[str, str], stdin: bytes, exc: BaseException) -> bytes:
    """The code 11 answer for an agent that went away mid-verb (the runtime retries)."""
    # The agent may have done part of the work; a repeated verb converges (ADD rebuilds its
    # own leftovers, DEL is idempotent).
    version = json_string_value(stdin, b"cniVersion") or "1.1.0"
    if not version.replace(".", "").isdigit():
        version = "1.1.0"
    command = environ.get("CNI_COMMAND", "?").replace('"', "")
    detail = f"{type(exc).__name__}: {exc}".replace("\\", "/").replace('"', "'")
    return (f'{{"cniVersion": "{version}", "code": 11, "msg": "node agent went away during '
            f'{command}", "details": "{detail}; retry"}}').encode()
