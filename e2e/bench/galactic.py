"""`python -m e2e.bench.galactic [--runs N] [--seconds S] [--rounds R]` (as root): what
galactic's datapath costs (issue 30 item 7), in the full-kernel VM (galactic's programs need
BTF, VRF and cls_bpf: the VM boots by itself where this kernel lacks them).

Two simulated nodes running galactic-cni and galactic-router (`e2e.harness.galactic.datapath`)
against a local control plane, in one run, interleaved:

- ADD then DEL through a node agent, publishing to a router with SIDs, with the attachment
  registered in galactic's maps (the agent finds galactic's pins) and without (an agent of the
  same node whose `galacticPinDir` holds nothing: kernel End.DT46 only), and the Go reference
  `ptp` + `host-local`, each pair in a fresh netns, the order rotated every round. Times are
  the wall clock of the runtime's exec (the node prefix's `ip netns exec` included for every
  row alike) and, for vpc-attach, the agent's own `durationMs`.
- TCP throughput (iperf3) from a Pod on node 1 to a Pod on node 2 of one VPC through galactic's
  eBPF path, against two network namespaces joined by one veth pair in the same VM, alternating.

Emulated CPU: only the ratios mean anything, and they only on the machine reported. Writes
`galactic.md` into the results dir and prints it; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.bench.machine import _cpu_model
from e2e.bench.stats import median, p95
from e2e.harness import cnibin
from e2e.harness.agentproc import AgentProcess
from e2e.harness.cluster import Cluster
from e2e.harness.galactic.build import ensure_galactic_built
from e2e.harness.galactic.datapath import Datapath, DatapathNode, galactic_datapath
from e2e.harness.galactic.fabric import apply_galactic_crds
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.packets import in_netns
from e2e.harness.plugin import Plugin, base_conf, host_local, random_vpc, with_prev
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

RESULTS = Path(__file__).resolve().parent / "results"
WARMUP = 2
IPERF_PORT = 5201
REGISTERED, KERNEL_ONLY, GO = ("vpc-attach, registered in galactic's datapath",
                               "vpc-attach, no galactic datapath (kernel End.DT46)",
                               "Go ptp + host-local (reference)")


@dataclass
class Subject:
    """One row of the ADD table: how to attach, and what was measured."""

    label: str
    plugin: Plugin
    conf: dict[str, Any]
    agent: AgentProcess | None
    wall_ms: list[float] = field(default_factory=list)
    agent_ms: list[float] = field(default_factory=list)
    del_ms: list[float] = field(default_factory=list)


def machine() -> str:
    """The machine the ratios belong to (inside the VM: the guest's view)."""
    return (f"nproc {os.cpu_count()}, {_cpu_model()}, Linux {platform.release()} "
            "(full-kernel VM under TCG emulation)")


def _subjects(stack: contextlib.ExitStack, node: DatapathNode, cluster: Cluster,
              cni_bin: Path, work: Path) -> list[Subject]:
    """Both vpc-attach agents on node 1 (its bpffs: galactic's pins, or none) and Go ptp."""
    subjects = []
    locks = work / "locks"  # one node: one lock directory, whichever agent serves
    locks.mkdir()
    for name, label, pin_dir in (("registered", REGISTERED, "/sys/fs/bpf/galactic"),
                                 ("kernel", KERNEL_ONLY, str(work / "no-galactic-pins"))):
        directory = work / name
        (directory / "agent").mkdir(parents=True)
        environ = {"VPC_ATTACH_NODE_NAME": node.name,
                   "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
                   "VPC_ATTACH_LOCK_DIR": str(locks),
                   "VPC_ATTACH_HOST_CONFIG": str(directory / "absent-host.json"),
                   "VPC_ATTACH_GALACTIC_PIN_DIR": pin_dir}
        agent = stack.enter_context(AgentProcess(directory / "agent", prefix=node.prefix,
                                                 env=environ))
        plugin = Plugin(cni_bin, locks,
                        {**environ, "VPC_ATTACH_AGENT_SOCKET": str(agent.socket)},
                        prefix=node.prefix)
        conf = base_conf(random_vpc(), "1", isolation="vrf",
                         ipam=host_local(directory / "ipam", "fd00:be:1::/64", "10.190.1.0/24"),
                         publish={"bgp": True, "endpointSlice": False})
        subjects.append(Subject(label, plugin, conf, agent))
    go = Plugin(cni_bin, work / "go-locks", prefix=node.prefix)
    go.lock_dir.mkdir()
    subjects.append(Subject(GO, go, {
        "cniVersion": "1.1.0", "name": "ptp-bench", "type": "ptp", "ipMasq": False,
        "ipam": {"type": "host-local", "dataDir": str(work / "go-ipam"),
                 "ranges": [[{"subnet": "172.30.0.0/24"}]]}}, None))
    return subjects


def _round(subject: Subject, keep: bool) -> None:
    """ADD then DEL in a fresh netns; the times kept unless it is a warm-up round."""
    executable = "ptp" if subject.agent is None else "vpc-attach"
    container = f"bench-{secrets.token_hex(4)}"
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + container
    with temporary_netns("vpa-bench") as netns:
        started = time.perf_counter()
        added = subject.plugin.call("ADD", subject.conf, container_id=container, netns=netns,
                                    executable=executable, CNI_ARGS=args)
        added_at = time.perf_counter()
        assert added.status == 0, added.stdout + added.stderr
        done = subject.plugin.call("DEL", with_prev(subject.conf, added.body),
                                   container_id=container, netns=netns, executable=executable,
                                   CNI_ARGS=args)
        assert done.status == 0, done.stdout + done.stderr
        if keep:
            subject.wall_ms.append((added_at - started) * 1000)
            subject.del_ms.append((time.perf_counter() - added_at) * 1000)
            if subject.agent is not None:
                lines = [line for line in subject.agent.verb_lines()
                         if line["containerID"] == container and line["verb"] == "ADD"]
                subject.agent_ms.append(float(lines[-1]["durationMs"]))


def measure_adds(subjects: list[Subject], runs: int) -> None:
    """WARMUP discarded rounds, then `runs`; each round every subject once, order rotated."""
    for index in range(WARMUP + runs):
        shift = index % len(subjects)
        for subject in subjects[shift:] + subjects[:shift]:
            _round(subject, keep=index >= WARMUP)
        print(f"round {index + 1}/{WARMUP + runs}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _pod(node: DatapathNode, cluster: Cluster, cni_bin: Path, vpc: str, index: int,
         work: Path) -> Iterator[tuple[str, str]]:
    """A Pod of `vpc` on `node` attached in-process: (netns name, its IPv4 address)."""
    plugin = Plugin(cni_bin, work / f"pod-locks-{index}", {
        "VPC_ATTACH_NODE_NAME": node.name, "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
        "VPC_ATTACH_LOCK_DIR": str(work / f"pod-locks-{index}")}, prefix=node.prefix)
    plugin.lock_dir.mkdir()
    conf = base_conf(vpc, str(index), isolation="vrf",
                     ipam=host_local(work / f"pod-ipam-{index}", f"10.191.{index}.0/24"),
                     publish={"bgp": True, "endpointSlice": False})
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=tcp-{index}"
    with temporary_netns("vpa-tcp") as netns:
        result = plugin.ok("ADD", conf, container_id=f"tcp-{index}", netns=netns, CNI_ARGS=args)
        try:
            yield os.path.basename(netns), result["ips"][0]["address"].split("/")[0]
        finally:
            plugin.ok("DEL", with_prev(conf, result), container_id=f"tcp-{index}", netns=netns,
                      CNI_ARGS=args)


def _iperf(client: str, server: str, address: str, seconds: int) -> float:
    """Gbit/s from `client` to an iperf3 server in `server` listening on `address`."""
    with subprocess.Popen(in_netns(server, "iperf3", "-s", "-1", "-B", address, "-p",
                                   str(IPERF_PORT)), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as listening:
        try:
            wait_until("iperf3 listening", lambda: f":{IPERF_PORT}" in subprocess.run(
                in_netns(server, "ss", "-ltn"), capture_output=True, text=True,
                check=False).stdout, 30)
            out = subprocess.run(in_netns(client, "iperf3", "-J", "-c", address, "-p",
                                          str(IPERF_PORT), "-t", str(seconds)),
                                 capture_output=True, text=True, timeout=seconds + 60,
                                 check=True).stdout
        finally:
            listening.kill()
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e9


@contextlib.contextmanager
def _veth_pair() -> Iterator[tuple[str, str, str]]:
    """Two netns joined by one veth pair: (client netns, server netns, server address)."""
    suffix = secrets.token_hex(3)
    left, right = f"vpa-vl-{suffix}", f"vpa-vr-{suffix}"
    for name in (left, right):
        run_ip("netns", "add", name)
    try:
        run_ip("-n", left, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns",
               right)
        for name, link, address in ((left, "v0", "10.192.0.1/24"),
                                    (right, "v1", "10.192.0.2/24")):
            run_ip("-n", name, "addr", "add", address, "dev", link)
            run_ip("-n", name, "link", "set", link, "up")
        yield left, right, "10.192.0.2"
    finally:
        for name in (left, right):
            run_ip("netns", "del", name, check=False)


def measure_tcp(datapath: Datapath, cluster: Cluster, cni_bin: Path, kube: Kube, work: Path,
                seconds: int, rounds: int) -> dict[str, list[float]]:
    """iperf3 through galactic's datapath (node 1 → node 2) and over one veth pair."""
    vpc = random_vpc()
    rates: dict[str, list[float]] = {"galactic": [], "veth": []}
    node1, node2 = datapath.nodes
    with bound(kube, vpc), _pod(node1, cluster, cni_bin, vpc, 1, work) as (client, _), \
            _pod(node2, cluster, cni_bin, vpc, 2, work) as (server, address), \
            _veth_pair() as (left, right, veth_address):
        datapath.wait("node 1 to reach the Pod on node 2", lambda: subprocess.run(
            in_netns(client, "ping", "-c", "1", "-W", "1", address), capture_output=True,
            check=False).returncode == 0, 120)
        for index in range(rounds):
            order = (("galactic", client, server, address), ("veth", left, right, veth_address))
            for name, src, dst, at in order if index % 2 == 0 else order[::-1]:
                rates[name].append(_iperf(src, dst, at, seconds))
    return rates


def report(subjects: list[Subject], rates: dict[str, list[float]], runs: int) -> str:
    """The markdown report."""
    go = next(s for s in subjects if s.label == GO)
    lines = [f"# galactic's datapath: cost ({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
             "UTC)", "", f"Machine: {machine()}. {runs} measured rounds after {WARMUP} warm-up "
             "rounds, interleaved; median and p95 (nearest rank).", "",
             "| ADD through the node agent | n | median ms | p95 ms | x Go | in agent: median "
             "ms | p95 ms | DEL median ms |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for subject in subjects:
        agent = (f"{median(subject.agent_ms):.1f} | {p95(subject.agent_ms):.1f}"
                 if subject.agent_ms else "- | -")
        lines.append(f"| {subject.label} | {len(subject.wall_ms)} | "
                     f"{median(subject.wall_ms):.1f} | {p95(subject.wall_ms):.1f} | "
                     f"{median(subject.wall_ms) / median(go.wall_ms):.2f}x | {agent} | "
                     f"{median(subject.del_ms):.1f} |")
    registered, kernel = subjects[0], subjects[1]
    in_agent = median(registered.agent_ms) / median(kernel.agent_ms)
    end_to_end = median(registered.wall_ms) / median(kernel.wall_ms)
    lines += ["", f"Registration's cost: {in_agent:.2f}x the agent's ADD without it (medians "
              f"in the agent), {end_to_end:.2f}x end to end.", "",
              "| TCP, 1 stream | rounds | median Gbit/s | ratio |", "|---|--:|--:|--:|"]
    base = median(rates["veth"])
    for name, label in (("galactic", "Pod → Pod across nodes, galactic's eBPF path"),
                        ("veth", "two netns, one veth pair, same VM")):
        lines.append(f"| {label} | {len(rates[name])} | {median(rates[name]):.3f} | "
                     f"{median(rates[name]) / base:.2f} |")
    return "\n".join(lines) + "\n"


def run_inside(options: argparse.Namespace) -> str:
    """Everything, on this kernel (the VM's)."""
    work = Path(tempfile.mkdtemp(prefix="vpa-bench-galactic-"))
    cluster = Cluster.up(work / "cluster")
    try:
        with cluster.admin() as kube, contextlib.ExitStack() as stack:
            from e2e.harness.tools.gotools import reference_plugins_dir
            build = ensure_galactic_built()
            apply_galactic_crds(kube, build.crd_dir)
            cni_bin = cnibin.populate(work / "cni-bin", reference_plugins_dir())
            datapath = stack.enter_context(galactic_datapath(kube, cluster, build, work / "dp",
                                                             underlay_by_env=True))
            subjects = _subjects(stack, datapath.nodes[0], cluster, cni_bin, work)
            for subject in subjects[:2]:
                stack.enter_context(bound(kube, subject.conf["vpc"]))
            measure_adds(subjects, options.runs)
            rates = measure_tcp(datapath, cluster, cni_bin, kube, work, options.seconds,
                                options.rounds)
            return report(subjects, rates, options.runs)
    finally:
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--inside", action="store_true", help="already on a full kernel")
    options = parser.parse_args()
    from e2e.harness.vm.pytest_plugin import kernel_lacks
    if options.inside or kernel_lacks() is None:
        text = run_inside(options)
        (options.results / "galactic.md").write_text(text)
        print(text)
        return
    from e2e.harness.vm.boot import run
    share = Path(tempfile.mkdtemp(prefix="vpa-bench-vm-"))
    argv = [sys.executable, "-m", "e2e.bench.galactic", "--inside", "--runs", str(options.runs),
            "--seconds", str(options.seconds), "--rounds", str(options.rounds),
            "--results", str(share)]
    result = run(argv, cwd=Path(__file__).resolve().parents[2], share=share,
                 timeout=3600, on_output=lambda text: print(text, end="", file=sys.stderr))
    produced = share / "galactic.md"
    if result.returncode != 0 or not produced.exists():
        raise SystemExit(f"the bench in the VM ended with {result.returncode}")
    text = produced.read_text() + (f"\nHost: nproc {os.cpu_count()}, {_cpu_model()}, Linux "
                                   f"{platform.release()}; the VM has 1 vCPU.\n")
    (options.results / "galactic.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
