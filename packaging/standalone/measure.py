"""Measure start-up time, size and temp-file behaviour of CNI executables (see README.md).

    python3 packaging/standalone/measure.py [--runs 50] NAME=PATH[@BUNDLE_DIR] ...

For each executable, interleaved round by round so that load on the machine hits every
candidate alike:
- VERSION: stdin ignored, the least a CNI call can do;
- bad ADD: a config rejected by the parser (the plugin's import path, before any kernel work);
each as median and p95 wall time over --runs runs. Then the size on disk of what it needs (for a
file inside a bundle directory, the whole directory), and what it leaves in $TMPDIR when the
runtime kills it mid-start (SIGKILL at half its median VERSION time, 10 times) -- how a plugin
that extracts itself per call leaks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BAD_ADD_CONF = json.dumps({"cniVersion": "1.1.0", "name": "n", "type": "x", "vpc": "!"}).encode()
BASE_ENV = {"PATH": "/usr/bin:/bin", "CNI_CONTAINERID": "measure", "CNI_NETNS": "/nonexistent",
            "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent",
            "VPC_ATTACH_HOST_CONFIG": "/nonexistent/host.json",
            "VPC_ATTACH_AGENT_SOCKET": "/nonexistent/agent.sock"}


@dataclass
class Candidate:
    """One executable and its samples (milliseconds)."""

    name: str
    path: Path
    bundle: Path | None
    version_ms: list[float] = field(default_factory=list)
    bad_add_ms: list[float] = field(default_factory=list)


def timed(command: list[str], env: dict[str, str], stdin: bytes) -> float:
    """Wall-clock milliseconds of one execution."""
    started = time.perf_counter()
    subprocess.run(command, input=stdin, env=env, capture_output=True, check=False)
    return (time.perf_counter() - started) * 1000


def summary(samples: list[float]) -> str:
    """median / p95 in ms."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]
    return f"{statistics.median(ordered):7.1f} / {p95:7.1f}"


def size_mib(candidate: Candidate) -> float:
    """Size of the file, or of its whole bundle directory."""
    root = candidate.bundle or candidate.path
    if root.is_file():
        return root.stat().st_size / 2**20
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()) \
        / 2**20


def leftovers_when_killed(candidate: Candidate, runs: int = 10) -> int:
    """Entries left in a fresh $TMPDIR after SIGKILLing the executable mid-start."""
    tmpdir = Path(tempfile.mkdtemp(prefix="measure-kill-"))
    try:
        delay = statistics.median(candidate.version_ms) / 2000
        env = {**BASE_ENV, "CNI_COMMAND": "VERSION", "TMPDIR": str(tmpdir)}
        for _ in range(runs):
            proc = subprocess.Popen([str(candidate.path)], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(delay)
            proc.kill()  # as a runtime's timeout does (Go's exec.CommandContext: the process)
            proc.wait()
        time.sleep(1.0)  # orphaned children finish
        return len(list(tmpdir.iterdir()))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def main() -> int:
    """Print one table row per candidate."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("targets", nargs="+", metavar="NAME=PATH[@BUNDLE_DIR]")
    args = parser.parse_args()
    candidates = []
    for target in args.targets:
        name, _, spec = target.partition("=")
        path_text, _, bundle_text = spec.partition("@")
        candidates.append(Candidate(name, Path(path_text).absolute(),
                                    Path(bundle_text) if bundle_text else None))
    version_env = {**BASE_ENV, "CNI_COMMAND": "VERSION"}
    add_env = {**BASE_ENV, "CNI_COMMAND": "ADD"}
    for candidate in candidates:  # warm the page cache
        timed([str(candidate.path)], version_env, b"")
    for _ in range(args.runs):
        for candidate in candidates:
            candidate.version_ms.append(timed([str(candidate.path)], version_env, b""))
            candidate.bad_add_ms.append(timed([str(candidate.path)], add_env, BAD_ADD_CONF))
    print(f"{'candidate':<26} {'VERSION ms med / p95':>21} {'bad ADD ms med / p95':>21}"
          f" {'size MiB':>9} {'$TMPDIR entries after 10 kills':>31}")
    for candidate in candidates:
        print(f"{candidate.name:<26} {summary(candidate.version_ms):>21} "
              f"{summary(candidate.bad_add_ms):>21} {size_mib(candidate):9.1f} "
              f"{leftovers_when_killed(candidate):>31}")
    print(f"({args.runs} runs each, interleaved; {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
