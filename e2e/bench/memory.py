"""The memory rows: the executables' peak RSS per path, and each agent's resident set after
the rounds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from e2e.bench import targets
from e2e.bench.report import MemoryRow
from e2e.bench.run import CONCURRENCY, Run
from e2e.bench.subjects import AGENT, GO, IN_PROCESS
from e2e.harness.wait import wait_until

CONNECTIONS_END_S = 10.0
CONNECTED = "03"  # /proc/net/unix St of a connected socket


def memory_rows(run: Run) -> list[MemoryRow]:
    """Peak RSS of the executables per path, and each agent's resident set now."""
    def peaks(path: str, verbs: Sequence[str]) -> list[int]:
        return [k for r in run.rows.values() if r.path == path and r.verb in verbs
                for k in r.rss_kib]
    pair = ("ADD", "DEL", f"ADD x{CONCURRENCY}", f"DEL x{CONCURRENCY}")
    agent_skip = None if any(a.problem is None for a in run.agents.values()) else \
        "no agent served this run"
    memory = [
        MemoryRow("vpc-attach executable, forwarding path (every ADD/DEL via the agent)",
                  peaks(AGENT, pair), targets.FORWARDING_RSS, skipped=agent_skip),
        MemoryRow("vpc-attach executable, in-process (every ADD/DEL)", peaks(IN_PROCESS, pair)),
        MemoryRow("vpc-attach executable, VERSION", run.rows["vpc-attach/VERSION"].rss_kib),
        MemoryRow("Go ptp executable (+ host-local), every ADD/DEL (reference)",
                  peaks(GO, pair)),
    ]
    for agent in run.agents.values():
        label = f"agent ({agent.name} control plane) steady VmRSS after the runs"
        if agent.process is None or agent.problem is not None:
            memory.append(MemoryRow(label, [], skipped=agent.problem))
            continue
        # Each connection's thread ends with it: measured once the last one is closed.
        wait_connections_closed(str(agent.process.socket))
        status = proc_status(agent.process.proc.pid)
        memory.append(MemoryRow(label, [status.get("VmRSS", 0)],
                                detail=f"peak VmHWM {status.get('VmHWM', 0) / 1024:.1f} MiB"))
    return memory


def wait_connections_closed(socket: str) -> None:
    """Until no connection accepted on this Unix socket path is open."""
    wait_until(f"no connection open on {socket}", lambda: open_connections(socket) == 0,
               CONNECTIONS_END_S, interval=0.05)


def open_connections(socket: str) -> int:
    """Connected sockets bound to this Unix socket path: the server's end of each connection
    it accepted and has not closed."""
    count = 0
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[7] == socket and fields[5] == CONNECTED:
            count += 1
    return count


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM … of a process, in KiB."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Vm") and line.endswith("kB"):
                name, value = line.split(":", 1)
                values[name] = int(value.split()[0])
    except OSError:
        pass
    return values
