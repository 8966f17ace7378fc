"""Wire format between the executable and the agent: small binary frames, no JSON.

The executable's side must not pay for importing `json`; the frame layout and the reasons:
docs/architecture.md ("The agent's wire protocol").
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs milliseconds on the executable's path (client.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Protocol

    class Stream(Protocol):
        """What both `socket.socket` and `_socket.socket` offer."""

        def sendall(self, data: bytes, /) -> None: ...
        def recv(self, size: int, /) -> bytes: ...

MAGIC = b"vpa1"
REFUSAL = b"vpa?"  # the agent speaks another version: the executable runs the verb itself
STDIN_KEY = b"\x00stdin"
MAX_FRAME = 16 * 1024 * 1024
# Integers are big-endian, with int.to_bytes rather than `struct` (one import less per call).


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


class VersionMismatch(ProtocolError):
    """The peer speaks another protocol version."""


def encode_request(environ: Mapping[str, str], stdin: bytes) -> bytes:
    """MAGIC, u32 count, then each (u32 length, key, u32 length, value); stdin is STDIN_KEY."""
    pairs = [(k.encode(), v.encode("utf-8", "surrogateescape")) for k, v in environ.items()]
    pairs.append((STDIN_KEY, stdin))
    parts = [MAGIC, _u32(len(pairs))]
    for key, value in pairs:
        parts += [_u32(len(key)), key, _u32(len(value)), value]
    return b"".join(parts)


def read_request(sock: Stream) -> tuple[dict[str, str], bytes]:
    """(environ, stdin) of one request; VersionMismatch for another version's frame."""
    magic = recv_exact(sock, 4)
    if magic != MAGIC:
        raise VersionMismatch(f"request frame {magic!r}")
    count = int.from_bytes(recv_exact(sock, 4), "big")
    environ: dict[str, str] = {}
    stdin = b""
    total = 0
    for _ in range(count):
        key = _field(sock)
        value = _field(sock)
        total += len(key) + len(value)
        if total > MAX_FRAME:
            raise ProtocolError("request is too large")
        if key == STDIN_KEY:
            stdin = value
        else:
            environ[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
    return environ, stdin


def encode_reply(status: int, answer: bytes) -> bytes:
    """MAGIC, u8 status, u32 length, the answer's JSON text (empty: no answer)."""
    return MAGIC + bytes((status & 0xFF,)) + _u32(len(answer)) + answer


def read_reply(sock: Stream) -> tuple[int, bytes]:
    """(status, JSON text) of the agent's reply; VersionMismatch when it refused."""
    magic = recv_exact(sock, 4)
    if magic != MAGIC:
        raise VersionMismatch(f"reply frame {magic!r}")
    head = recv_exact(sock, 5)
    status, length = head[0], int.from_bytes(head[1:], "big")
    if length > MAX_FRAME:
        raise ProtocolError("reply is too large")
    return status, recv_exact(sock, length)


def _field(sock: Stream) -> bytes:
    length = int.from_bytes(recv_exact(sock, 4), "big")
    if length > MAX_FRAME:
        raise ProtocolError("field is too large")
    return recv_exact(sock, length)


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def recv_exact(sock: Stream, size: int) -> bytes:
    """Exactly size bytes (ConnectionError on EOF)."""
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
