"""`python -m e2e.bench.galactic [--runs N] [--seconds S] [--rounds R] [--only ROWS]` (as
root): what galactic's datapath costs (issue 30 item 7), in the full-kernel VM (galactic's
programs need BTF, VRF and cls_bpf: the VM boots by itself where this kernel lacks them).

Two simulated nodes running galactic-cni and galactic-router (`e2e.harness.galactic.datapath`)
against a local control plane, in one run, interleaved:

- ADD then DEL through a node agent, publishing to a router with SIDs, with the attachment
  registered in galactic's maps (the agent finds galactic's pins) and without (an agent of the
  same node whose `galacticPinDir` holds nothing: kernel End.DT46 only), and the Go reference
  `ptp` + `host-local`, each pair in a fresh netns, the order rotated every round. Times are
  the wall clock of the runtime's exec (the node prefix's `ip netns exec` included for every
  row alike) and, for vpc-attach, the agent's own `durationMs`.
- TCP throughput (iperf3) from a Pod on node 1 to a Pod on node 2 of one VPC through galactic's
  eBPF path, against two network namespaces joined by one veth pair in the same VM, alternating;
  each row also divided round by round by the veth pair's rate in the same round (the host's
  load drifts between rounds), and the veth pair with the client's TSO off (the cost of
  segmenting every MSS, which the galactic rows pay).

Emulated CPU: only the ratios mean anything, and they only on the machine reported. Writes
`galactic.md` into the results dir and prints it; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.bench import galactic_paths as paths
from e2e.bench.galactic_paths import TcpPath
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
from e2e.harness.pace import pace
from e2e.harness.plugin import Plugin, base_conf, host_local, random_vpc, with_prev
from e2e.harness.tenancy import bound

RESULTS = Path(__file__).resolve().parent / "results"
WARMUP = 2
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


def tcp_paths(stack: contextlib.ExitStack, datapath: Datapath, cluster: Cluster,
              cni_bin: Path, kube: Kube, work: Path, only: set[str]) -> list[TcpPath]:
    """Every TCP row's client and server, made once for all rounds (`only`: these rows and
    the veth pair, when not empty)."""
    first, second = datapath.nodes
    underlays = ([first.netns, second.netns], [first.underlay_link, second.underlay_link],
                 [first.pin_dir, second.pin_dir])
    left, right, veth_address = stack.enter_context(paths.veth_pair())
    paths_made = [TcpPath("veth", "two netns, one veth pair, same VM", left, right,
                          veth_address, *underlays),
                  # What segmenting every MSS costs by itself (the galactic rows must).
                  TcpPath("veth-no-tso", "the same veth pair, the client's TSO/USO off",
                          left, right, veth_address, *underlays,
                          before=lambda: paths.ethtool_set(left, "tso", "off",
                                                           "tx-udp-segmentation", "off"),
                          after=lambda: paths.ethtool_set(left, "tso", "on",
                                                          "tx-udp-segmentation", "on"))]
    client, server, address = stack.enter_context(paths.plain_routing(first, second))
    paths_made.append(TcpPath("plain", "plain routing over the same two nodes (no SRv6)",
                              client, server, address, *underlays))
    as_bgp = stack.enter_context(paths.galactic_pair(datapath, cluster, kube, cni_bin, work,
                                                     "on", 1))
    ours = stack.enter_context(paths.galactic_pair(datapath, cluster, kube, cni_bin, work,
                                                   "off", 2))
    tso = as_bgp[0].netns  # the knobs turn on this Pod's, then back

    def knob(key: str, label: str, before: Callable[[], object], after: Callable[[], object],
             pair: tuple[paths.Attached, paths.Attached] = as_bgp) -> TcpPath:
        return TcpPath(key, label, pair[0].netns, pair[1].netns, pair[1].address, *underlays,
                       before=before, after=after)

    paths_made += [
        TcpPath("galactic-bgp", "galactic's eBPF path, offloads as galactic-bgp leaves them "
                "(`galacticOffloads: on`)", as_bgp[0].netns, as_bgp[1].netns,
                as_bgp[1].address, *underlays),
        TcpPath("vpc-attach", "galactic's eBPF path, vpc-attach's setting (`galacticOffloads`"
                " default `off`)", ours[0].netns, ours[1].netns, ours[1].address, *underlays),
        knob("no-gso", "knob: TSO/USO and generic segmentation off",
             lambda: paths.ethtool_set(tso, "tso", "off", "tx-udp-segmentation", "off", "gso",
                                       "off"),
             lambda: paths.ethtool_set(tso, "tso", "on", "tx-udp-segmentation", "on", "gso",
                                       "on")),
        knob("segs1", "knob: TSO on, `gso_max_segs 1` on the Pod's eth0",
             lambda: run_ip("-n", tso, "link", "set", "eth0", "gso_max_segs", "1"),
             lambda: run_ip("-n", tso, "link", "set", "eth0", "gso_max_segs", "65535")),
        knob("mtu", "knob: TSO on, Pod MTU 1280 instead of 1460",
             lambda: run_ip("-n", tso, "link", "set", "eth0", "mtu", "1280"),
             lambda: run_ip("-n", tso, "link", "set", "eth0", "mtu", str(paths.POD_MTU))),
        knob("gro", "vpc-attach's setting, GRO on node 2's underlay (receive side)",
             lambda: paths.gro(first, second, True), lambda: paths.gro(first, second, False),
             ours),
    ]
    if not only or "kernel" in only:
        kernel = stack.enter_context(paths.kernel_nodes(kube, cluster, work / "kernel-nodes"))
        pair = stack.enter_context(paths.kernel_pair(kernel, cluster, kube, cni_bin, work))
        paths_made.append(TcpPath(
            "kernel", "kernel End.DT46 (no galactic; a hand-made `encap seg6` sender)",
            pair[0].netns, pair[1].netns, pair[1].address, [n.netns for n in kernel],
            [n.underlay_link for n in kernel], []))
    return [p for p in paths_made if not only or p.key in only | {"veth"}]


def add_report(subjects: list[Subject], runs: int) -> list[str]:
    """The ADD table."""
    go = next(s for s in subjects if s.label == GO)
    lines = [f"ADD: {runs} measured rounds after {WARMUP} warm-up rounds, interleaved; median "
             "and p95 (nearest rank).", "",
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
              f"in the agent), {end_to_end:.2f}x end to end."]
    return lines


def tcp_report(measured: list[TcpPath], seconds: int) -> list[str]:
    """The TCP table."""
    return [f"TCP: iperf3, one {seconds}-s stream per row and round, every row once per round"
            " in a rotated order; the client's offloads as `ethtool -k` read them; the "
            "underlays' `tx_dropped` counted on both nodes around each transfer.", "",
            *paths.table(measured)]




def run_inside(options: argparse.Namespace) -> str:
    """Everything, on this kernel (the VM's)."""
    work = Path(tempfile.mkdtemp(prefix="vpa-bench-galactic-"))
    cluster = Cluster.up(work / "cluster")
    try:
        with cluster.admin() as kube, contextlib.ExitStack() as stack:
            # Under emulation on a busy host one API request takes what a few cold starts
            # take: the client's own timeout is sized on a native machine.
            kube.timeout = pace().plus(10, kube.timeout, "the client's timeout").seconds
            from e2e.harness.tools.gotools import reference_plugins_dir
            build = ensure_galactic_built()
            apply_galactic_crds(kube, build.crd_dir)
            cni_bin = cnibin.populate(work / "cni-bin", reference_plugins_dir())
            datapath = stack.enter_context(galactic_datapath(kube, cluster, build, work / "dp",
                                                             underlay_by_env=True))
            now = datetime.datetime.now(datetime.UTC)
            lines = [f"# galactic's datapath: cost ({now:%Y-%m-%d %H:%M} UTC)", "",
                     f"Machine: {machine()}.", ""]
            if options.runs:
                subjects = _subjects(stack, datapath.nodes[0], cluster, cni_bin, work)
                for subject in subjects[:2]:
                    stack.enter_context(bound(kube, subject.conf["vpc"]))
                measure_adds(subjects, options.runs)
                lines += [*add_report(subjects, options.runs), ""]
            measured = tcp_paths(stack, datapath, cluster, cni_bin, kube, work,
                                 set(filter(None, options.only.split(","))))
            paths.measure_all(measured, options.seconds, options.rounds)
            lines += tcp_report(measured, options.seconds)
            return "\n".join(lines) + "\n"
    finally:
        cluster.down()


def _load() -> str:
    """The host's load averages: the emulated CPU shares the host with whatever else runs."""
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="ADD rounds (0: TCP only)")
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--only", default="", help="TCP rows by key, comma-separated (the "
                        "veth pair always): veth-no-tso, plain, galactic-bgp, vpc-attach, "
                        "no-gso, segs1, mtu, gro, kernel")
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
    load_before = _load()
    argv = [sys.executable, "-m", "e2e.bench.galactic", "--inside", "--runs", str(options.runs),
            "--seconds", str(options.seconds), "--rounds", str(options.rounds),
            "--only", options.only, "--results", str(share)]
    result = run(argv, cwd=Path(__file__).resolve().parents[2], share=share,
                 timeout=3600, on_output=lambda text: print(text, end="", file=sys.stderr))
    produced = share / "galactic.md"
    if result.returncode != 0 or not produced.exists():
        raise SystemExit(f"the bench in the VM ended with {result.returncode}")
    text = produced.read_text() + (f"\nHost: nproc {os.cpu_count()}, {_cpu_model()}, Linux "
                                   f"{platform.release()}; the VM has 1 vCPU; load average "
                                   f"(1/5/15 min) {load_before} before the boot, {_load()} "
                                   "after.\n")
    (options.results / "galactic.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
