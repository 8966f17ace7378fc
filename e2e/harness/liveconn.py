"""Long-lived TCP connections between two network namespaces, and probes, that record every
gap (SPEC §18: an upgrade running workloads do not notice).

`echo_server` runs in one netns: a TCP and a UDP echo on a port, both families. `LiveTraffic`
runs in another. For each of the server's addresses it keeps three flows, each answering a
sequence number every `PERIOD_S`: a long-lived TCP connection (an error breaks it); a UDP
probe, one datagram a round (a lost one is only a longer gap: this measures how long the data
path carried nothing); a TCP probe, a fresh connection a round (a lost SYN costs the kernel's
1 s retransmission: what a new connection of a workload notices). Each keeps the longest time
between two answered rounds (a gap) and its first error. `stop()` ends them and returns what
they saw. Everything runs in the namespaces'
own Python processes, started through `enter` (for a node: its mount namespace and `nsenter
--net`), so the test process's scheduling never shows up as a gap in the data path.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2e.harness.pace import pace

PERIOD_S = 0.05  # one round per connection (and one probe) every 50 ms
PROCESS_STARTS = 4  # a Python program's start, nsenter's and the connections it opens

_SERVER = r"""
import socket, sys, threading
port = int(sys.argv[1])
def serve(conn):
    with conn:
        while True:
            data = conn.recv(4096)
            if not data:
                return
            conn.sendall(data)
def accept(sock):
    while True:
        conn, _ = sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
def echo(sock):
    while True:
        data, peer = sock.recvfrom(64)
        sock.sendto(data, peer)
for family in (socket.AF_INET, socket.AF_INET6):
    for kind, run in ((socket.SOCK_STREAM, accept), (socket.SOCK_DGRAM, echo)):
        sock = socket.socket(family, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(("0.0.0.0" if family == socket.AF_INET else "::", port))
        if kind == socket.SOCK_STREAM:
            sock.listen(64)
        threading.Thread(target=run, args=(sock,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

# argv: port, period, then the addresses. Prints "ready" once every connection is open, then
# one JSON line when stdin closes or says "stop".
_CLIENT = r"""
import json, socket, sys, threading, time
port, period, addresses = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
TIMEOUT = 5.0
stop = threading.Event()
def family(address):
    return socket.AF_INET6 if ":" in address else socket.AF_INET
class Stat:
    def __init__(self, name):
        self.name, self.rounds, self.longest_gap, self.error = name, 0, 0.0, None
        self.last = self.first = time.monotonic()
    def answered(self):
        now = time.monotonic()
        self.longest_gap = max(self.longest_gap, now - self.last)
        self.last, self.rounds = now, self.rounds + 1
    def close(self):  # the time since the last answer is a gap too
        self.longest_gap = max(self.longest_gap, time.monotonic() - self.last)
    def json(self):
        return {"name": self.name, "rounds": self.rounds,
                "longest_gap_s": round(self.longest_gap, 4), "error": self.error,
                "seconds": round(self.last - self.first, 3)}
def round_trip(sock, number):
    sock.sendall(number.to_bytes(8, "big"))
    data = b""
    while len(data) < 8:
        chunk = sock.recv(8 - len(data))
        if not chunk:
            raise ConnectionError("closed by the peer")
        data += chunk
    if int.from_bytes(data, "big") != number:
        raise ConnectionError(f"echo {int.from_bytes(data, 'big')} for {number}")
def connect(address):
    sock = socket.create_connection((address, port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
def long_lived(sock, stat):
    number = 0
    try:
        while not stop.is_set():
            number += 1
            round_trip(sock, number)
            stat.answered()
            stop.wait(period)
    except OSError as exc:
        stat.error = f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()
def udp_probe(address, stat):
    number = 0
    with socket.socket(family(address), socket.SOCK_DGRAM) as sock:
        sock.connect((address, port))
        sock.settimeout(period * 4)
        while not stop.is_set():
            number += 1
            try:
                sock.send(number.to_bytes(8, "big"))
                while int.from_bytes(sock.recv(64), "big") != number:
                    pass  # a late answer of an earlier round
                stat.answered()
            except socket.timeout:
                continue  # lost: the gap grows until an answer comes
            except OSError as exc:  # e.g. an ICMP unreachable
                stat.error = stat.error or f"{type(exc).__name__}: {exc}"
            stop.wait(period)
def probe(address, stat):
    number = 0
    while not stop.is_set():
        number += 1
        try:
            with connect(address) as sock:
                round_trip(sock, number)
            stat.answered()
        except OSError as exc:
            stat.error = stat.error or f"{type(exc).__name__}: {exc}"  # the first one
        stop.wait(period)
stats, threads = [], []
for address in addresses:
    stat = Stat(f"connection to {address}")
    sock = connect(address)
    stats.append(stat)
    threads.append(threading.Thread(target=long_lived, args=(sock, stat)))
    stat = Stat(f"tcp probe of {address}")
    stats.append(stat)
    threads.append(threading.Thread(target=probe, args=(address, stat)))
    stat = Stat(f"udp probe of {address}")
    stats.append(stat)
    threads.append(threading.Thread(target=udp_probe, args=(address, stat)))
for stat in stats:
    stat.last = stat.first = time.monotonic()
for thread in threads:
    thread.start()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "stop":
        break
stop.set()
for thread in threads:
    thread.join()
for stat in stats:
    stat.close()
print(json.dumps([stat.json() for stat in stats]), flush=True)
"""


@dataclass(frozen=True)
class Flow:
    """What one long-lived connection or one probe saw."""

    name: str
    rounds: int
    longest_gap_s: float
    error: str | None
    seconds: float


@dataclass
class Traffic:
    """What every flow between a client and a server saw."""

    flows: list[Flow] = field(default_factory=list)

    def longest_gap_s(self, kind: str = "") -> float:
        """The longest time any flow (whose name starts with `kind`: "connection", "udp
        probe", "tcp probe") went without an answer."""
        return max((flow.longest_gap_s for flow in self.flows if flow.name.startswith(kind)),
                   default=0.0)

    def broken(self, kind: str = "") -> list[str]:
        """The flows (of `kind`) that met an error: a long-lived connection broke, a probe
        failed."""
        return [f"{flow.name}: {flow.error}" for flow in self.flows
                if flow.error and flow.name.startswith(kind)]


class _Process:
    """A Python program in a namespace, told to stop on its stdin."""

    def __init__(self, argv: list[str], what: str) -> None:
        self.what = what
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until its first line says "ready" (select on its stdout: no polling sleep)."""
        assert self.popen.stdout is not None
        bound = pace().starts(PROCESS_STARTS)
        deadline = time.monotonic() + bound.seconds
        while True:
            self.check_alive()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise TimeoutError(f"{self.what} not ready after {bound}")
            readable, _, _ = select.select([self.popen.stdout], [], [], min(remaining, 1.0))
            if readable and self.popen.stdout.readline().strip() == "ready":
                return

    def check_alive(self) -> None:
        """Raise if the program exited (with what it wrote to stderr)."""
        if self.popen.poll() is not None:
            assert self.popen.stderr is not None
            raise RuntimeError(f"{self.what} exited with status {self.popen.returncode}: "
                               f"{self.popen.stderr.read()[-2000:]}")

    def stop(self) -> str:
        """Tell it to stop; its last line."""
        # Its threads end within a round's socket timeout (5 s), then it prints and exits.
        stop_s = pace().plus(PROCESS_STARTS, 5.0, "a round's socket timeout").seconds
        try:
            out, err = self.popen.communicate("stop\n", timeout=stop_s)
        except BrokenPipeError:  # it exited already: what it wrote
            out, err = self.popen.communicate(timeout=stop_s)
        if self.popen.returncode not in (0, None):
            raise RuntimeError(f"{self.what} exited with status {self.popen.returncode}: "
                               f"{err[-2000:]}")
        return out.strip().splitlines()[-1] if out.strip() else ""

    def kill(self) -> None:
        """End it whatever its state (cleanup)."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.communicate()


Enter = Callable[[str, list[str]], list[str]]  # (netns, argv) -> argv that runs there


def echo_server(enter: Enter, netns: str, port: int) -> _Process:
    """A TCP echo server on `port` (IPv4 and IPv6) in `netns`, ready; `stop()` ends it."""
    return _Process(enter(netns, [sys.executable, "-I", "-c", _SERVER, str(port)]),
                    f"the echo server in {netns}")


class LiveTraffic:
    """Long-lived connections and a probe from `netns` to each address, running."""

    def __init__(self, enter: Enter, netns: str, addresses: Sequence[str], port: int) -> None:
        self.addresses = list(addresses)
        self.process = _Process(enter(netns, [sys.executable, "-I", "-c", _CLIENT, str(port),
                                              str(PERIOD_S), *self.addresses]),
                                f"the connections from {netns} to {', '.join(self.addresses)}")

    def check_alive(self) -> None:
        """Raise if the client exited early."""
        self.process.check_alive()

    def stop(self) -> Traffic:
        """End the flows; what each saw."""
        flows: list[dict[str, Any]] = json.loads(self.process.stop())
        return Traffic([Flow(**flow) for flow in flows])

    def kill(self) -> None:
        """End it whatever its state (cleanup)."""
        self.process.kill()
