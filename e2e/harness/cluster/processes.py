"""Detached control-plane processes recorded by pid files inside the cluster's state dir.

A pid is only ever signalled after /proc/PID/cmdline shows it still references the state
dir, so a recycled pid (or anything this harness did not start) is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from e2e.harness.wait import wait_until

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
KILL_WAIT_S = 5.0


class ProcessExited(RuntimeError):
    """A component exited while we were waiting for it; the message has its log tail."""


@dataclasses.dataclass
class Component:
    """One running binary: its pid file and log file live in the state dir."""

    name: str
    state_dir: Path
    pid: int
    popen: subprocess.Popen[bytes] | None = None  # set only in the process that started it
    argv: list[str] = dataclasses.field(default_factory=list)  # how it was started (restart)
    env: dict[str, str] | None = None  # its environment, when not ours (restart)

    @property
    def pid_file(self) -> Path:
        return pid_file(self.state_dir, self.name)

    @property
    def log_file(self) -> Path:
        return log_file(self.state_dir, self.name)

    def check_alive(self) -> None:
        """Raise ProcessExited (with the log tail) if the process is gone."""
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                raise ProcessExited(f"{self.name} exited with status {code}:\n{self.log_tail()}")
        elif not is_ours(self.pid, self.state_dir):
            raise ProcessExited(f"{self.name} (pid {self.pid}) is gone:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def pid_file(state_dir: Path, name: str) -> Path:
    return state_dir / "run" / f"{name}.pid"


def log_file(state_dir: Path, name: str) -> Path:
    return state_dir / "logs" / f"{name}.log"


def start(name: str, argv: list[str], state_dir: Path,
          env: Mapping[str, str] | None = None) -> Component:
    """Start ``argv`` detached (own session, no stdin) and record its pid.

    The process survives the caller's exit; ``argv`` must mention ``state_dir`` so that
    ``stop`` can recognise it later (a path inside it). ``env``: its whole environment
    (default: ours).
    """
    if not any(_marker(state_dir) in arg.encode() for arg in argv):
        raise ValueError(f"{name}: command line must reference the state dir {state_dir}")
    log_path = log_file(state_dir, name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_path = pid_file(state_dir, name)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_stream:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_stream,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
            start_new_session=True,  # not killed with the CLI's terminal or process group
            close_fds=True,
            env=None if env is None else dict(env),
        )
    pid_path.write_text(f"{popen.pid}\n")
    log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
    return Component(name=name, state_dir=state_dir, pid=popen.pid, popen=popen, argv=argv,
                     env=None if env is None else dict(env))


def restart(component: Component) -> Component:
    """Stop a component this process started and start it again, same command and environment."""
    stop(component.name, component.state_dir, component.popen)
    return start(component.name, component.argv, component.state_dir, component.env)


def read_pid(state_dir: Path, name: str) -> int | None:
    """The pid recorded for ``name`` in ``state_dir``, if any."""
    try:
        return int(pid_file(state_dir, name).read_text().strip())
    except (OSError, ValueError):
        return None


def is_ours(pid: int, state_dir: Path) -> bool:
    """Whether ``pid`` is alive (not a zombie) and its command line references ``state_dir``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # A zombie has an empty cmdline; it no longer needs a signal, only a parent's wait.
    return _marker(state_dir) in cmdline


def _marker(state_dir: Path) -> bytes:
    # "DIR/" rather than "DIR", so that /tmp/c1 never matches a process of /tmp/c10.
    return f"{state_dir}/".encode()


def stop(name: str, state_dir: Path, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the recorded process, SIGKILL it after STOP_GRACE_S; no-op if it is not ours."""
    pid = read_pid(state_dir, name)
    if pid is None:
        return
    if not is_ours(pid, state_dir):
        log.info(
            "%s: pid %d is not running from %s any more; not signalling it", name, pid, state_dir
        )
        _reap(pid, popen)
        pid_file(state_dir, name).unlink(missing_ok=True)
        return
    log.info("stopping %s (pid %d)", name, pid)
    _signal(pid, signal.SIGTERM)
    _signal(pid, signal.SIGCONT)  # a paused process acts on SIGTERM only once it runs again
    if not _wait_gone(pid, state_dir, popen, STOP_GRACE_S):
        log.warning(
            "%s (pid %d) ignored SIGTERM for %.0f s; sending SIGKILL", name, pid, STOP_GRACE_S
        )
        if is_ours(pid, state_dir):
            _signal(pid, signal.SIGKILL)
        if not _wait_gone(pid, state_dir, popen, KILL_WAIT_S):
            raise RuntimeError(f"{name} (pid {pid}) survived SIGKILL")
    pid_file(state_dir, name).unlink(missing_ok=True)


def send(name: str, state_dir: Path, signum: signal.Signals) -> int:
    """Send signum to the recorded process (e.g. SIGSTOP/SIGCONT to pause and resume it);
    its pid. Raises ProcessExited unless it is running from state_dir."""
    pid = read_pid(state_dir, name)
    if pid is None or not is_ours(pid, state_dir):
        raise ProcessExited(f"{name} is not running from {state_dir}")
    os.kill(pid, signum)
    return pid


def kill(name: str, state_dir: Path, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGKILL the recorded process at once (a crash, not a shutdown) and wait until it is
    gone; its pid file goes too. No-op if it is not ours."""
    pid = read_pid(state_dir, name)
    if pid is None:
        return
    if is_ours(pid, state_dir):
        log.info("killing %s (pid %d)", name, pid)
        _signal(pid, signal.SIGKILL)  # ends a paused (SIGSTOPped) process too
        if not _wait_gone(pid, state_dir, popen, KILL_WAIT_S):
            raise RuntimeError(f"{name} (pid {pid}) survived SIGKILL")
    _reap(pid, popen)
    pid_file(state_dir, name).unlink(missing_ok=True)


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _wait_gone(
    pid: int, state_dir: Path, popen: subprocess.Popen[bytes] | None, timeout: float
) -> bool:
    def gone() -> bool:
        if popen is not None:
            # Our child is gone once reaped: an exiting process loses its cmdline (so is_ours
            # turns False) a moment before it can be waited for.
            return popen.poll() is not None
        _reap(pid, popen)
        return not is_ours(pid, state_dir)

    try:
        wait_until(f"pid {pid} gone", gone, timeout, interval=0.1)
    except TimeoutError:
        return False
    return True


def _reap(pid: int, popen: subprocess.Popen[bytes] | None) -> None:
    """Collect the exit status if ``pid`` is our child, so it does not linger as a zombie."""
    if popen is not None:
        popen.poll()
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
