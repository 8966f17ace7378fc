"""`vpc-attach doctor`: the node agent (its socket, its protocol, its readiness)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket

from cni_plugin.agent.client import CONNECT_TIMEOUT
from cni_plugin.agent.protocol import (
    MAGIC,
    ProtocolError,
    VersionMismatch,
    encode_request,
    read_reply,
)
from cni_plugin.doctor.node import AGENT_SECONDS, FAIL, HTTP_SECONDS, OK, SKIP, WARN, Finding, Node


def agent(node: Node) -> list[Finding]:
    """The agent socket answers a VERSION in this protocol; its health endpoint says ready."""
    path = node.settings.agent_socket
    fix = ("kubectl -n kube-system get pods -l app.kubernetes.io/name=vpc-attach -o wide; "
           "kubectl -n kube-system logs <pod> -c agent (without the agent every verb runs "
           "in-process, slower)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
        sock.settimeout(AGENT_SECONDS)
        sock.sendall(encode_request({"CNI_COMMAND": "VERSION",
                                     "CNI_CONTAINERID": "vpc-attach-doctor"}, b""))
        status, answer = read_reply(sock)
    except VersionMismatch as exc:
        return [Finding("agent.socket", FAIL, f"{path}: the agent speaks another protocol "
                        f"version ({exc}; this executable speaks {MAGIC.decode()})",
                        "install the same vpc-attach version as the agent's image (the "
                        "DaemonSet's init container does; restart its Pod)")]
    except (OSError, ProtocolError) as exc:
        return [Finding("agent.socket", FAIL, f"{path}: no agent answers ({exc})", fix)]
    finally:
        sock.close()
    versions = ""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        versions = ", ".join(json.loads(answer)["supportedVersions"])
    if status != 0 or not versions:
        return [Finding("agent.socket", FAIL, f"{path}: the agent answered VERSION with "
                        f"status {status}: {answer[:200]!r}", fix)]
    return [Finding("agent.socket", OK, f"{path}: protocol {MAGIC.decode()}, CNI "
                    f"{versions}"), _agent_health(node)]


def _agent_health(node: Node) -> Finding:
    from cni_plugin.agent.health import parse_address
    address = node.metrics_address
    if not address:
        return Finding("agent.health", SKIP, "no metrics address (VPC_ATTACH_METRICS_ADDRESS "
                       "is empty)")
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        return Finding("agent.health", FAIL, str(exc), "pass --metrics-address HOST:PORT")
    conn = http.client.HTTPConnection(host, port, timeout=HTTP_SECONDS)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        body = response.read(4096).decode(errors="replace").strip()
    except OSError as exc:
        return Finding("agent.health", WARN, f"http://{address}/readyz: {exc} (metrics off, "
                       "or served elsewhere)", "pass --metrics-address with the agent's "
                       "VPC_ATTACH_METRICS_ADDRESS (the DaemonSet serves on the node IP)")
    finally:
        conn.close()
    if response.status == 200:
        return Finding("agent.health", OK, f"http://{address}/readyz: ready")
    return Finding("agent.health", FAIL, f"http://{address}/readyz: {response.status} {body}",
                   "see the reason; the agent's log: kubectl -n kube-system logs <pod> -c "
                   "agent and the log file")
