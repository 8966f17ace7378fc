"""galactic's own eBPF vrf_table sweep (``gc.SweepEBPFVRFTable``, what ``galactic-cni run``
calls every 5 minutes), run once on demand by the program built next to galactic-cni
(``sweep/main.go``) against a node's pins."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

SWEEP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SweepResult:
    """galactic's CleanupResult, and what the sweep logged (galactic's slog lines)."""

    orphaned_crds_removed: int
    orphaned_vrfs_removed: int
    ebpf_vrf_entries_removed: int
    ebpf_nptv6_entries_removed: int
    errors: int
    log: str


def parse_sweep_result(stdout: str, stderr: str) -> SweepResult:
    """The program's output: CleanupResult's JSON (Go field names) on stdout, its log on
    stderr."""
    result = json.loads(stdout)
    return SweepResult(
        orphaned_crds_removed=int(result["OrphanedCRDsRemoved"]),
        orphaned_vrfs_removed=int(result["OrphanedVRFsRemoved"]),
        ebpf_vrf_entries_removed=int(result["EBPFVRFEntriesRemoved"]),
        ebpf_nptv6_entries_removed=int(result["EBPFNPTv6EntriesRemoved"]),
        errors=int(result["Errors"]),
        log=stderr,
    )


def run_sweep(program: Path, prefix: list[str], kubeconfig: Path, node_name: str,
              namespace: str, pin_dir: str | None = None, router_gc: bool = False
              ) -> SweepResult:
    """Run the sweep once as a process of a node (``prefix``: e.g. ``DatapathNode.prefix``, so
    galactic's default pin directory /sys/fs/bpf/galactic is that node's); raise with its
    output if it fails (a missing pin directory included). ``router_gc``: galactic-router's
    GC pass (``gc.RunGC``: orphaned BGP objects and VRF devices of the node) instead."""
    argv = [*prefix, str(program), "--kubeconfig", str(kubeconfig), "--node-name", node_name,
            "--namespace", namespace, *(["--router-gc"] if router_gc else [])]
    if pin_dir is not None:
        argv += ["--pin-dir", pin_dir]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{program.name} failed ({done.returncode}):\n{done.stderr}")
    return parse_sweep_result(done.stdout, done.stderr)
