"""What every step of one benchmark run shares: its options, its names and work dir, the
control planes and agents it started, and the rows it fills."""

from __future__ import annotations

import secrets
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.bench import spawn
from e2e.bench.kernel import KernelJanitor
from e2e.bench.report import Row

INVOKE_TIMEOUT = 60.0  # every ADD/DEL; the plugin's own deadline is 30 s
VERSION_TIMEOUT = 20.0
CONCURRENCY = 32
SMALL_OBJECTS = 10
SMALL, LARGE = "small", "large"


@dataclass(frozen=True)
class Options:
    """How much to measure."""

    runs: int
    warmup: int
    bursts: int
    objects: int
    quick: bool
    with_cluster: bool = True
    only: frozenset[str] = frozenset()  # subject keys to measure (the Go reference always)


@dataclass
class Invocation:
    """Which row an invocation belongs to, to find its log line afterwards."""

    row: str
    verb: str
    container_id: str
    via_agent: bool


@dataclass
class Agent:
    """A started node agent (or why it is not there)."""

    name: str
    socket: Path
    process: Any = None  # e2e.harness.agentproc.AgentProcess
    problem: str | None = None


@dataclass
class Run:
    """Everything one run creates and measures; `Bench.close()` removes what it created."""

    options: Options
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    workdir: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="vpc-attach-bench-")))
    notes: list[str] = field(default_factory=list)
    clusters: dict[str, Any] = field(default_factory=dict)  # e2e.harness.cluster.Cluster
    cluster_problem: dict[str, str] = field(default_factory=dict)
    agents: dict[str, Agent] = field(default_factory=dict)
    rows: dict[str, Row] = field(default_factory=dict)
    invocations: list[Invocation] = field(default_factory=list)
    pods: dict[str, dict[str, str]] = field(default_factory=dict)  # cluster -> pod -> uid
    load_before: float = 0.0
    load_after: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.janitor = KernelJanitor(self.token)
        self.node = f"bench-node-{self.token}"

    def record(self, row: Row, done: spawn.Execution, problem: str | None,
               invocation: Invocation | None = None) -> None:
        """Add one invocation's sample to its row (or count its failure); thread-safe."""
        with self._lock:
            if problem is not None:
                row.fail(problem)
                return
            row.samples.append(done.elapsed_ms)
            row.rss_kib.append(done.max_rss_kib)
            if invocation is not None:
                self.invocations.append(invocation)


def log(message: str) -> None:
    """Progress to stderr (stdout stays quiet)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def one_line(text: str, limit: int = 240) -> str:
    """text on one line, cut at limit characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"
