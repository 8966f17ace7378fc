"""The IPAM delegate named by `ipam.type`, behind one small interface (`IpamBackend`).

An IPAM plugin found in CNI_PATH is exec'd the way libcni's invoke package does: the same CNI_*
environment (CNI_COMMAND set to the verb), the network config on stdin, one JSON answer on
stdout. Our own `vpc-attach-ipam` is called in-process, its verbs directly: same environment
and config, no second interpreter and no JSON round trip.

`start_add` returns a `PendingAdd`: an exec'd plugin runs while ADD creates the links, which
need no addresses yet; `result()` collects it.

Only the in-process plugin takes an IPAMClaim (`InProcessIpam.start_claimed_add`): the claim
vpc-attach read is a typed argument, never a key of the config a tenant wrote (which could name
someone else's claim). Its ADD knows what it did, so its rollback (`PendingAdd.undo`) gives
back only that. It runs on the verb's node settings, session and deadline (`Caller`): a block
claim or a lend inside an ADD reads no host file, opens no client and gets no fresh deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Protocol

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation, Request
from cni_plugin.ipam.plugin.caller import Caller
from cni_plugin.ipam.plugin.store import ClaimOwner
from netconf.config import OWN_IPAM
from netconf.errors import INVALID_CONFIG, IO_FAILURE, TRY_AGAIN_LATER, CniError
from netconf.host import HostSettings, NodeSettings
from netconf.result import Result
from netconf.runtime import RuntimeEnv

if TYPE_CHECKING:
    from cni_plugin.kube.session import VerbCluster


def find_plugin(plugin_type: str, cni_path: tuple[str, ...]) -> str:
    """Absolute path of the plugin `plugin_type` in CNI_PATH (code 7 naming it if absent)."""
    for directory in cni_path:
        candidate = os.path.join(directory, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CniError(INVALID_CONFIG, f"invalid config key 'ipam.type': plugin {plugin_type!r} "
                   "not found in CNI_PATH", f"searched: {', '.join(cni_path) or '(empty)'}")


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


def _environ(env: RuntimeEnv, command: str, node: NodeSettings) -> dict[str, str]:
    """The delegate's environment for command: PATH etc. from ours, but the invocation's CNI_*
    values and node settings (an agent's request carries the runtime's), not this process's."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    return {**inherited, **node.environ, **env.to_environ(), "CNI_COMMAND": command}


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


class PendingAdd(Protocol):
    """A delegated ADD in flight."""

    @property
    def failed(self) -> bool:
        """Whether the delegate answered with an error (then it allocated nothing)."""

    def result(self) -> Result:
        """The allocation (waits for the delegate; its CNI error, or code 11 on timeout)."""

    def settle(self, deadline: Deadline) -> None:
        """Make sure the delegate no longer runs (before its DEL undoes the ADD): let it
        finish within deadline, else kill it."""

    @property
    def undo(self) -> Callable[[Deadline], None] | None:
        """The undo of exactly what this ADD did, when known (in-process), within a deadline;
        None: DEL it."""


class IpamBackend(Protocol):
    """One IPAM plugin: ADD started in the background, the other verbs run to completion."""

    plugin_type: str

    def start_add(self, stdin: bytes, deadline: Deadline) -> PendingAdd:
        """Start a delegated ADD."""

    def run(self, command: str, stdin: bytes, deadline: Deadline) -> None:
        """Delegated DEL, CHECK, STATUS or GC (its CNI error re-raised on failure)."""


def backend(plugin_type: str, env: RuntimeEnv, node: NodeSettings | None = None,
            host: HostSettings | None = None, cluster: VerbCluster | None = None) -> IpamBackend:
    """The delegate named plugin_type for this invocation (code 7 when not in CNI_PATH);
    node: the invocation's node settings, which it sees as ours (an executable in its
    environment); host and cluster: the verb's host settings and session, which our own
    plugin uses in-process (without them it makes its own, as its executable does)."""
    path = find_plugin(plugin_type, env.cni_path)
    node = NodeSettings({}) if node is None else node
    if plugin_type == OWN_IPAM:
        return InProcessIpam(plugin_type, env, node, host, cluster)
    return ExecIpam(plugin_type, path, env, node)


def of(inv: Invocation, cluster: VerbCluster) -> IpamBackend | None:
    """The invocation's IPAM delegate on the verb's session, or None when the config has no
    ipam block."""
    if inv.conf.ipam is None:
        return None
    return backend(str(inv.conf.ipam["type"]), inv.env, inv.node, inv.host, cluster)


class ExecIpam:
    """An IPAM plugin executable, run as a child process."""

    def __init__(self, plugin_type: str, path: str, env: RuntimeEnv,
                 node: NodeSettings) -> None:
        self.plugin_type = plugin_type
        self.path = path
        self.env = env
        self.node = node

    def start_add(self, stdin: bytes, deadline: Deadline) -> PendingAdd:
        """Start the executable; its answer is collected by `result()`."""
        return RunningAdd(self.plugin_type, self.path,
                          _environ(self.env, "ADD", self.node), stdin, deadline)

    def run(self, command: str, stdin: bytes, deadline: Deadline) -> None:
        """Run the executable to completion within the deadline."""
        try:
            proc = subprocess.run([self.path], input=stdin,
                                  env=_environ(self.env, command, self.node),
                                  capture_output=True, timeout=deadline.remaining(), check=False)
        except subprocess.TimeoutExpired:
            raise _timed_out(self.plugin_type, command, deadline) from None
        except OSError as exc:
            raise CniError(IO_FAILURE, f"cannot run IPAM plugin {self.plugin_type!r}: "
                           f"{exc}") from None
        _answer(self.plugin_type, command, proc.returncode, proc.stdout, proc.stderr)


class InProcessIpam:
    """vpc-attach-ipam's verbs, called in this process with the node's settings vpc-attach
    read (the host file is not read again), on the verb's session and deadline."""

    def __init__(self, plugin_type: str, env: RuntimeEnv, node: NodeSettings,
                 host: HostSettings | None = None, cluster: VerbCluster | None = None) -> None:
        self.plugin_type = plugin_type
        self.env = env
        self.node = node
        self.host = host
        self.cluster = cluster

    def start_add(self, stdin: bytes, deadline: Deadline) -> PendingAdd:
        """Allocate now (nothing to overlap)."""
        return self.start_claimed_add(stdin, deadline, None)

    def start_claimed_add(self, stdin: bytes, deadline: Deadline, claim: ClaimOwner | None,
                          claim_ips: tuple[str, ...] = ()) -> PendingAdd:
        """Allocate now, the records owned by claim (the IPAMClaim vpc-attach read) when
        given, its `status.ips` requested exactly."""
        from cni_plugin.ipam.plugin import verbs
        try:
            done = verbs.add_owned(self._request("ADD", stdin), claim, claim_ips,
                                   caller=self._caller(deadline))
        except CniError as exc:
            return FinishedAdd(self._as_delegate(exc, "ADD"))
        return FinishedAdd(done.result, done.undo)

    def run(self, command: str, stdin: bytes, deadline: Deadline) -> None:
        """Run the verb now."""
        from cni_plugin.ipam.plugin import verbs
        verb = {"DEL": verbs.delete, "CHECK": verbs.check, "STATUS": verbs.status,
                "GC": verbs.gc}[command]
        try:
            verb(self._request(command, stdin), self._caller(deadline))
        except CniError as exc:
            raise self._as_delegate(exc, command) from None

    def _caller(self, deadline: Deadline) -> Caller | None:
        if self.host is None or self.cluster is None:
            return None  # no verb to lend them: the plugin's own, as the executable
        return Caller(self.node, self.host, self.cluster, deadline)

    def _request(self, command: str, stdin: bytes) -> Request:
        return Request(environ=_environ(self.env, command, self.node), stdin=stdin)

    def _as_delegate(self, exc: CniError, command: str) -> CniError:
        # What the executable's error answer would have become; the original stays its cause
        # (an IPAMClaim's failed condition tells a taken address from an exhausted pool).
        answer = CniError(exc.code, f"IPAM plugin {self.plugin_type!r}: {exc.msg}", exc.details)
        answer.__cause__ = exc
        return answer


class FinishedAdd:
    """An ADD whose answer is already known (and, in-process, how to undo it)."""

    def __init__(self, done: Result | CniError,
                 undo: Callable[[Deadline], None] | None = None) -> None:
        self._done = done
        self._undo = undo

    @property
    def undo(self) -> Callable[[Deadline], None] | None:
        """The in-process ADD's own undo, if it gave one."""
        return self._undo

    @property
    def failed(self) -> bool:
        """Whether it answered with an error."""
        return isinstance(self._done, CniError)

    def result(self) -> Result:
        """The allocation, or its error."""
        if isinstance(self._done, CniError):
            raise self._done
        return self._done

    def settle(self, deadline: Deadline) -> None:
        """Nothing runs."""


class RunningAdd:
    """An exec'd delegate's ADD in flight.

    It gets as much of its stdin up front as its pipe takes without blocking (a network config
    fits in the 64 KiB a pipe holds); the rest is written when the result is collected.
    """

    def __init__(self, plugin_type: str, path: str, environ: dict[str, str], stdin: bytes,
                 deadline: Deadline) -> None:
        self.plugin_type = plugin_type
        self._deadline = deadline
        self._stdin: bytes | None = stdin
        self._done: Result | CniError | None = None
        try:
            self._proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=environ)
        except OSError as exc:
            raise CniError(IO_FAILURE, f"cannot run IPAM plugin {plugin_type!r}: {exc}") from None
        self._feed()

    def _feed(self) -> None:
        # Write what the pipe takes without blocking (a whole network config, normally); the
        # rest, if any, goes with communicate(), under the deadline like everything else.
        pipe = self._proc.stdin
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
            self._proc.stdin = None  # communicate() skips it
            self._stdin = None

    @property
    def failed(self) -> bool:
        """Whether the delegate answered with an error (then it allocated nothing)."""
        return isinstance(self._done, CniError)

    @property
    def undo(self) -> None:
        """Not known: its DEL undoes it."""
        return None

    def result(self) -> Result:
        """The allocation (waits for the delegate; its CNI error, or code 11 on timeout)."""
        if self._done is None:
            self._done = self._collect()
        if isinstance(self._done, CniError):
            raise self._done
        return self._done

    def _collect(self) -> Result | CniError:
        rest, self._stdin = self._stdin, None  # a later communicate() resumes, without input
        try:
            stdout, stderr = self._proc.communicate(rest, timeout=self._deadline.remaining())
        except subprocess.TimeoutExpired:
            self._kill()  # the deadline is spent
            raise _timed_out(self.plugin_type, "ADD", self._deadline) from None
        try:
            return _allocation(self.plugin_type, _answer(self.plugin_type, "ADD",
                                                         self._proc.returncode, stdout, stderr))
        except CniError as exc:
            return exc

    def settle(self, deadline: Deadline) -> None:
        """Let the delegate finish within deadline, or kill it."""
        if self._proc.poll() is not None:
            return
        rest, self._stdin = self._stdin, None
        with suppress(subprocess.TimeoutExpired):
            self._proc.communicate(rest, timeout=deadline.remaining())
            return
        self._kill()

    def _kill(self) -> None:
        self._proc.kill()
        self._proc.communicate()
