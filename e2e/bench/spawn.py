"""Execute a CNI plugin the way a runtime does (env + stdin, one process) and measure it.

Each plugin is started by `launch` (launcher/main.go, built once with the Go toolchain and
cached): it execs the plugin exactly like libcni (Go `exec.Cmd`, stdin from a buffer, stdout
and stderr into buffers) and reports the wall time of that exec and the plugin's peak RSS from
`wait4`. Started straight from this Python process, a plugin's ru_maxrss would include the
bench's own ~40 MiB (the kernel keeps the exec'ing process's high-water mark).

The launcher kills the plugin at its timeout. Each launcher runs in its own process group, so
an interrupted run kills the launcher and its plugin together, and whatever a plugin left
running when it exited is killed before the launcher is reaped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LAUNCHER_SOURCE = Path(__file__).resolve().parent / "launcher"
BUILD_TIMEOUT = 300.0
GRACE = 10.0  # beyond the plugin's timeout, before the launcher itself is killed
PIPE_CAPACITY = 65536

_live: set[int] = set()
_live_lock = threading.Lock()
_launcher: list[str] = []


@dataclass(frozen=True)
class Execution:
    """One finished (or killed) plugin process, as the runtime saw it."""

    status: int  # exit status; negative: killed by that signal
    elapsed_ms: float
    max_rss_kib: int
    stdout: bytes
    stderr: bytes
    timed_out: bool


def launcher() -> str:
    """The launcher binary, built on first use into the project's Go cache."""
    if _launcher:
        return _launcher[0]
    from e2e.harness.tools.gotools import cache_root
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((LAUNCHER_SOURCE / name).read_bytes())
    entry = cache_root() / f"bench-launcher-{digest.hexdigest()[:16]}"
    binary = entry / "launch"
    if not os.access(binary, os.X_OK):
        entry.mkdir(parents=True, exist_ok=True)
        _build(entry, binary)
    _launcher.append(str(binary))
    return str(binary)


def _build(entry: Path, binary: Path) -> None:
    from e2e.harness.tools.gotools import go_binary, go_env
    go = go_binary()
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as scratch:
        env = go_env(Path(scratch))
        staged = entry / f".launch-{os.getpid()}"  # renamed into place: never half-written
        proc = subprocess.run([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(staged),
                               "."], cwd=LAUNCHER_SOURCE, env=env, capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"building the bench launcher failed: {proc.stderr.strip()}")
        os.replace(staged, binary)


def run(argv: Sequence[str], env: Mapping[str, str], stdin: bytes, timeout: float) -> Execution:
    """Run the plugin argv[0] to completion (killed after timeout seconds)."""
    stdin_fd = _stdin_fd(stdin)
    out_fd = os.memfd_create("bench-stdout", os.MFD_CLOEXEC)
    err_fd = os.memfd_create("bench-stderr", os.MFD_CLOEXEC)
    result_fd = os.memfd_create("bench-result", os.MFD_CLOEXEC)
    pid = -1
    try:
        actions = [(os.POSIX_SPAWN_DUP2, stdin_fd, 0), (os.POSIX_SPAWN_DUP2, out_fd, 1),
                   (os.POSIX_SPAWN_DUP2, err_fd, 2), (os.POSIX_SPAWN_DUP2, result_fd, 3)]
        command = [launcher(), str(int(timeout * 1000)), *argv[:1]]
        pid = os.posix_spawn(command[0], command, dict(env), file_actions=actions, setpgroup=0)
        with _live_lock:
            _live.add(pid)
        _wait_exit(pid, timeout + GRACE)
        _kill_group(pid)  # the plugin's leftovers, if any (the zombie launcher keeps the group)
        _, status, _ = os.wait4(pid, 0)
        _forget(pid)
        pid = -1
        return _execution(os.waitstatus_to_exitcode(status), _read_all(result_fd),
                          _read_all(out_fd), _read_all(err_fd))
    finally:
        if pid > 0:  # interrupted between spawn and reap: leave nothing running
            _kill_group(pid)
            os.waitpid(pid, 0)
            _forget(pid)
        for fd in (stdin_fd, out_fd, err_fd, result_fd):
            os.close(fd)


def kill_all() -> None:
    """SIGKILL every launcher still running, with its plugin (their threads then reap them)."""
    with _live_lock:
        pids = list(_live)
    for pid in pids:
        _kill_group(pid)


def _execution(launcher_status: int, result: bytes, stdout: bytes, stderr: bytes) -> Execution:
    try:
        report = json.loads(result)
    except ValueError:
        message = f"launcher exit {launcher_status} without a report".encode()
        return Execution(-1, 0.0, 0, stdout, stderr + b"\n" + message, timed_out=False)
    return Execution(status=int(report["status"]), elapsed_ms=report["elapsed_ns"] / 1e6,
                     max_rss_kib=int(report["maxrss_kib"]), stdout=stdout, stderr=stderr,
                     timed_out=bool(report["timed_out"]))


def _stdin_fd(data: bytes) -> int:
    if len(data) < PIPE_CAPACITY:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        os.write(write_end, data)
        os.close(write_end)
        return read_end
    fd = os.memfd_create("bench-stdin", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _wait_exit(pid: int, timeout: float) -> None:
    """Wait at most timeout seconds for pid to exit (it stays a zombie until reaped)."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.poll(timeout * 1000)
    finally:
        os.close(pidfd)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _forget(pid: int) -> None:
    with _live_lock:
        _live.discard(pid)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)
