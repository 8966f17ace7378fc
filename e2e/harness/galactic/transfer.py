"""A bulk TCP transfer between two netns (iperf3) and what it cost the underlay: the counts a
test asserts on (bytes, retransmissions, `tx_dropped` of the underlay links) and the rate the
bench reports; a link's offloads as the real `ethtool -k` reads them."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.kernel import run_ip
from e2e.harness.packets import in_netns
from e2e.harness.wait import wait_until

IPERF_PORT = 5201
LISTEN_TIMEOUT_S = 60.0  # iperf3's start under emulation
MSS_OVERHEAD = 40  # IPv4 + TCP headers: a segment's payload is the MTU less this (no options)


@dataclass(frozen=True)
class Transfer:
    """One iperf3 stream's outcome and the underlays' drops meanwhile (node order as asked)."""

    gbits: float  # received
    sent_bytes: int
    retransmits: int
    drops: tuple[int, ...]

    def segments(self, mtu: int) -> int:
        """Segments the sender sent, at least (payload bytes / the largest segment)."""
        return max(1, self.sent_bytes // (mtu - MSS_OVERHEAD))


def tx_dropped(netns: str, link: str) -> int:
    """The link's `tx_dropped` (`ip -s link`)."""
    shown = json.loads(run_ip("-n", netns, "-s", "-j", "link", "show", "dev", link))
    return int(shown[0]["stats64"]["tx"]["dropped"])


def transfer(client: str, server: str, address: str, seconds: int,
             underlays: Sequence[tuple[str, str]]) -> Transfer:
    """One iperf3 stream of `seconds` from netns `client` to an iperf3 server in `server` on
    `address`, with the `tx_dropped` delta of each (netns, link) of `underlays`."""
    before = [tx_dropped(netns, link) for netns, link in underlays]
    with subprocess.Popen(in_netns(server, "iperf3", "-s", "-1", "-B", address, "-p",
                                   str(IPERF_PORT)), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as listening:
        try:
            wait_until("iperf3 listening", lambda: f":{IPERF_PORT}" in subprocess.run(
                in_netns(server, "ss", "-ltn"), capture_output=True, text=True,
                check=False).stdout, LISTEN_TIMEOUT_S)
            out = subprocess.run(in_netns(client, "iperf3", "-J", "-c", address, "-p",
                                          str(IPERF_PORT), "-t", str(seconds)),
                                 capture_output=True, text=True, timeout=seconds + 120,
                                 check=True).stdout
        finally:
            listening.kill()
    end = json.loads(out)["end"]
    return Transfer(float(end["sum_received"]["bits_per_second"]) / 1e9,
                    int(end["sum_sent"]["bytes"]), int(end["sum_sent"].get("retransmits", 0)),
                    tuple(tx_dropped(netns, link) - was
                          for (netns, link), was in zip(underlays, before, strict=True)))


def claimed_drops(pin_dir: Path) -> int:
    """Packets galactic's programs claimed and dropped, summed over `vrf_table`'s rows
    (`dropped_packets`, the value's bytes 40-47: usid.c's `struct vrf_value`)."""
    dumped = subprocess.run(["bpftool", "-j", "map", "dump", "pinned",
                             str(pin_dir / "vrf_table")], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    return sum(int.from_bytes(bytes(int(b, 16) for b in entry["value"][40:48]), "little")
               for entry in json.loads(dumped or "[]"))


def offloads(netns: str, link: str = "eth0") -> dict[str, str]:
    """`ethtool -k` of a link in netns: {feature: "on" | "off"} ("[fixed]" dropped)."""
    shown = subprocess.run(in_netns(netns, "ethtool", "-k", link), capture_output=True,
                           text=True, timeout=30, check=True)
    return dict(re.findall(r"^\s*([\w-]+): (on|off)", shown.stdout, re.M))


def set_offloads(netns: str, *features: str, link: str = "eth0") -> None:
    """`ethtool -K link feature on|off ...` in netns."""
    subprocess.run(in_netns(netns, "ethtool", "-K", link, *features), check=True,
                   capture_output=True, timeout=30)
