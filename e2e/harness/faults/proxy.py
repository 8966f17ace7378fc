"""A TLS-terminating HTTP proxy in front of the real kube-apiserver that injects faults.

Clients (the plugin, through a kubeconfig naming the proxy) connect over TLS to 127.0.0.1 with a
certificate issued by the cluster's own CA; every request is forwarded to the API server over a
fresh TLS connection (the CA verified) with the client's own headers, so the API server sees the
client's credentials. `Rule`s pick requests by method, resource (plural), object name, whether
it is a dry run, and ordinal (the n-th request the rule matched) and decide what happens to them
(`Fault`).

Everything is bounded: each socket has a timeout, each delay is cut short by `stop`, and `stop`
closes every connection and joins every thread it started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import http.client
import io
import json
import logging
import select
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

CLIENT_IDLE_S = 120.0  # a keep-alive client connection idle this long is closed
UPSTREAM_TIMEOUT_S = 30.0  # any read from / write to the API server (a paused one included)
WATCH_IDLE_S = 90.0  # a watch with no event (nor bookmark) this long is ended
MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
JOIN_S = 10.0
MAX_SEEN = 100_000  # requests remembered
KEEP, CLOSE, RESET = "keep", "close", "reset"  # what becomes of a client connection
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                        "te", "trailer", "upgrade", "content-length"})


class Fault(enum.Enum):
    """What a rule does to the request it picked."""

    FORWARD = "forward"  # nothing: forward and answer (with a hook, a point to act at)
    DROP_AFTER_FORWARD = "forward-then-drop"  # the server acts; its answer is lost
    RESET_BEFORE_FORWARD = "reset-before-forward"  # TCP reset; the server never sees it
    DELAY_ANSWER = "delay-answer"  # the server acts at once; its answer comes `delay` s late
    DELAY_FORWARD = "delay-forward"  # held `delay` s, then forwarded if the client still waits
    RESPOND = "respond"  # answered by the proxy (`status`, `retry_after`); never forwarded
    CLOSE_MID_BODY = "close-mid-body"  # the server acts; half of its answer's body, then close


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request the proxy received, and what it did with it."""

    at: float  # time.monotonic() once it was served (answered, refused or dropped)
    method: str
    path: str
    resource: str | None
    name: str | None
    fault: Fault | None  # None: forwarded untouched
    status: int | None  # the API server's answer, when forwarded and answered
    connection: int = 0  # which client connection carried it: 1 for the first accepted, …
    dry_run: bool = False  # a write the API server validates and does not store
    received: float = 0.0  # time.monotonic() when the proxy read it


@dataclasses.dataclass
class Rule:
    """Picks requests (every given criterion must hold) and applies `fault` to the `nth` to
    the `nth + times - 1`-th of them (`times` 0: every one from the nth on)."""

    fault: Fault
    method: str | None = None
    resource: str | None = None  # plural, e.g. "bgpadvertisements"
    name: str | None = None  # object name (collections have none)
    dry_run: bool | None = None  # True: dry runs only; False: real requests only; None: any
    nth: int = 1
    times: int = 1
    delay: float = 0.0  # DELAY_ANSWER / DELAY_FORWARD
    status: int = 503  # RESPOND
    retry_after: float | None = 1.0  # RESPOND: the Retry-After header, None for none
    hook: Callable[[], None] | None = None  # called when the rule fires, before the fault
    matched: int = 0  # requests it picked so far
    fired: int = 0  # of those, the ones it applied its fault to

    def picks(self, method: str, resource: str | None, name: str | None,
              dry_run: bool = False) -> bool:
        """Whether this request meets every criterion."""
        return (self.method is None or self.method == method) \
            and (self.resource is None or self.resource == resource) \
            and (self.name is None or self.name == name) \
            and (self.dry_run is None or self.dry_run == dry_run)

    def due(self) -> bool:
        """Count a picked request; whether the fault applies to it."""
        self.matched += 1
        last = None if self.times == 0 else self.nth + self.times - 1
        return self.matched >= self.nth and (last is None or self.matched <= last)

    def __str__(self) -> str:
        what = " ".join(p for p in (self.method, self.resource, self.name) if p) or "any"
        what += {True: " (dry run)", False: " (not a dry run)", None: ""}[self.dry_run]
        return f"{self.fault.value} on {what} #{self.nth}" + \
            (f"x{self.times}" if self.times != 1 else "")


def resource_of(path: str) -> tuple[str | None, str | None]:
    """(plural, object name) of an API path: /api/v1/namespaces/ns/pods/p -> (pods, p)."""
    parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(path).path.split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return None, None
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return None, None
    return rest[0], rest[1] if len(rest) > 1 else None


@dataclasses.dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, key: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == key), None)


class _ClientGone(Exception):
    """The client closed its connection (or sent something we cannot read)."""


class FaultProxy:
    """An HTTPS proxy to `upstream` (https://127.0.0.1:PORT) listening on 127.0.0.1."""

    def __init__(self, upstream: str, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        parts = urllib.parse.urlsplit(upstream)
        if parts.hostname != "127.0.0.1" or parts.port is None:
            raise ValueError(f"upstream must be https://127.0.0.1:PORT, not {upstream}")
        self._upstream = (parts.hostname, parts.port)
        self._client_tls = ssl.create_default_context(cafile=str(ca_file))
        self._server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_tls.load_cert_chain(str(cert_file), str(key_file))
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._seen: list[Seen] = []
        self._stop = threading.Event()
        self._busy = 0
        self._accepted = 0  # client connections accepted so far
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.5)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="fault-proxy accept",
                                          daemon=True)

    @property
    def url(self) -> str:
        """The server URL clients use."""
        return f"https://127.0.0.1:{self.port}"

    # Lifecycle ------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Accept connections in a thread of its own."""
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Close the listener and every connection, end every delay, join every thread."""
        self._stop.set()
        self._acceptor.join(JOIN_S)
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _shut(sock)
        for thread in threads:
            thread.join(JOIN_S)
        alive = [t.name for t in threads if t.is_alive()]
        if alive or self._acceptor.is_alive():
            raise RuntimeError(f"fault proxy threads still running after stop: {alive}")

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # Rules and what was seen ----------------------------------------------------------------

    def add(self, *rules: Rule) -> None:
        """Add rules (consulted in order; the first one due applies its fault)."""
        with self._lock:
            self._rules.extend(rules)

    def clear(self) -> list[Rule]:
        """Remove every rule; the removed ones (with their counters)."""
        with self._lock:
            removed, self._rules = self._rules, []
        return removed

    @contextlib.contextmanager
    def rules(self, *rules: Rule) -> Iterator[tuple[Rule, ...]]:
        """The rules apply inside the block only."""
        self.add(*rules)
        try:
            yield rules
        finally:
            with self._lock:
                self._rules = [r for r in self._rules if not any(r is x for x in rules)]

    def seen(self) -> list[Seen]:
        """Every request received so far, oldest first."""
        with self._lock:
            return list(self._seen)

    def accepted(self) -> int:
        """Client connections accepted so far (TCP connections opened to the API server)."""
        with self._lock:
            return self._accepted

    def in_flight(self) -> int:
        """Requests being handled now (a delayed one, or one waiting for a paused server);
        watches, which last until the server ends them, are not counted."""
        with self._lock:
            return self._busy

    # Serving ----------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            with self._lock:
                self._accepted += 1
                number = self._accepted
            thread = threading.Thread(target=self._serve, args=(conn, number), daemon=True,
                                      name=f"fault-proxy conn {conn.getpeername()[1]}")
            with self._lock:
                self._threads = {t for t in self._threads if t.is_alive()}
                self._threads.add(thread)
                self._sockets.add(conn)
            thread.start()

    def _serve(self, raw: socket.socket, number: int) -> None:
        tls: ssl.SSLSocket | None = None
        try:
            raw.settimeout(CLIENT_IDLE_S)
            tls = self._server_tls.wrap_socket(raw, server_side=True)
            self._track(tls)
            with tls.makefile("rb") as reader:
                ending = KEEP
                while ending == KEEP and not self._stop.is_set():
                    ending = self._handle(tls, _read_request(reader), number)
            if ending == RESET:  # the reader closed first: close() must not wait for it
                _reset(tls)
        except (_ClientGone, OSError, http.client.HTTPException, ValueError):
            return
        finally:
            self._untrack(raw)
            if tls is not None:
                self._untrack(tls)
                _shut(tls)
            _shut(raw)

    def _handle(self, client: ssl.SSLSocket, request: _Request, connection: int) -> str:
        """Serve one request; what becomes of the connection (KEEP, CLOSE or RESET)."""
        resource, name = resource_of(request.target)
        dry_run = is_dry_run(request.target)
        received = time.monotonic()
        rule = self._due_rule(request.method, resource, name, dry_run)
        fault = rule.fault if rule is not None else None
        busy = 0 if _is_watch(request.target) else 1
        with self._lock:
            self._busy += busy
        answered: list[int] = []  # the API server's status, once it answered
        try:
            if rule is not None and rule.hook is not None:
                rule.hook()
            if fault is Fault.RESET_BEFORE_FORWARD:
                return RESET
            if fault is Fault.RESPOND:
                assert rule is not None
                _respond_status(client, rule.status, rule.retry_after)
                return KEEP
            if fault is Fault.DELAY_FORWARD:
                assert rule is not None
                if self._stop.wait(rule.delay) or _client_left(client):
                    return CLOSE  # as a proxy does when its client hung up: not forwarded
            self._forward(client, request, rule, answered)
            return KEEP if fault in (None, Fault.FORWARD, Fault.DELAY_FORWARD,
                                     Fault.DELAY_ANSWER) else CLOSE
        finally:
            with self._lock:
                self._busy -= busy
                del self._seen[:-MAX_SEEN]
                self._seen.append(Seen(time.monotonic(), request.method, request.target,
                                       resource, name, fault if fault is not Fault.FORWARD
                                       else None, answered[0] if answered else None,
                                       connection, dry_run, received))

    def _due_rule(self, method: str, resource: str | None, name: str | None,
                  dry_run: bool) -> Rule | None:
        with self._lock:
            chosen = None
            for rule in self._rules:
                if rule.picks(method, resource, name, dry_run) and rule.due() and \
                        chosen is None:
                    rule.fired += 1
                    chosen = rule
            return chosen

    def _forward(self, client: ssl.SSLSocket, request: _Request, rule: Rule | None,
                 answered: list[int]) -> None:
        """Forward to the API server and relay (or mangle) its answer (its status is appended
        to `answered` as soon as it comes)."""
        watch = _is_watch(request.target)
        upstream = http.client.HTTPSConnection(
            *self._upstream, timeout=WATCH_IDLE_S if watch else UPSTREAM_TIMEOUT_S,
            context=self._client_tls)
        try:
            upstream.connect()  # failing: the client's connection is closed unanswered
            assert upstream.sock is not None
            self._track(upstream.sock)
            upstream.putrequest(request.method, request.target, skip_host=True,
                                skip_accept_encoding=True)
            for key, value in request.headers:
                if key.lower() not in HOP_BY_HOP:
                    upstream.putheader(key, value)
            upstream.putheader("Content-Length", str(len(request.body)))
            upstream.endheaders(request.body)
            response = upstream.getresponse()
            answered.append(response.status)
            fault = rule.fault if rule is not None else None
            if watch and response.chunked and fault in (None, Fault.FORWARD, Fault.DELAY_FORWARD):
                _relay_chunked(client, response, self._stop)  # events as they come
                return
            body = response.read()  # chunked or not: answered with a Content-Length
            if fault is Fault.DROP_AFTER_FORWARD:
                return
            if fault is Fault.DELAY_ANSWER:
                assert rule is not None
                if self._stop.wait(rule.delay):
                    return
            head = _head(response.status, response.reason, response.getheaders(), len(body))
            if fault is Fault.CLOSE_MID_BODY:
                client.sendall(head + body[:len(body) // 2])
                return
            client.sendall(head + body)
        finally:
            if upstream.sock is not None:
                self._untrack(upstream.sock)
            upstream.close()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)


def is_dry_run(target: str) -> bool:
    """Whether a request's target asks for a dry run (`dryRun=All`)."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    return query.get("dryRun", [""])[0] == "All"


def _is_watch(target: str) -> bool:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    return query.get("watch", ["false"])[0] in ("1", "true")


def _read_request(reader: io.BufferedReader) -> _Request:
    """One HTTP/1.1 request from a buffered reader (Content-Length bodies only)."""
    line = reader.readline(MAX_HEAD)
    if not line:
        raise _ClientGone("closed")
    try:
        method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    except ValueError as exc:
        raise _ClientGone(f"bad request line {line[:80]!r}") from exc
    headers: list[tuple[str, str]] = []
    size = len(line)
    while True:
        line = reader.readline(MAX_HEAD)
        size += len(line)
        if not line or size > MAX_HEAD:
            raise _ClientGone("headers cut short or too long")
        if line in (b"\r\n", b"\n"):
            break
        key, _, value = line.decode("latin-1").partition(":")
        headers.append((key.strip(), value.strip()))
    request = _Request(method, target, version, headers, b"")
    if request.header("transfer-encoding"):
        raise _ClientGone("chunked request bodies are not supported")
    length = int(request.header("content-length") or 0)
    if length > MAX_BODY:
        raise _ClientGone("request body too large")
    body: bytes = reader.read(length) if length else b""
    if len(body) != length:
        raise _ClientGone("request body cut short")
    request.body = body
    return request


def _head(status: int, reason: str, headers: list[tuple[str, str]], length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP]
    lines.append(f"Content-Length: {length}" if length is not None
                 else "Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _relay_chunked(client: ssl.SSLSocket, response: http.client.HTTPResponse,
                   stop: threading.Event) -> None:
    client.sendall(_head(response.status, response.reason, response.getheaders(), None))
    while not stop.is_set():
        data = response.read1(65536)
        if not data:
            break
        client.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    client.sendall(b"0\r\n\r\n")


def _respond_status(client: ssl.SSLSocket, status: int, retry_after: float | None) -> None:
    reason = http.client.responses.get(status, "Error")
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": f"injected by the fault proxy: {status} {reason}",
                       "reason": reason.replace(" ", ""), "code": status}).encode()
    headers = [("Content-Type", "application/json")]
    if retry_after is not None:
        headers.append(("Retry-After", f"{retry_after:g}"))
    client.sendall(_head(status, reason, headers, len(body)) + body)


def _client_left(client: ssl.SSLSocket) -> bool:
    """Whether the client closed (or reset) its side; nothing it sent is consumed."""
    poller = select.poll()
    poller.register(client.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0) instead of an orderly shutdown."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
