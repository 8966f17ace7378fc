"""Pod start latency through a real node (issue 11): a Pod created through the API until it is
Ready, with vpc-attach's veth conflist versus the Go `ptp` + `host-local` conflist.

`sudo .venv/bin/python -m e2e.bench.podstart [--pods N] [--results DIR]`

One node (`e2e.node`), one run, interleaved: the conflist is swapped between Pods (each swap
waits until containerd's CRI reports the new one loaded), the order of the two alternates every
round, and each Pod is deleted and everything it left is gone before the next. Both chains end
with the same `tuning` and `portmap`; vpc-attach's is the veth-pod example as deployed (dual
stack from vpc-attach-ipam, BGP objects and an EndpointSlice published before it answers),
ptp's attaches IPv4 from host-local with no masquerading (an IPv6 address makes ptp wait ~2 s
for duplicate address detection). Time is read on this side: `create` sent to the Pod's
Ready=True seen by polling every 20 ms (both rows carry the same bias). Writes
`podstart.md` and `podstart.json` into the results dir and prints the table.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import ipaddress
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.bench.machine import _cpu_model, load_average
from e2e.bench.stats import ratio, summarize
from e2e.harness.kube import Kube
from e2e.harness.wait import wait_until
from e2e.node import Node
from e2e.node.observe import create_pod, delete_pod, get_pod, pod_manifest, unique, verb_lines

log = logging.getLogger("e2e.bench.podstart")

RESULTS = Path(__file__).resolve().parent / "results"
WARMUP = 2  # Pods per conflist started and discarded first
POLL_S = 0.02
READY_S = 120.0
TARGET_RATIO = 1.10
PTP_POOL = "172.30.0.0/24"
VETH, PTP = "vpc-attach veth (veth-pod example)", "Go ptp + host-local"


def ptp_conflist(veth: dict[str, Any]) -> dict[str, Any]:
    """ptp + host-local (IPv4), then the same plugins the veth conflist chains after
    vpc-attach."""
    chained = [copy.deepcopy(p) for p in veth["plugins"] if p["type"] != "vpc-attach"]
    return {"cniVersion": veth["cniVersion"], "name": "ptp-bench", "plugins": [
        {"type": "ptp", "ipMasq": False,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": PTP_POOL}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        *chained]}


@dataclass
class Subject:
    """One row: its conflist, the pool its Pod IPs must come from, its samples."""

    name: str
    conflist: dict[str, Any]
    pool: ipaddress.IPv4Network
    samples: list[float] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)  # the measured Pods' names
    plugin_ms: list[float] = field(default_factory=list)  # vpc-attach's ADD, from its log


def ready(pod: dict[str, Any] | None) -> bool:
    """Whether the Pod's Ready condition is True."""
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def start_one(node: Node, kube: Kube, subject: Subject) -> tuple[str, float]:
    """Create a Pod, time it to Ready, check it got an address of the subject's pool, delete
    it and wait until it is gone; (its name, the seconds to Ready)."""
    name = unique("bench")
    manifest = pod_manifest(name, node.runtime.pause.ref)
    began = time.monotonic()
    create_pod(kube, manifest)
    pod: dict[str, Any] | None = None

    def is_ready() -> bool:
        nonlocal pod
        pod = get_pod(kube, name)
        return ready(pod)

    wait_until(f"pod {name} ({subject.name}) Ready", is_ready, READY_S, interval=POLL_S)
    elapsed = time.monotonic() - began
    assert pod is not None
    address = ipaddress.ip_address(pod["status"]["podIP"])
    if address not in subject.pool:
        raise RuntimeError(f"pod {name} got {address}, not from {subject.name}'s pool "
                           f"{subject.pool}: the conflist swap did not take")
    delete_pod(kube, name)
    return name, elapsed


def plugin_add_ms(node: Node, pods: list[str]) -> list[float]:
    """vpc-attach's own time for each of these Pods' ADD (`durationMs` of its log line, read
    once at the end), for those it attached."""
    took = {line["pod"]: float(line["durationMs"]) for line in verb_lines(node, "ADD")
            if line.get("outcome") == "ok"}
    return [took[f"default/{pod}"] for pod in pods if f"default/{pod}" in took]


def run(node: Node, pods: int) -> list[Subject]:
    """Interleave `pods` measured Pods per subject (after WARMUP each)."""
    veth_conflist = node.loaded_conflist()
    assert veth_conflist is not None
    veth_pool = next(ipaddress.ip_network(p["ipam"]["ipv4_subnet"])
                     for p in veth_conflist["plugins"] if p["type"] == "vpc-attach")
    assert isinstance(veth_pool, ipaddress.IPv4Network)
    subjects = [Subject(VETH, veth_conflist, veth_pool),
                Subject(PTP, ptp_conflist(veth_conflist), ipaddress.IPv4Network(PTP_POOL))]
    with node.admin() as kube:
        for index in range(WARMUP + pods):
            order = subjects if index % 2 == 0 else subjects[::-1]
            for subject in order:
                node.set_conflist(subject.conflist)
                pod, seconds = start_one(node, kube, subject)
                if index >= WARMUP:
                    subject.samples.append(seconds)
                    subject.pods.append(pod)
            log.info("round %d/%d: %s", index + 1, WARMUP + pods,
                     ", ".join(f"{s.name} {s.samples[-1] * 1000:.0f} ms"
                               for s in subjects if s.samples))
        node.set_conflist(veth_conflist)
    subjects[0].plugin_ms = plugin_add_ms(node, subjects[0].pods)
    return subjects


def report(subjects: list[Subject], machine: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready results: each row's summary and the ratios to the ptp row."""
    veth, ptp = subjects
    summaries = {s.name: summarize(s.samples) for s in subjects}
    median_ratio = ratio(summaries[veth.name].median, summaries[ptp.name].median)
    p95_ratio = ratio(summaries[veth.name].p95, summaries[ptp.name].p95)
    return {"machine": machine, "pods_per_row": len(veth.samples), "warmup": WARMUP,
            "rows": {name: {k: round(v, 4) for k, v in summary.as_dict().items()}
                     for name, summary in summaries.items()},
            "samples_s": {s.name: [round(x, 4) for x in s.samples] for s in subjects},
            "vpc_attach_add_in_plugin_ms": (
                {k: round(v, 1) for k, v in summarize(veth.plugin_ms).as_dict().items()}
                if veth.plugin_ms else None),
            "ratio_median": round(median_ratio or 0.0, 3),
            "ratio_p95": round(p95_ratio or 0.0, 3),
            "target_ratio": TARGET_RATIO,
            "meets_target": bool(median_ratio is not None and median_ratio <= TARGET_RATIO)}


def markdown(results: dict[str, Any]) -> str:
    """The table README and the closing note quote."""
    m = results["machine"]
    lines = [
        "# Pod start latency through a real node (created → Ready)",
        "",
        f"{m['date']}; {m['nproc']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, "
        f"kubelet {m['kubernetes']}, containerd {m['containerd']}; load average "
        f"{m['load_average'][0]} → {m['load_average'][1]}; {results['pods_per_row']} Pods per "
        f"row after {results['warmup']} warm-up each, interleaved.",
        "",
        "| conflist | n | median | p95 | min | max |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in results["rows"].items():
        lines.append(f"| {name} | {row['n']} | {row['median'] * 1000:.0f} ms | "
                     f"{row['p95'] * 1000:.0f} ms | {row['minimum'] * 1000:.0f} ms | "
                     f"{row['maximum'] * 1000:.0f} ms |")
    verdict = "meets" if results["meets_target"] else "misses"
    lines += ["", f"vpc-attach / ptp: median {results['ratio_median']:.2f}x, p95 "
              f"{results['ratio_p95']:.2f}x — {verdict} the target of ≤ "
              f"{results['target_ratio']:.2f}x (median).", ""]
    own = results.get("vpc_attach_add_in_plugin_ms")
    if own:
        lines += [f"vpc-attach's own ADD (through the agent, `durationMs` of its log line): "
                  f"median {own['median']:.1f} ms, p95 {own['p95']:.1f} ms (n = {own['n']:.0f}).",
                  ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Bring a node up, measure, write the results, bring it down."""
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.podstart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=20, help="measured Pods per row (≥ 20)")
    parser.add_argument("--results", type=Path, default=RESULTS, metavar="DIR")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        print("needs root (a node: mounts, cgroups, network namespaces)", file=sys.stderr)
        return 2
    from e2e.harness.cluster import build
    with tempfile.TemporaryDirectory(prefix="podstart-") as scratch:
        load_before = load_average()
        node = Node.up(Path(scratch) / "node")
        try:
            subjects = run(node, args.pods)
        finally:
            node.down()
        machine = {"nproc": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(),
                   "kernel": platform.release(),
                   "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                   "load_average": [round(load_before, 2), round(load_average(), 2)],
                   "kubernetes": build.KUBERNETES.version,
                   "containerd": build.CONTAINERD.version}
    results = report(subjects, machine)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "podstart.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (args.results / "podstart.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
