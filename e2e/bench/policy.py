"""`python -m e2e.bench.policy [--pods 100] [--policies 100] [--changes 50] [--adds 30]
[--seconds 5] [--rounds 3]` (as root): policy inside a VPC (SPEC §17), side by side in one run.

One control plane of its own and one node network namespace (nothing installed in the host's),
vpc-attach with its agent, `isolation: table`. Three rows:

- change → enforced: with `--pods` Pods and `--policies` policies on the node, a client Pod's
  label is set (its server's policy admits the label) and taken away again, `--changes` times.
  A prober in the client sends a datagram every 2 ms, each from a fresh socket (a new
  connection every time, so conntrack never lets one through on an old decision); the time
  from the API's answer to the label write until the first datagram reaches the server is
  the change enforced, packets and all (the agent's own `vpc_attach_policy_sync_seconds`,
  change seen → rules written, beside it).
- ADD through the agent with 0 and with `--policies` policies selecting the Pod, interleaved,
  `--adds` each (a full ADD: IPAM, links, the EndpointSlice; the policies read from the
  agent's caches, compiled and written into the Pod's netns before the answer).
- TCP throughput (iperf3) between two Pods with no policy, and with 1,000 allow rules in the
  server's table (100 policies of 10 rules, each its own port), rounds alternating.

Machine (`nproc`, CPU model, load) with every row; a report, nothing asserted.
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
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from e2e.bench.stats import percentile
from e2e.harness.agentproc import OwnAgents
from e2e.harness.cluster import Cluster
from e2e.harness.cnibin import populate
from e2e.harness.packets import in_netns
from e2e.harness.plugin import random_vpc
from e2e.harness.policyscene import (
    Scene,
    manifest_nad,
    manifest_namespace,
    manifest_pod,
    manifest_policy,
    policy_node,
    scrape,
)
from e2e.harness.tenancy import create_binding
from e2e.harness.wait import wait_until

RESULTS = Path(__file__).resolve().parent / "results"
IPERF_PORT = 5201
PROBE_PORT = 9000

# Every 2 ms a datagram from a fresh socket, its send time in it.
_PROBER = r"""
import socket, sys, time
dst, port = sys.argv[1], int(sys.argv[2])
print("started", flush=True)
while True:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.sendto(f"{time.time():.6f}".encode(), (dst, port))
    except OSError:
        pass
    sock.close()
    time.sleep(0.002)
"""
# Prints the arrival time of every datagram.
_CATCHER = r"""
import socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    sock.recv(64)
    print(f"{time.time():.6f}", flush=True)
"""


def machine() -> str:
    """nproc, CPU model, kernel, load."""
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return (f"nproc {os.cpu_count()}, {model}, Linux {platform.release()}, load "
            f"{os.getloadavg()[0]:.1f}")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Bench:
    """The control plane, the node and its agent, the scene of the measured VPC."""

    def __init__(self, stack: ExitStack, work: Path, options: argparse.Namespace) -> None:
        self.options = options
        self.cluster = Cluster.up(work / "cluster")
        stack.callback(self.cluster.down)
        self.kube = stack.enter_context(self.cluster.admin())
        from e2e.harness.tools.gotools import reference_plugins_dir
        cni_bin = populate(work / "cni-bin", reference_plugins_dir())
        self.node = stack.enter_context(policy_node(
            self.cluster, cni_bin, work / "node", OwnAgents(), via_agent=True))
        self.vpc = random_vpc()
        create_binding(self.kube, self.vpc, name=f"bench-{self.vpc.lower()}")
        self.scene = Scene(self.kube, self.node, self.vpc, work / "scene")
        stack.callback(self.scene.close)
        self.namespace = f"bench-{secrets.token_hex(3)}"
        self.scene.namespace(manifest_namespace(self.namespace))
        self.scene.nad(manifest_nad("bench-net", "10.90.0.0/16"))

    def pod(self, name: str, labels: dict[str, str], namespace: str | None = None,
            listen: tuple[tuple[str, int], ...] = ()) -> Any:
        return self.scene.pod(manifest_pod(name, namespace or self.namespace, labels,
                                           "default/bench-net", listen=listen))

    def policy(self, name: str, spec: dict[str, Any], namespace: str | None = None) -> str:
        return self.scene.policy(manifest_policy(name, namespace or self.namespace,
                                                 "default/bench-net", spec))


def change_to_enforced(bench: Bench) -> dict[str, Any]:
    """The label toggles, measured with packets."""
    options = bench.options
    log(f"change→enforced: {options.pods} Pods, {options.policies} policies")
    for index in range(options.pods - 2):
        bench.pod(f"p{index}", {"app": f"a{index % 10}", "tier": f"t{index % 7}"})
    for index in range(options.policies - 1):
        bench.policy(f"pol{index}", {
            "podSelector": {"matchLabels": {"app": f"a{index % 10}"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": f"t{index % 7}"}}}],
                         "ports": [{"port": 7000 + index}]}]})
    bench.pod("server", {"role": "server"})
    client = bench.pod("client", {"role": "none"})
    bench.policy("server", {"podSelector": {"matchLabels": {"role": "server"}},
                            "ingress": [{"from": [{"podSelector": {
                                "matchLabels": {"role": "probe"}}}]}]})
    server = bench.scene.pods[(bench.namespace, "server")]
    address = bench.scene.address(bench.namespace, "server")
    before = scrape(bench.node)
    with ExitStack() as stack:
        catcher = stack.enter_context(process(in_netns(server.netns, sys.executable, "-c",
                                                       _CATCHER, str(PROBE_PORT)), "ready"))
        stack.enter_context(process(in_netns(client.netns, sys.executable, "-c", _PROBER,
                                             address, str(PROBE_PORT)), "started"))
        arrivals: list[float] = []
        stack.enter_context(reader(catcher, arrivals))
        pod_path = f"/api/v1/namespaces/{bench.namespace}/pods/client"
        latencies = []
        for change in range(options.changes):
            quiet_since(arrivals, 0.3)
            wrote = patch_label(bench, pod_path, "probe")
            latencies.append(first_after(arrivals, wrote) - wrote)
            patch_label(bench, pod_path, "none")
            log(f"  change {change + 1}: {latencies[-1] * 1000:.0f} ms")
    after = scrape(bench.node)
    count = after.get("vpc_attach_policy_sync_seconds_count", 0) - \
        before.get("vpc_attach_policy_sync_seconds_count", 0)
    total = after.get("vpc_attach_policy_sync_seconds_sum", 0) - \
        before.get("vpc_attach_policy_sync_seconds_sum", 0)
    return {"changes": len(latencies), "p50_ms": percentile(latencies, 50) * 1000,
            "p95_ms": percentile(latencies, 95) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000, "max_ms": max(latencies) * 1000,
            "latencies_ms": [round(latency * 1000, 1) for latency in latencies],
            "agent_sync_mean_ms": total / count * 1000 if count else None,
            "rules": after.get("vpc_attach_policy_rules")}


def first_after(arrivals: list[float], moment: float) -> float:
    """The first arrival after `moment`, once there is one."""
    wait_until("a datagram after the label", lambda: any(
        t > moment for t in arrivals[-50:]), 30, interval=0.002)
    return min(t for t in arrivals if t > moment)


def quiet_since(arrivals: list[float], seconds: float) -> None:
    """Until no datagram arrived for `seconds` (the label's removal enforced)."""
    wait_until("the prober shut out", lambda: not arrivals or
               time.time() - arrivals[-1] > seconds, 30, interval=0.01)


def patch_label(bench: Bench, path: str, role: str) -> float:
    """Set the client's role; the time the API server answered."""
    bench.kube.request("PATCH", path, {"metadata": {"labels": {"role": role}}},
                       content_type="application/merge-patch+json")
    return time.time()


class process:
    """A process started and waited for until it printed `ready` (its first line)."""

    def __init__(self, argv: list[str], ready: str) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != ready:
            self.proc.kill()
            raise RuntimeError(f"{argv[-3:]} did not start: {line!r}")

    def __enter__(self) -> subprocess.Popen[str]:
        return self.proc

    def __exit__(self, *_: object) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


class reader:
    """A thread appending every line (a time) the process prints."""

    def __init__(self, proc: subprocess.Popen[str], into: list[float]) -> None:
        import threading
        self.thread = threading.Thread(target=self._run, args=(proc, into), daemon=True)

    @staticmethod
    def _run(proc: subprocess.Popen[str], into: list[float]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(float(line))

    def __enter__(self) -> reader:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        pass


def adds(bench: Bench) -> dict[str, Any]:
    """ADD through the agent, 0 vs --policies policies selecting the Pod, interleaved."""
    options = bench.options
    quiet, busy = f"bench-q-{secrets.token_hex(2)}", f"bench-b-{secrets.token_hex(2)}"
    for namespace in (quiet, busy):
        bench.scene.namespace(manifest_namespace(namespace))
    for index in range(options.policies):
        bench.policy(f"sel{index}", {"podSelector": {},
                                     "ingress": [{"ports": [{"port": 8000 + index}]}]},
                     namespace=busy)
    wait_until("the agent's caches to hold the policies", lambda: scrape(bench.node).get(
        "vpc_attach_policy_sync_seconds_count", 0) > 0, 60)
    times: dict[str, list[float]] = {quiet: [], busy: []}
    for run in range(options.adds):
        for namespace in (quiet, busy) if run % 2 == 0 else (busy, quiet):
            began = time.monotonic()
            bench.pod(f"add-{run}", {"app": "add"}, namespace=namespace)
            times[namespace].append(time.monotonic() - began)
    zero, hundred = statistics.median(times[quiet]), statistics.median(times[busy])
    log(f"ADD through the agent: median {zero * 1000:.0f} ms with no policy, "
        f"{hundred * 1000:.0f} ms with {options.policies} selecting the Pod")
    return {"runs": options.adds, "median_0_ms": zero * 1000,
            "p95_0_ms": percentile(times[quiet], 95) * 1000,
            f"median_{options.policies}_ms": hundred * 1000,
            f"p95_{options.policies}_ms": percentile(times[busy], 95) * 1000,
            "ratio": hundred / zero}


def throughput(bench: Bench) -> dict[str, Any]:
    """iperf3 between two Pods: no policy, then 1,000 allow rules in the server's table."""
    options = bench.options
    namespace = f"bench-t-{secrets.token_hex(2)}"
    bench.scene.namespace(manifest_namespace(namespace))
    bench.pod("iperf-client", {"role": "iperf-client"}, namespace=namespace)
    bench.pod("iperf-server", {"role": "iperf-server"}, namespace=namespace)
    client = bench.scene.pods[(namespace, "iperf-client")]
    server = bench.scene.pods[(namespace, "iperf-server")]
    address = bench.scene.address(namespace, "iperf-server")
    paths: list[str] = []
    rows: dict[str, list[float]] = {"none": [], "1000 rules": []}
    # The earlier rows' policies stay: their rules are the baseline, the 1,000 come on top.
    baseline = scrape(bench.node).get("vpc_attach_policy_rules", 0)
    with process(in_netns(server.netns, "sh", "-c",
                          f"echo ready; exec iperf3 -s -p {IPERF_PORT}"), "ready"):
        time.sleep(0.5)  # iperf3 binds after its first line; a refused first round is retried
        for round_ in range(options.rounds):
            for label in ("none", "1000 rules") if round_ % 2 == 0 else ("1000 rules", "none"):
                if label == "1000 rules" and not paths:
                    paths = [bench.policy(f"rules{index}", {
                        "podSelector": {"matchLabels": {"role": "iperf-server"}},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {
                            "role": "iperf-client"}}}],
                                     "ports": [{"port": IPERF_PORT}]}] + [
                            {"ports": [{"port": 10000 + index * 10 + rule}]}
                            for rule in range(9)]}, namespace=namespace)
                        for index in range(100)]
                    wait_until("1,000 rules", lambda: scrape(bench.node).get(
                        "vpc_attach_policy_rules", 0) >= baseline + 1000, 120)
                elif label == "none" and paths:
                    for path in paths:
                        bench.kube.delete(path)
                    paths = []
                    wait_until("the 1,000 rules gone", lambda: scrape(bench.node).get(
                        "vpc_attach_policy_rules", baseline + 1) <= baseline, 120)
                rows[label].append(iperf(client.netns, address, options.seconds))
                log(f"  iperf {label}: {rows[label][-1]:.2f} Gbit/s")
    none, ruled = statistics.median(rows["none"]), statistics.median(rows["1000 rules"])
    return {"rounds": options.rounds, "none_gbits": none, "rules_gbits": ruled,
            "ratio": ruled / none}


def iperf(netns: str, address: str, seconds: int) -> float:
    """One iperf3 run's throughput (Gbit/s)."""
    done = subprocess.run(in_netns(netns, "iperf3", "-J", "-c", address, "-p", str(IPERF_PORT),
                                   "-t", str(seconds)), capture_output=True, text=True,
                          timeout=seconds + 60, check=True)
    return float(json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--adds", type=int, default=30)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS)
    options = parser.parse_args()
    began = machine()
    # The directory outlives the scene: its teardown talks to the control plane whose
    # credentials are in it. The rows are written before any teardown can fail.
    with tempfile.TemporaryDirectory(prefix="vpa-bench-policy-") as tmp, ExitStack() as stack:
        bench = Bench(stack, Path(tmp), options)
        rows = {"change_to_enforced": change_to_enforced(bench), "add": adds(bench),
                "throughput": throughput(bench)}
        rows["machine"] = {"before": began, "after": machine()}
        text = report(rows, options)
        options.results.mkdir(parents=True, exist_ok=True)
        (options.results / "policy.md").write_text(text)
        (options.results / "policy.json").write_text(json.dumps(rows, indent=2))
        print(text, flush=True)


def report(rows: dict[str, Any], options: argparse.Namespace) -> str:
    """The markdown table."""
    change, add, tput = rows["change_to_enforced"], rows["add"], rows["throughput"]
    n = options.policies
    return "\n".join([
        "| row | measured | target |", "|---|---|---|",
        f"| change → enforced ({options.pods} Pods, {n} policies, {change['changes']} label "
        f"changes, first packet through) | p50 {change['p50_ms']:.0f} ms, p95 "
        f"{change['p95_ms']:.0f} ms, p99 {change['p99_ms']:.0f} ms (max "
        f"{change['max_ms']:.0f}; agent's sync mean "
        f"{change['agent_sync_mean_ms'] or 0:.0f} ms) | p99 ≤ 1000 ms |",
        f"| ADD via the agent, 0 vs {n} policies selecting the Pod ({add['runs']} each, "
        f"interleaved) | {add['median_0_ms']:.0f} ms vs {add[f'median_{n}_ms']:.0f} ms median "
        f"(p95 {add['p95_0_ms']:.0f} / {add[f'p95_{n}_ms']:.0f}): {add['ratio']:.2f}x | "
        "≤ 1.10x |",
        f"| TCP throughput, 1,000 rules vs none ({tput['rounds']} rounds of "
        f"{options.seconds} s) | {tput['rules_gbits']:.2f} vs {tput['none_gbits']:.2f} Gbit/s: "
        f"{tput['ratio']:.2f}x | ≥ 0.95x |",
        "", f"Machine: {rows['machine']['before']} (before) → load "
        f"{rows['machine']['after'].rsplit('load ', 1)[-1]} (after).", ""])


if __name__ == "__main__":
    main()
