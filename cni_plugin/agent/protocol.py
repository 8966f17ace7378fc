"""Wire format between the executable and the agent: length-prefixed JSON frames.

Request  {"v": 1, "environ": {...}, "stdin": "<base64>"}
Response {"v": 1, "status": 0|1, "payload": {...}|null}   or   {"v": N, "error": "..."}
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct("!I")


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    """Write one frame."""
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    """Read one frame (ProtocolError on garbage, ConnectionError on EOF)."""
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is too large")
    try:
        message = json.loads(_recv_exact(sock, length))
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
