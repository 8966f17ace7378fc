"""A stand-in for a VM on a vpc-attach tap (KubeVirt and qemu do not run here).

qemu's tap backend opens the host's tap and copies frames between it and the guest's virtio
NIC. Here the guest's kernel is a network namespace whose NIC is a tap of its own, and a small
relay process does qemu's copying between the two taps, frame by frame, in both directions.
The guest gets the addresses and default routes an IPAM result gives the VM (as cloud-init
would), so its own kernel answers ARP, ND, ping and TCP like a VM's would.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from e2e.harness.kernel import temporary_netns
from e2e.harness.wait import wait_until

GUEST_NIC = "eth0"
READY_S = 60.0  # a Python process started under emulation while both cores are busy

# argv: host tap, guest netns path, guest tap name. Run as a process of the node: opens the
# host tap there and brings it up, then makes the guest's tap inside the guest's netns
# (TUNSETIFF makes a tap in the calling thread's netns) and copies frames until killed.
_RELAY = r"""
import ctypes, fcntl, os, select, struct, subprocess, sys
host_tap, guest_ns, guest_tap = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
def enter(path):
    fd = os.open(path, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "setns " + path)
    os.close(fd)
def tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH22x", name.encode(), 0x0002 | 0x1000))
    return fd
host = tap(host_tap)
subprocess.run(["ip", "link", "set", host_tap, "up"], check=True)
enter(guest_ns)
guest = tap(guest_tap)
print("ready", flush=True)
peer = {host: guest, guest: host}
while True:
    readable, _, _ = select.select([host, guest], [], [])
    for fd in readable:
        try:
            os.write(peer[fd], os.read(fd, 65536))
        except OSError:
            pass  # the other side is down for a moment: a lost frame, as on a wire
"""


@dataclass
class Guest:
    """The VM stand-in: its namespace (its kernel), addresses and the relay."""

    netns: str  # name (``ip netns``)
    path: str
    addresses: list[str]  # without prefix length

    def ip(self, version: int) -> str:
        """Its address of that IP version."""
        return next(a for a in self.addresses if ipaddress.ip_address(a).version == version)


def _ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True, timeout=30)


def _configure(netns: str, result: dict[str, Any], mtu: int | None) -> list[str]:
    """The guest's NIC as a VM configures it from the IPAM result: each address alone (no
    neighbour on the link but the gateway), a default route per family via the gateway."""
    _ip(netns, "link", "set", "lo", "up")
    if mtu:
        _ip(netns, "link", "set", GUEST_NIC, "mtu", str(mtu))
    _ip(netns, "link", "set", GUEST_NIC, "up")
    addresses = []
    for entry in result.get("ips", []):
        interface = ipaddress.ip_interface(entry["address"])
        host = ipaddress.ip_interface(f"{interface.ip}/{interface.max_prefixlen}")
        _ip(netns, "addr", "add", str(host), "dev", GUEST_NIC, "nodad")
        addresses.append(str(interface.ip))
        if entry.get("gateway"):
            _ip(netns, f"-{interface.version}", "route", "add", "default", "via",
                entry["gateway"], "dev", GUEST_NIC, "onlink")
    return addresses


@contextlib.contextmanager
def guest_on_tap(tap: str, result: dict[str, Any], *, node_prefix: list[str] | None = None,
                 mtu: int | None = None) -> Iterator[Guest]:
    """A VM stand-in on the host tap ``tap`` (which must exist; brought up here), configured
    from ``result`` (what ADD answered). ``node_prefix`` runs the relay as a process of a
    simulated node (``in_netns(node)``, ``DatapathNode.prefix``). Everything is removed
    afterwards."""
    with temporary_netns("vpa-guest") as path:
        netns = path.rsplit("/", 1)[-1]
        relay = subprocess.Popen(
            [*(node_prefix or []), sys.executable, "-c", _RELAY, tap, path, GUEST_NIC],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert relay.stdout is not None
            line = relay.stdout.readline()
            if line.strip() != "ready":
                problem = relay.stderr.read() if relay.stderr else ""
                raise RuntimeError(f"the tap relay did not start: {problem}")
            wait_until(f"the guest's {GUEST_NIC}", lambda: subprocess.run(
                ["ip", "-n", netns, "link", "show", GUEST_NIC], capture_output=True,
                timeout=30).returncode == 0, READY_S)
            yield Guest(netns, path, _configure(netns, result, mtu))
        finally:
            relay.kill()
            relay.wait(timeout=30)
