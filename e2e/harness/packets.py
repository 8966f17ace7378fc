"""Real packets between network namespaces: listeners that record what reaches them, senders,
ping, and the nft counters of a node (read with the `nft` executable, not the plugin's code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from e2e.harness.wait import wait_until

# How long a sender, asker or ping may run beyond its own socket timeout before the test calls it
# hung. Only a hang waits this long; a sender that could not send says so within its timeout.
# A sender or listener is a Python process started in a namespace: well under a second natively,
# but 11.6 s once in the emulated VM while the native tests kept both cores busy (CI,
# test_datapath[vrf]; a listener's ready line missed a 10 s bound the same way). A listener's
# wait ends early when its process dies.
SEND_TIMEOUT = 60.0
LISTENER_READY_S = 60.0

# Binds the wildcard (v4 and v6), prints one line per datagram or connection, flushed.
_LISTENER = r"""
import socket, sys
kind, port = sys.argv[1], int(sys.argv[2])
sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("::", port))
if kind == "tcp":
    sock.listen(16)
print("ready", flush=True)
while True:
    if kind == "udp":
        data, peer = sock.recvfrom(2048)
        print(peer[0], data.decode(errors="replace"), flush=True)
    else:
        conn, peer = sock.accept()
        data = conn.recv(2048)
        print(peer[0], data.decode(errors="replace"), flush=True)
        conn.close()
"""

# Like _LISTENER, but answers "re:<payload>" to each datagram (from the address it was sent
# to, IP_PKTINFO/IPV6_PKTINFO, as DNS servers do; no interface, so routing picks the way back)
# or connection; two sockets, one per family; bound to a device (a VRF) when one is given.
_ECHO = r"""
import select, socket, struct, sys
kind, port, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
IP_PKTINFO = 8
socks = []
for family in (socket.AF_INET, socket.AF_INET6):
    sock = socket.socket(family, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
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
    if kind == "tcp":
        sock.listen(16)
    socks.append(sock)
print("ready", flush=True)
while True:
    for sock in select.select(socks, [], [])[0]:
        if kind == "udp":
            data, anc, _, peer = sock.recvmsg(2048, 256)
            print(peer[0], data.decode(errors="replace"), flush=True)
            level, ctype, info = anc[0]
            info = struct.pack("i4s4s", 0, info[8:12], bytes(4)) if ctype == IP_PKTINFO \
                else info[:16] + struct.pack("i", 0)
            sock.sendmsg([b"re:" + data], [(level, ctype, info)], 0, peer)
        else:
            conn, peer = sock.accept()
            conn.settimeout(5)
            data = conn.recv(2048)
            print(peer[0], data.decode(errors="replace"), flush=True)
            conn.sendall(b"re:" + data)
            conn.close()
"""

# Sends one datagram (or connects and sends) and prints the answer: "answer <text>" or "none".
_ASKER = r"""
import socket, sys
kind, dst, port, payload = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode()
family = socket.AF_INET6 if ":" in dst else socket.AF_INET
sock = socket.socket(family, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
sock.settimeout(float(sys.argv[5]))
try:
    sock.connect((dst, port))
    sock.sendall(payload)
    print("answer", sock.recv(2048).decode(errors="replace"))
except OSError as exc:
    print("none", exc)
"""

_SENDER = r"""
import socket, sys
kind, dst, port, payload = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode()
src = sys.argv[5] if len(sys.argv) > 5 else ""
family = socket.AF_INET6 if ":" in dst else socket.AF_INET
sock = socket.socket(family, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
sock.settimeout(float(sys.argv[6]) if len(sys.argv) > 6 else 2.0)
if src:  # IP_TRANSPARENT / IPV6_TRANSPARENT: send from a source the namespace does not own
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, 75, 1)
    else:
        sock.setsockopt(socket.SOL_IP, 19, 1)
    sock.bind((src, 0))
try:
    if kind == "udp":
        sock.sendto(payload, (dst, port))
    else:
        sock.connect((dst, port))
        sock.sendall(payload)
    print("sent")
except OSError as exc:
    print("failed", exc)
"""


def in_netns(netns: str, *argv: str) -> list[str]:
    """argv run in the named netns (a name or a /var/run/netns path)."""
    return ["ip", "netns", "exec", os.path.basename(netns), *argv]


class Listener:
    """A UDP or TCP listener in a netns; `lines` is what reached it (peer, payload)."""

    def __init__(self, proc: subprocess.Popen[str], out: Path) -> None:
        self.proc = proc
        self.out = out

    def received(self) -> list[tuple[str, str]]:
        """(peer address, payload) of everything received so far."""
        lines = self.out.read_text().splitlines()[1:]
        return [(line.split(" ", 1)[0].removeprefix("::ffff:"), line.split(" ", 1)[1])
                for line in lines if " " in line]

    def payloads(self) -> set[str]:
        """The payloads received so far."""
        return {payload for _, payload in self.received()}

    def wait_for(self, payload: str, timeout: float = SEND_TIMEOUT) -> None:
        """Until payload has arrived."""
        wait_until(f"{payload!r} at the listener", lambda: payload in self.payloads(), timeout)


@contextmanager
def listener(netns: str, kind: str, port: int, work: Path, answer: bool = False,
             device: str = "") -> Iterator[Listener]:
    """A listener bound to the wildcard address of netns (both families); with answer, it also
    answers each datagram or connection with "re:<payload>", and with device it is bound to
    that device (a VRF: it serves only that VRF)."""
    assert answer or not device, "only the answering listener binds to a device"
    out = work / f"listener-{kind}-{port}-{device}-{os.path.basename(netns)}.txt"
    script, argv = (_ECHO, [device]) if answer else (_LISTENER, [])
    with open(out, "w") as sink:
        proc = subprocess.Popen(in_netns(netns, sys.executable, "-c", script, kind, str(port),
                                         *argv),
                                stdout=sink, stderr=subprocess.STDOUT, text=True)
    def alive() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} listener on {port} exited ({proc.returncode}): "
                               f"{out.read_text().strip()}")

    try:
        wait_until(f"{kind} listener on {port}", lambda: out.read_text().startswith("ready"),
                   LISTENER_READY_S, alive=alive)
        yield Listener(proc, out)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def send(netns: str, kind: str, dst: str, port: int, payload: str, source: str = "",
         timeout: float = 2.0) -> bool:
    """Send one UDP datagram, or connect and send over TCP (False: the connection failed)."""
    done = subprocess.run(in_netns(netns, sys.executable, "-c", _SENDER, kind, dst, str(port),
                                   payload, source, str(timeout)),
                          capture_output=True, text=True, timeout=SEND_TIMEOUT + timeout,
                          check=False)
    return done.stdout.startswith("sent")


def ask(netns: str, kind: str, dst: str, port: int, payload: str, timeout: float = 3.0
        ) -> str | None:
    """Send payload (UDP datagram, or over a TCP connection) and return the answer received
    within timeout (None: no answer, or the connection failed)."""
    done = subprocess.run(in_netns(netns, sys.executable, "-c", _ASKER, kind, dst, str(port),
                                   payload, str(timeout)),
                          capture_output=True, text=True, timeout=SEND_TIMEOUT + timeout,
                          check=False)
    return done.stdout.removeprefix("answer ").rstrip("\n") \
        if done.stdout.startswith("answer ") else None


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
