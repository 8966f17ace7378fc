"""The executable's side: forward one invocation to the agent, or say it cannot (None).

Runs on every CNI call, so only `_socket` and `time`: no `os`, `json` or `typing`
(docs/architecture.md, "The agent's wire protocol"). Once the request is sent, a lost or
silent agent is code 11 within the invocation's deadline, never a re-run. The socket and the
deadline are the node's (environment, host file), never a network config's (SPEC §14).
"""

from __future__ import annotations

import _socket
import time  # built into the interpreter: nothing to load

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
DEFAULT_TIMEOUT_SECONDS = 30.0  # netconf.host's; not imported: that costs milliseconds here
STATUS_TIMEOUT_S = 4.0  # core.request's: STATUS answers within this whatever the timeout
# The agent answers a missed deadline itself; this margin covers handing it the request and
# reading its answer, so the client gives up only after the agent would have answered.
ANSWER_GRACE_SECONDS = 2.0
FORWARDED_PREFIXES = ("CNI_", "VPC_ATTACH_")


def _value_start(document: bytes, key: bytes) -> bytes | None:
    """What follows `"key":` in a JSON document (key matched case-insensitively), or None."""
    lowered = document.lower()
    start = lowered.find(b'"' + key.lower() + b'"')
    if start < 0:
        return None
    rest = document[start + len(key) + 2:].lstrip()
    if not rest.startswith(b":"):
        return None
    return rest[1:].lstrip()


def json_string_value(document: bytes, key: bytes) -> str | None:
    """The string value of `"key": "..."` in a JSON object, without importing json.

    Only used for the node's agent socket and timeout and a lost agent's cniVersion; the key is
    matched case-insensitively like every stanza key. Anything unusual (escapes, non-strings)
    answers None and the caller falls back to the next source — the verb validates the real
    settings.
    """
    rest = _value_start(document, key)
    if rest is None or not rest.startswith(b'"'):
        return None
    end = rest.find(b'"', 1)
    value = rest[1:end] if end > 0 else b""
    if not value or b"\\" in value:
        return None
    return value.decode("utf-8", "replace")


def _seconds(document: bytes, key: bytes) -> float | None:
    """A timeout in (0, 600] given as a JSON number or a string of one; None otherwise."""
    text = json_string_value(document, key)
    if text is None:
        rest = _value_start(document, key) or b""
        end = 0
        while end < len(rest) and rest[end:end + 1] in b"0123456789.eE+-":
            end += 1
        text = rest[:end].decode()
    return _as_seconds(text)


def _as_seconds(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if 0 < seconds <= 600 else None


class NodeSettings:
    """The node's settings this path needs: the environment, then the host file (SPEC §14).

    A standard-library copy of `netconf.host`'s precedence (the one resolver of host settings)
    for the three settings forwarding needs: agentSocket, timeoutSeconds, stanzaHostSettings.
    Not pydantic's cost (`netconf.host` has none) but `json`, `dataclasses`, `typing`, `re`
    and `ipaddress`: tens of milliseconds per CNI call, where this module loads in about one.
    tests/test_host_settings.py checks that both choose the same socket and deadline.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self._host: bytes | None = None

    def host_file(self) -> bytes:
        """The host file's first 64 KiB, read once (empty when absent or unreadable)."""
        if self._host is None:
            path = self.environ.get("VPC_ATTACH_HOST_CONFIG") or DEFAULT_HOST_CONFIG
            try:
                with open(path, "rb") as handle:
                    self._host = handle.read(65536)
            except OSError:
                self._host = b""
        return self._host

    def string(self, env: str, key: bytes) -> str | None:
        """A string setting: its environment variable, else its host-file key."""
        return self.environ.get(env) or json_string_value(self.host_file(), key)

    def stanza_allowed(self) -> bool:
        """Whether this node lets network configs set host settings (anything but `allow`
        is no here; the verb reports a bad value as code 7)."""
        return self.string("VPC_ATTACH_STANZA_HOST_SETTINGS", b"stanzaHostSettings") == "allow"


def route(environ: Mapping[str, str], stdin: bytes) -> tuple[str, float]:
    """(the agent's socket, how long to wait for its answer): the invocation's deadline, from
    the same sources as the verb's, plus ANSWER_GRACE_SECONDS."""
    node = NodeSettings(environ)
    path = seconds = None
    if (b'"agentsocket"' in stdin.lower() or b'"timeoutseconds"' in stdin.lower()) \
            and node.stanza_allowed():
        path = json_string_value(stdin, b"agentSocket")
        seconds = _seconds(stdin, b"timeoutSeconds")
    path = path or node.string("VPC_ATTACH_AGENT_SOCKET", b"agentSocket") or DEFAULT_SOCKET
    if seconds is None:
        from_env = environ.get("VPC_ATTACH_TIMEOUT_SECONDS")
        seconds = (_as_seconds(from_env) if from_env
                   else _seconds(node.host_file(), b"timeoutSeconds"))
    seconds = seconds or DEFAULT_TIMEOUT_SECONDS
    if environ.get("CNI_COMMAND") == "STATUS":
        seconds = min(seconds, STATUS_TIMEOUT_S)
    return path, seconds + ANSWER_GRACE_SECONDS


class _Bounded:
    """A socket whose reads all end by one monotonic instant (a trickling peer cannot stretch
    the wait past the deadline)."""

    def __init__(self, sock: _socket.socket, until: float) -> None:
        self.sock = sock
        self.until = until

    def sendall(self, data: bytes, /) -> None:
        self.sock.sendall(data)

    def recv(self, size: int, /) -> bytes:
        left = self.until - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(left)
        return self.sock.recv(size)


def forward(environ: Mapping[str, str], stdin: bytes, path: str,
            answer_seconds: float = DEFAULT_TIMEOUT_SECONDS + ANSWER_GRACE_SECONDS,
            ) -> tuple[int, bytes] | None:
    """The agent's (status, answer JSON text), or None when the caller should run the verb.

    An agent that took the request but has not answered within answer_seconds of this call
    is code 11 (the runtime retries; a repeated verb converges)."""
    until = time.monotonic() + answer_seconds
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
        try:
            return read_reply(_Bounded(sock, until))
        except VersionMismatch:
            return None  # another protocol version: it did not run the verb
        except TimeoutError:
            return 1, lost_agent(environ, stdin, None, answer_seconds)
        except (OSError, ProtocolError) as exc:
            return 1, lost_agent(environ, stdin, exc)
    finally:
        sock.close()


def lost_agent(environ: Mapping[str, str], stdin: bytes, exc: BaseException | None,
               waited: float = 0.0) -> bytes:
    """The code 11 answer for an agent that went away mid-verb (exc) or did not answer within
    the invocation's deadline (exc None, after `waited` seconds); the runtime retries."""
    # The agent may have done part of the work; a repeated verb converges (ADD rebuilds its
    # own leftovers, DEL is idempotent).
    version = json_string_value(stdin, b"cniVersion") or "1.1.0"
    if not version.replace(".", "").isdigit():
        version = "1.1.0"
    command = environ.get("CNI_COMMAND", "?").replace('"', "")
    if exc is None:
        message = f"node agent did not answer {command} within {waited:g} s"
        detail = ("the invocation's deadline (timeoutSeconds) plus "
                  f"{ANSWER_GRACE_SECONDS:g} s; the agent may be wedged")
    else:
        message = f"node agent went away during {command}"
        detail = f"{type(exc).__name__}: {exc}".replace("\\", "/").replace('"', "'")
    return (f'{{"cniVersion": "{version}", "code": 11, "msg": "{message}", '
            f'"details": "{detail}; retry"}}').encode()
