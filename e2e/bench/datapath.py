"""`python -m e2e.bench.datapath [--attachments N] [--vpcs M] [--seconds S] [--rounds R]`
(as root): forwarding cost between two Pods of one VPC as other attachments come and go.

Three node network namespaces of their own (nothing is installed in the host's), `isolation:
table`, host protection in place, each with the two measured Pods: alone; with N tap
attachments of M other VPCs (made first, so the measured VPC's rules come after theirs); with
N attachments made and deleted again (retired). They are measured round-robin, so a shared
machine's drift hits every row alike: TCP throughput with iperf3 and RTT with ping, directions
alternating. A report, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.harness.cnibin import populate
from e2e.harness.kernel import run_ip
from e2e.harness.packets import in_netns
from e2e.harness.plugin import Plugin, base_conf, with_prev
from e2e.harness.wait import wait_until

MEASURED_VPC = "zz"
IPERF_PORT = 5201


@dataclass(frozen=True)
class Row:
    """One measurement."""

    label: str
    attachments: int
    rules: int
    gbits: float
    rtt_us: float
    rtt_stdev_us: float


def _machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"nproc {os.cpu_count()}, {model}, Linux {platform.release()}"


class Bench:
    """The node, its Pods and the other attachments."""

    def __init__(self, stack: ExitStack, work: Path, plugin_dir: Path) -> None:
        self.stack = stack
        self.work = work
        self.node = f"vpab-dp-{secrets.token_hex(3)}"
        self._netns(self.node)
        lock_dir = work / "locks"
        lock_dir.mkdir()
        self.plugin = Plugin(cni_bin=plugin_dir, lock_dir=lock_dir, prefix=in_netns(self.node))
        self.attached: list[tuple[dict[str, Any], str, str]] = []

    def _netns(self, name: str) -> str:
        run_ip("netns", "add", name)
        self.stack.callback(run_ip, "netns", "del", name, check=False)
        run_ip("-n", name, "link", "set", "lo", "up")
        return f"/var/run/netns/{name}"

    def add(self, conf: dict[str, Any], container: str, netns: str = "") -> dict[str, Any]:
        """ADD, remembered for DEL."""
        result: dict[str, Any] = self.plugin.ok("ADD", conf, container_id=container,
                                                netns=netns)
        self.attached.append((with_prev(conf, result), container, netns))
        return result

    def pod(self, att: str, v4: str, v6: str) -> str:
        """A veth Pod of the measured VPC; its netns name."""
        name = f"{self.node}-p{att}"
        netns = f"/var/run/netns/{name}"
        if not os.path.exists(netns):
            self._netns(name)
        self.add(base_conf(MEASURED_VPC, att, ipam={"type": "static", "addresses": [
            {"address": f"{v4}/32", "gateway": "10.77.0.1"},
            {"address": f"{v6}/128", "gateway": "fd77::1"}]}), name, netns)
        return name

    def others(self, count: int, vpcs: int) -> None:
        """count tap attachments spread over vpcs other VPCs."""
        vms = f"/var/run/netns/{self.node}-vms"
        if not os.path.exists(vms):
            self._netns(f"{self.node}-vms")
        for index in range(count):
            vpc = f"o{index % vpcs}"
            att = str(index // vpcs + 1)
            self.add(base_conf(vpc, att, attachment="tap", ipam={"type": "static", "addresses": [
                {"address": f"10.{100 + index // 250}.{index % 250}.2/32",
                 "gateway": f"10.{100 + index // 250}.{index % 250}.1"}]}), f"tap-{index}",
                vms)  # the VMs' netns (CNI_NETNS is required; a tap lives on the node)

    def delete_others(self) -> None:
        """DEL of every tap (their VPCs' state goes with the last one)."""
        for conf, container, netns in [a for a in self.attached if a[1].startswith("tap-")]:
            self.plugin.ok("DEL", conf, container_id=container, netns=netns)
            self.attached.remove((conf, container, netns))

    def rules(self) -> int:
        """Policy rules of both families in the node."""
        return sum(len(run_ip("-n", self.node, family, "rule").splitlines())
                   for family in ("-4", "-6"))

    def close(self) -> None:
        """DEL of everything still attached."""
        for conf, container, netns in reversed(self.attached):
            self.plugin.call("DEL", conf, container_id=container, netns=netns)


def throughput(client: str, server: str, address: str, seconds: float) -> float:
    """Gbit/s of one iperf3 TCP run client -> server."""
    proc = subprocess.Popen(in_netns(server, "iperf3", "-s", "-1", "-p", str(IPERF_PORT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until("iperf3 server", lambda: f":{IPERF_PORT} " in subprocess.run(
            in_netns(server, "ss", "-Hltn"), capture_output=True, text=True,
            check=False).stdout, 10)
        done = subprocess.run(in_netns(client, "iperf3", "-c", address, "-p", str(IPERF_PORT),
                                       "-t", str(seconds), "-J"),
                              capture_output=True, text=True, timeout=seconds + 30, check=True)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    return float(json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"]) / 1e9


def rtt(client: str, address: str, count: int) -> tuple[float, float]:
    """Median and standard deviation of ping's RTTs, µs (the median: a shared machine's
    scheduling hiccups make the mean jump)."""
    done = subprocess.run(in_netns(client, "ping", "-n", "-c", str(count), "-i", "0.002",
                                   address), capture_output=True, text=True,
                          timeout=count * 0.1 + 30, check=True)
    samples = [float(line.split("time=")[1].split()[0]) * 1000
               for line in done.stdout.splitlines() if "time=" in line]
    return statistics.median(samples), statistics.stdev(samples)


def sample(bench: Bench, number: int, seconds: float) -> tuple[float, float, float]:
    """One throughput run and one RTT run between the node's two Pods (direction alternating
    with number): Gbit/s, RTT median and stdev µs."""
    a, b = f"{bench.node}-p1", f"{bench.node}-p2"
    client, server, address = (a, b, "10.77.0.3") if number % 2 == 0 else (b, a, "10.77.0.2")
    median, stdev = rtt(client, address, 500)
    return throughput(client, server, address, seconds), median, stdev


def main(argv: list[str] | None = None) -> int:
    """Build the three nodes, measure them round-robin, print a markdown table."""
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.datapath", description=__doc__)
    parser.add_argument("--attachments", type=int, default=500)
    parser.add_argument("--vpcs", type=int, default=50, help="other VPCs they belong to")
    parser.add_argument("--seconds", type=float, default=5.0, help="per iperf3 run")
    parser.add_argument("--rounds", type=int, default=5, help="runs per row (median)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from e2e.harness.tools.gotools import reference_plugins_dir
    labels = {"alone": "two Pods alone",
              "others": f"+{args.attachments} attachments of {args.vpcs} other VPCs",
              "retired": f"after DEL of {args.attachments} attachments of {args.vpcs} VPCs"}
    with tempfile.TemporaryDirectory(prefix="vpab-dp-") as tmp, ExitStack() as stack:
        plugin_dir = populate(Path(tmp) / "bin", reference_plugins_dir())
        nodes: dict[str, Bench] = {}
        for key in labels:
            (Path(tmp) / key).mkdir()
            nodes[key] = Bench(stack, Path(tmp) / key, plugin_dir)
            stack.callback(nodes[key].close)
        for key in ("others", "retired"):
            nodes[key].others(args.attachments, args.vpcs)
        for bench in nodes.values():  # the measured VPC last: its rules after the others'
            bench.pod("1", "10.77.0.2", "fd77::2")
            bench.pod("2", "10.77.0.3", "fd77::3")
        nodes["retired"].delete_others()
        samples: dict[str, list[tuple[float, float, float]]] = {key: [] for key in labels}
        keys = list(labels)
        for number in range(args.rounds):  # interleaved: drift on a shared machine hits all
            for key in keys[number % 3:] + keys[:number % 3]:
                samples[key].append(sample(nodes[key], number, args.seconds))
        rows = [Row(labels[key], args.attachments if key == "others" else 0, nodes[key].rules(),
                    statistics.median(s[0] for s in samples[key]),
                    statistics.median(s[1] for s in samples[key]),
                    statistics.median(s[2] for s in samples[key])) for key in labels]
    base = rows[0]
    print(f"\n{_machine()}; three nodes measured round-robin, {args.rounds} rounds of iperf3 "
          f"{args.seconds:g} s + ping 500 x 2 ms each; medians\n")
    print("| row | policy rules (v4+v6) | TCP Gbit/s | vs alone | RTT µs median (stdev) "
          "| Δ RTT µs |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row.label} | {row.rules} | {row.gbits:.2f} | {row.gbits / base.gbits:.2f}x "
              f"| {row.rtt_us:.1f} ({row.rtt_stdev_us:.1f}) | {row.rtt_us - base.rtt_us:+.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
