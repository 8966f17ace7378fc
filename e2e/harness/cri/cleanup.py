"""Tearing down what a containerd left: its sandboxes (through the CRI, so each gets its CNI
DEL), containers runc still knows after containerd is gone, and shims serving its socket.
Shared by the CRI e2e's containerd (`containerd.py`) and the node's (`e2e/node/runtime.py`).
Each returns the problems it met or the leftovers it removed, one line each."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from e2e.harness.cri.client import CriClient, CriError

RUNC_DELETE_S = 30.0


def remove_sandboxes(cri: CriClient) -> list[str]:
    """Stop and remove every sandbox the runtime knows."""
    problems = []
    try:
        sandboxes = cri.list_pod_sandboxes()
    except CriError as exc:
        return [f"listing sandboxes: {exc}"]
    for sandbox_id in sandboxes:
        try:
            cri.stop_pod_sandbox(sandbox_id)
            cri.remove_pod_sandbox(sandbox_id)
        except CriError as exc:
            problems.append(f"sandbox {sandbox_id}: {exc}")
    return problems


def delete_containers(runc: list[str], root: Path) -> list[str]:
    """`runc --root ROOT delete --force` every container under `root`; `runc` is the command
    that runs runc (e.g. prefixed by nsenter)."""
    if not root.is_dir():
        return []
    problems = []
    for state in root.iterdir():
        proc = subprocess.run([*runc, "--root", str(root), "delete", "--force", state.name],
                              capture_output=True, text=True, timeout=RUNC_DELETE_S,
                              check=False)
        problems.append(f"left-over container {state.name} deleted with runc"
                        + (f" ({proc.stderr.strip()})" if proc.returncode else ""))
    return problems


def kill_shims(socket: Path) -> list[str]:
    """SIGKILL the shims serving `socket` only (their command line names it)."""
    problems = []
    for pid in pids():
        argv = cmdline(pid).split("\0")
        if "-address" in argv and str(socket) in argv and "containerd-shim" in argv[0]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            problems.append(f"left-over shim {pid} killed")
    return problems


def cmdline(pid: int) -> str:
    """A process's command line, NUL-separated ("" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def pids() -> list[int]:
    """Every process id now."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
