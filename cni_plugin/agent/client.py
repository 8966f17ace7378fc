"""The executable's side: forward one invocation to the agent, or say it cannot.

Standard library only (SPEC §11). `forward` returns None when the agent is absent, refuses
the connection or speaks another protocol version — the caller then runs the verb itself.
Once the request has been sent, a lost agent is an error (code 11), never a silent re-run.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from collections.abc import Mapping
from typing import Any

from cni_plugin.agent.protocol import PROTOCOL_VERSION, ProtocolError, recv_frame, send_frame

DEFAULT_SOCKET = "/run/vpc-attach/agent.sock"
DEFAULT_HOST_CONFIG = "/etc/vpc-attach/host.json"
CONNECT_TIMEOUT = 1.0
# The agent enforces the invocation deadline itself; this only bounds a wedged agent.
ANSWER_TIMEOUT = 120.0
TRY_AGAIN_LATER = 11
FORWARDED_PREFIXES = ("CNI_", "VPC_ATTACH_")


def socket_path(environ: Mapping[str, str], stdin: bytes) -> str:
    """Where the agent listens: stanza `agentSocket`, env, host file, default (SPEC §4)."""
    try:
        stanza = json.loads(stdin) if stdin else {}
        if isinstance(stanza, dict) and isinstance(stanza.get("agentSocket"), str):
            return str(stanza["agentSocket"])
    except (ValueError, RecursionError):
        pass  # the verb will report the bad config; the socket choice falls through
    if environ.get("VPC_ATTACH_AGENT_SOCKET"):
        return environ["VPC_ATTACH_AGENT_SOCKET"]
    try:
        with open(environ.get("VPC_ATTACH_HOST_CONFIG") or DEFAULT_HOST_CONFIG,
                  encoding="utf-8") as handle:
            value = json.load(handle).get("agentSocket")
            if isinstance(value, str) and value:
                return value
    except (OSError, ValueError, AttributeError):
        pass
    return DEFAULT_SOCKET


def forward(environ: Mapping[str, str], stdin: bytes,
            path: str) -> tuple[int, dict[str, Any] | None] | None:
    """The agent's (status, payload), or None when the caller should run the verb itself."""
    if not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except OSError:
            return None  # absent, refused, or a stale socket file: run in-process
        request = {"v": PROTOCOL_VERSION, "stdin": base64.b64encode(stdin).decode(),
                   "environ": {k: v for k, v in environ.items()
                               if k.startswith(FORWARDED_PREFIXES)}}
        try:
            send_frame(sock, request)
        except OSError:
            return None  # nothing reached the agent
        sock.settimeout(ANSWER_TIMEOUT)
        try:
            reply = recv_frame(sock)
        except (OSError, ConnectionError, ProtocolError) as exc:
            return 1, _lost_agent(environ, stdin, exc)
    finally:
        sock.close()
    if reply.get("v") != PROTOCOL_VERSION or "error" in reply:
        return None  # another protocol version: it did not run the verb
    status = reply.get("status")
    payload = reply.get("payload")
    if not isinstance(status, int) or not (payload is None or isinstance(payload, dict)):
        return None
    return status, payload


def _lost_agent(environ: Mapping[str, str], stdin: bytes, exc: BaseException) -> dict[str, Any]:
    # The agent may have done part of the work: the runtime retries, and a repeated verb
    # converges (ADD rebuilds its own leftovers, DEL is idempotent).
    version = "1.1.0"
    try:
        data = json.loads(stdin)
        if isinstance(data, dict) and isinstance(data.get("cniVersion"), str):
            version = data["cniVersion"]
    except (ValueError, RecursionError):
        pass
    return {"cniVersion": version, "code": TRY_AGAIN_LATER,
            "msg": f"node agent went away during {environ.get('CNI_COMMAND', '?')}",
            "details": f"{type(exc).__name__}: {exc}; retry"}
