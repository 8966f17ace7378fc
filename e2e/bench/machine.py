"""The report's machine and settings lines, and the load average read around the rounds."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any

from e2e.bench.run import CONCURRENCY, INVOKE_TIMEOUT, SMALL_OBJECTS, VERSION_TIMEOUT, Run


def machine(run: Run) -> dict[str, Any]:
    """CPUs, kernel, date, load, and the versions the run measured against."""
    from e2e.harness.cluster import build
    from e2e.harness.tools.gotools import PLUGINS_VERSION
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(),
            "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": [round(run.load_before, 2), round(run.load_after, 2)],
            "python": platform.python_version(), "go_plugins": PLUGINS_VERSION,
            "kubernetes": build.KUBERNETES.version}


def settings(run: Run) -> dict[str, Any]:
    """How much was measured, and how."""
    options = run.options
    return {"runs": options.runs, "warmup": options.warmup,
            "bursts": options.bursts, "concurrency": CONCURRENCY,
            "objects": {"small": SMALL_OBJECTS, "large": options.objects},
            "quick": options.quick, "percentile_method": "nearest-rank",
            "timeouts_s": {"invoke": INVOKE_TIMEOUT, "version": VERSION_TIMEOUT}}


def load_average() -> float:
    """The 1-minute load average (other work competing for the CPUs)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
