"""Real packets between network namespaces: listeners that record what reaches them, senders,
ping, and the nft counters of a node (read with the `nft` executable, not the plugin's code).

Listeners, senders and a tap's guest are sockets and fds this process opens inside the netns
(a socket keeps the netns it was made in), not processes: in the emulated full-kernel VM a
Python process start costs seconds (11.6 s for one sender once, beside the native tests), and
galactic's two-node test alone started some 70 of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cni_plugin.kernel.netns import entered
from e2e.harness.wait import wait_until

# How long a ping may run beyond its own wait before the test calls it hung, and how long a
# listener waits for what a test expects to reach it (delivery itself takes milliseconds): only
# a failing test waits this long.
SEND_TIMEOUT = 60.0
# A listener's loop wakes this often to see whether it should stop.
POLL_S = 0.05
IP_PKTINFO = 8
IP_TRANSPARENT, IPV6_TRANSPARENT = 19, 75
TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000


def in_netns(netns: str, *argv: str) -> list[str]:
    """argv run in the named netns (a name or a /var/run/netns path)."""
    return ["ip", "netns", "exec", os.path.basename(netns), *argv]


def netns_path(netns: str) -> str:
    """The path of a netns given by name or path."""
    return netns if netns.startswith("/") else f"/var/run/netns/{netns}"


def socket_in(netns: str, family: int, kind: str) -> socket.socket:
    """A UDP or TCP socket living in netns, made by this process (no process started: under
    emulation a Python process costs seconds, and a socket keeps the netns it was made in)."""
    with entered(netns_path(netns)):
        return socket.socket(family, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)


class Listener:
    """A UDP or TCP listener in a netns, served by a thread of this process; `received` is what
    reached it (peer, payload)."""

    def __init__(self, socks: list[socket.socket], kind: str, answer: bool, out: Path) -> None:
        self._socks = socks
        self._kind = kind
        self._answer = answer
        self.out = out  # what arrived, one line each (kept for a failure's post-mortem)
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"listener-{out.stem}")
        self._thread.start()

    def received(self) -> list[tuple[str, str]]:
        """(peer address, payload) of everything received so far."""
        with self._lock:
            lines = list(self._lines)
        return [(line.split(" ", 1)[0].removeprefix("::ffff:"), line.split(" ", 1)[1])
                for line in lines]

    def payloads(self) -> set[str]:
        """The payloads received so far."""
        return {payload for _, payload in self.received()}

    def wait_for(self, payload: str, timeout: float = SEND_TIMEOUT) -> None:
        """Until payload has arrived."""
        wait_until(f"{payload!r} at the listener", lambda: payload in self.payloads(), timeout)

    def close(self) -> None:
        """Stop serving and close the sockets."""
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self._socks:
            sock.close()

    def _note(self, peer: str, data: bytes) -> None:
        line = f"{peer} {data.decode(errors='replace')}"
        with self._lock:
            self._lines.append(line)
        with open(self.out, "a") as sink:
            sink.write(line + "\n")

    def _serve(self) -> None:
        while not self._stop.is_set():
            for sock in select.select(self._socks, [], [], POLL_S)[0]:
                with contextlib.suppress(OSError):  # a peer gone mid-exchange ends only it
                    self._serve_one(sock)

    def _serve_one(self, sock: socket.socket) -> None:
        if self._kind == "udp":
            data, ancillary, _, peer = sock.recvmsg(2048, 256)
            self._note(peer[0], data)
            if self._answer:
                _answer_from_the_address_asked(sock, data, ancillary, peer)
            return
        conn, peer = sock.accept()
        with conn:
            conn.settimeout(5)
            data = conn.recv(2048)
            self._note(peer[0], data)
            if self._answer:
                conn.sendall(b"re:" + data)


def _answer_from_the_address_asked(sock: socket.socket, data: bytes,
                                   ancillary: list[tuple[int, int, bytes]],
                                   peer: tuple[str, int]) -> None:
    """Answer "re:<payload>" from the address the datagram was sent to (IP_PKTINFO /
    IPV6_PKTINFO, as DNS servers do; no interface, so routing picks the way back)."""
    level, ctype, info = ancillary[0]
    info = struct.pack("i4s4s", 0, info[8:12], bytes(4)) if ctype == IP_PKTINFO \
        else info[:16] + struct.pack("i", 0)
    sock.sendmsg([b"re:" + data], [(level, ctype, info)], 0, peer)


def _listening_sockets(netns: str, kind: str, port: int, answer: bool,
                       device: str) -> list[socket.socket]:
    """A listener binds the wildcard of both families on one socket; an answering one binds one
    socket per family (to `device` when given) and asks for each datagram's destination."""
    if not answer:
        sock = socket_in(netns, socket.AF_INET6, kind)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        return [sock]
    socks = []
    for family in (socket.AF_INET, socket.AF_INET6):
        sock = socket_in(netns, family, kind)
        socks.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if device:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if kind == "udp":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        elif kind == "udp":
            sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    return socks


@contextmanager
def listener(netns: str, kind: str, port: int, work: Path, answer: bool = False,
             device: str = "") -> Iterator[Listener]:
    """A listener bound to the wildcard address of netns (both families); with answer, it also
    answers each datagram or connection with "re:<payload>", and with device it is bound to
    that device (a VRF: it serves only that VRF). Bound before this returns: nothing to wait
    for."""
    assert answer or not device, "only the answering listener binds to a device"
    out = work / f"listener-{kind}-{port}-{device}-{os.path.basename(netns)}.txt"
    out.write_text("")
    socks: list[socket.socket] = []
    try:
        socks = _listening_sockets(netns, kind, port, answer, device)
        if kind == "tcp":
            for sock in socks:
                sock.listen(16)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    running = Listener(socks, kind, answer, out)
    try:
        yield running
    finally:
        running.close()


def send(netns: str, kind: str, dst: str, port: int, payload: str, source: str = "",
         timeout: float = 2.0) -> bool:
    """Send one UDP datagram, or connect and send over TCP (False: the connection failed).

    Over TCP it returns once the peer closed the connection (a listener here closes it after
    noting the payload) or `timeout` passed: a caller that reads the listeners right after
    finds what arrived, as it did when a sender was a process that took seconds to exit."""
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with socket_in(netns, family, kind) as sock:
        sock.settimeout(timeout)
        try:
            if source:  # IP_TRANSPARENT / IPV6_TRANSPARENT: a source the netns does not own
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
                else:
                    sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
                sock.bind((source, 0))
            if kind == "udp":
                sock.sendto(payload.encode(), (dst, port))
            else:
                sock.connect((dst, port))
                sock.sendall(payload.encode())
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            return False
        if kind == "tcp":
            with contextlib.suppress(OSError):  # a reset or the timeout: it was sent all the same
                while sock.recv(2048):
                    pass
    return True


def ask(netns: str, kind: str, dst: str, port: int, payload: str, timeout: float = 3.0
        ) -> str | None:
    """Send payload (UDP datagram, or over a TCP connection) and return the answer received
    within timeout (None: no answer, or the connection failed)."""
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with socket_in(netns, family, kind) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((dst, port))
            sock.sendall(payload.encode())
            return sock.recv(2048).decode(errors="replace")
        except OSError:
            return None


def write_tap_frames(netns: str, tap: str, frames: list[bytes]) -> None:
    """Write Ethernet frames into a tap of netns as its guest would (its queue opened by this
    process: /dev/net/tun finds the tap by name in the netns it was opened in)."""
    with entered(netns_path(netns)):
        fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
        for frame in frames:
            os.write(fd, frame)
    finally:
        os.close(fd)


def ping(netns: str, dst: str, *extra: str, count: int = 1, wait: float = 2.0) -> bool:
    """Whether dst answered (ping -c count -W wait)."""
    done = subprocess.run(in_netns(netns, "ping", "-n", "-q", "-c", str(count), "-W",
                                   str(wait), *extra, dst),
                          capture_output=True, text=True, timeout=SEND_TIMEOUT + count * wait,
                          check=False)
    return done.returncode == 0


def nft_counters(netns: str) -> dict[str, int]:
    """Packets per named counter of `inet vpc_attach` in netns (empty without the table)."""
    done = subprocess.run(in_netns(netns, "nft", "-j", "list", "counters", "table", "inet",
                                   "vpc_attach"), capture_output=True, text=True, timeout=20,
                          check=False)
    if done.returncode != 0:
        return {}
    return {item["counter"]["name"]: int(item["counter"]["packets"])
            for item in json.loads(done.stdout)["nftables"] if "counter" in item}


def nft_table(netns: str) -> str:
    """`nft list table inet vpc_attach` in netns."""
    return subprocess.run(in_netns(netns, "nft", "list", "table", "inet", "vpc_attach"),
                          capture_output=True, text=True, timeout=20, check=True).stdout


def wait_counter_above(netns: str, name: str, before: int, timeout: float = 10.0) -> int:
    """Until counter name exceeds before; its value."""
    wait_until(f"nft counter {name} above {before}",
               lambda: nft_counters(netns).get(name, 0) > before, timeout)
    return nft_counters(netns)[name]
