"""Run an IPAM plugin found in CNI_PATH, the way libcni's invoke package does.

The delegate gets the same CNI_* environment (with CNI_COMMAND set to the verb) and the full
network config on stdin; its answer is one JSON document on stdout.

ADD starts the delegate as a `PendingAdd` and collects its answer when the addresses are needed:
an exec'd plugin (a Go `host-local` takes ~4 ms, mostly its start-up) runs while ADD creates the
links, which need no addresses yet.
"""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import suppress
from typing import Any

from cni_plugin.core.deadline import Deadline
from netconf.errors import INVALID_CONFIG, IO_FAILURE, TRY_AGAIN_LATER, CniError
from netconf.result import Result
from netconf.runtime import RuntimeEnv

OWN_IPAM = "vpc-attach-ipam"


def find_plugin(plugin_type: str, cni_path: tuple[str, ...]) -> str:
    """Absolute path of the plugin `plugin_type` in CNI_PATH (code 7 naming it if absent)."""
    for directory in cni_path:
        candidate = os.path.join(directory, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CniError(INVALID_CONFIG, f"invalid config key 'ipam.type': plugin {plugin_type!r} "
                   "not found in CNI_PATH", f"searched: {', '.join(cni_path) or '(empty)'}")


def invoke(plugin_type: str, command: str, env: RuntimeEnv, stdin: bytes,
           deadline: Deadline) -> dict[str, Any] | None:
    """Run the delegate; its parsed stdout on success, its own CNI error re-raised on failure."""
    path, child_env = _delegate(plugin_type, command, env)
    if plugin_type == OWN_IPAM:
        return _invoke_own(plugin_type, command, child_env, stdin)
    try:
        proc = subprocess.run([path], input=stdin, env=child_env, capture_output=True,
                              timeout=deadline.remaining(), check=False)
    except subprocess.TimeoutExpired:
        raise _timed_out(plugin_type, command, deadline) from None
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot run IPAM plugin {plugin_type!r}: {exc}") from None
    return _answer(plugin_type, command, proc.returncode, proc.stdout, proc.stderr)


def _timed_out(plugin_type: str, command: str, deadline: Deadline) -> CniError:
    return CniError(TRY_AGAIN_LATER, f"IPAM plugin {plugin_type!r} timed out on {command}",
                    f"no answer within {deadline.seconds:g}s")


def _answer(plugin_type: str, command: str, returncode: int, stdout: bytes,
            stderr: bytes) -> dict[str, Any] | None:
    """The delegate's parsed answer, or its own CNI error."""
    stdout = stdout.strip()
    if returncode != 0:
        raise _delegate_error(plugin_type, command, stdout, stderr)
    if not stdout:
        return None
    try:
        data = json.loads(stdout)
    except ValueError:
        raise CniError(IO_FAILURE, f"IPAM plugin {plugin_type!r} answered {command} with "
                       "invalid JSON", stdout[:200].decode(errors="replace")) from None
    return data if isinstance(data, dict) else None


def _invoke_own(plugin_type: str, command: str, environ: dict[str, str],
                stdin: bytes) -> dict[str, Any] | None:
    # Our own IPAM plugin answers exactly as its executable would, without starting a second
    # Python (about 0.25 s of imports per call): same env, same stdin, same JSON answer.
    from cni_plugin.core.request import Request
    from cni_plugin.ipam.plugin.dispatch import run

    status, payload = run(Request(environ=environ, stdin=stdin))
    if status != 0:
        raise _delegate_error(plugin_type, command, json.dumps(payload).encode(), b"")
    return payload


def _delegate(plugin_type: str, command: str, env: RuntimeEnv) -> tuple[str, dict[str, str]]:
    """The delegate's path in CNI_PATH and its environment for command: PATH etc. from ours,
    but the invocation's CNI_* values, not this process's."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    return (find_plugin(plugin_type, env.cni_path),
            {**inherited, **env.to_environ(), "CNI_COMMAND": command})


def _delegate_error(plugin_type: str, command: str, stdout: bytes, stderr: bytes) -> CniError:
    try:
        err = json.loads(stdout)
        code, msg, details = int(err["code"]), str(err["msg"]), str(err.get("details", ""))
    except (ValueError, KeyError, TypeError):
        text = (stdout or stderr).decode(errors="replace").strip()[:300]
        return CniError(IO_FAILURE, f"IPAM plugin {plugin_type!r} failed on {command}", text)
    return CniError(code, f"IPAM plugin {plugin_type!r}: {msg}", details)


def _allocation(plugin_type: str, data: dict[str, Any] | None) -> Result:
    if data is None:
        raise CniError(IO_FAILURE, f"IPAM plugin {plugin_type!r} returned no result")
    return Result.from_wire(data, f"the result of IPAM plugin {plugin_type!r}")


class PendingAdd:
    """A delegated ADD in flight: `result()` collects it; `settle()` ends it for a rollback.

    Our own IPAM plugin runs in-process at once (no process to overlap). An exec'd plugin gets
    as much of its stdin up front as its pipe takes without blocking (a network config fits in
    the 64 KiB a pipe holds); the rest is written when the result is collected.
    """

    def __init__(self, plugin_type: str, env: RuntimeEnv, stdin: bytes,
                 deadline: Deadline) -> None:
        self.plugin_type = plugin_type
        self._deadline = deadline
        self._stdin: bytes | None = stdin
        self._done: Result | CniError | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        path, child_env = _delegate(plugin_type, "ADD", env)
        if plugin_type == OWN_IPAM:
            try:
                self._done = _allocation(plugin_type, _invoke_own(plugin_type, "ADD",
                                                                  child_env, stdin))
            except CniError as exc:
                self._done = exc
            return
        try:
            self._proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=child_env)
        except OSError as exc:
            raise CniError(IO_FAILURE, f"cannot run IPAM plugin {plugin_type!r}: {exc}") from None
        self._feed()

    def _feed(self) -> None:
        # Write what the pipe takes without blocking (a whole network config, normally); the
        # rest, if any, goes with communicate(), under the deadline like everything else.
        pipe = self._proc.stdin if self._proc is not None else None
        if pipe is None or self._stdin is None:
            return
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        try:
            written = os.write(fd, self._stdin)
        except BlockingIOError:
            written = 0
        except BrokenPipeError:  # it exited early: its answer says why
            written = len(self._stdin)
        finally:
            os.set_blocking(fd, True)
        self._stdin = self._stdin[written:]
        if not self._stdin:
            with suppress(BrokenPipeError):
                pipe.close()
            self._proc.stdin = None  # type: ignore[union-attr]  # communicate() skips it
            self._stdin = None

    @property
    def failed(self) -> bool:
        """Whether the delegate answered with an error (then it allocated nothing)."""
        return isinstance(self._done, CniError)

    def result(self) -> Result:
        """The allocation (waits for the delegate; its CNI error, or code 11 on timeout)."""
        if self._done is None:
            self._done = self._collect()
        if isinstance(self._done, CniError):
            raise self._done
        return self._done

    def _collect(self) -> Result | CniError:
        assert self._proc is not None
        rest, self._stdin = self._stdin, None  # a later communicate() resumes, without input
        try:
            stdout, stderr = self._proc.communicate(rest, timeout=self._deadline.remaining())
        except subprocess.TimeoutExpired:
            self.settle(wait=False)  # the deadline is spent
            raise _timed_out(self.plugin_type, "ADD", self._deadline) from None
        try:
            return _allocation(self.plugin_type, _answer(self.plugin_type, "ADD",
                                                         self._proc.returncode, stdout, stderr))
        except CniError as exc:
            return exc

    def settle(self, wait: bool = True) -> None:
        """Make sure the delegate no longer runs (before its DEL undoes the ADD): let it finish
        within what is left of the deadline (at least 1 s), or kill it (at once: not wait)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        rest, self._stdin = self._stdin, None
        if wait:
            with suppress(subprocess.TimeoutExpired):
                self._proc.communicate(rest, timeout=max(self._deadline.remaining(), 1.0))
                return
        self._proc.kill()
        self._proc.communicate()


def delete(plugin_type: str, env: RuntimeEnv, stdin: bytes, deadline: Deadline) -> None:
    """Delegated DEL (release this container's allocation)."""
    invoke(plugin_type, "DEL", env, stdin, deadline)


def forward(plugin_type: str, command: str, env: RuntimeEnv, stdin: bytes,
            deadline: Deadline) -> None:
    """Delegated CHECK / STATUS / GC."""
    invoke(plugin_type, command, env, stdin, deadline)
