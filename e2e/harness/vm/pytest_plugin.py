"""The `fullkernel` marker: tests that need a kernel with VRF and seg6local.

Loaded for every pytest run (pyproject's ``addopts``). Where the kernel under the tests has
what they need (probed: a VRF device and an End.DT46 route into it, in a throwaway network
namespace), marked tests run like any other. Where it does not, all marked tests of the session
run in ONE boot of the full-kernel VM (`e2e.harness.vm.boot`), ``pytest <their node ids>``
inside, started in the background when the test loop starts so that the VM (one emulated vCPU)
and the native tests share the machine's time; the marked tests come last in the session, and
each waits for the VM run and reports what it did in there (setup, call and teardown reports,
carried back through the share as pytest's own serialised reports). A marked test that skips
inside the VM fails: the VM has everything these tests need, so a skip there hides a missing
piece.

``VPC_ATTACH_FULLKERNEL``: `native` (run marked tests here; set inside the VM), `vm` (always in
the VM), unset = probe. How long the VM may run follows the guest's own pace: at its start the
guest's pytest measures the plugin's cold start (`e2e.harness.pace`, once per boot), derives the
plugin's deadline in there from it, and tells the host; the host kills a VM in which no test has
finished for STALL_STARTS cold starts (`_Progress`). ``VPC_ATTACH_VM_TIMEOUT`` adds a cap in
seconds on the whole run (default: none).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MARK = "fullkernel"
# A marked test whose full-kernel part does not depend on the path (its table variant proves
# the path's part natively, on both paths): in the VM it runs once, through a warm agent, in
# the in-process pass's boot, where a verb costs no cold start of the plugin (seconds there).
ONCE = "once_through_agent"
# Set by scripts/test.sh on its agent pass: its in-process pass ran the ONCE tests already.
ONCE_RAN_ENV = "VPC_ATTACH_VM_ONCE_RAN"
VIA_ENV = "VPC_ATTACH_E2E_VIA"
# In the VM: the state dir of a control plane the host runs for the VM's tests (see
# `host_cluster`), reached over qemu's user-mode network instead of one started under emulation.
HOST_CLUSTER_ENV = "VPC_ATTACH_VM_HOST_CLUSTER"
MODE_ENV = "VPC_ATTACH_FULLKERNEL"
REPORT_ENV = "VPC_ATTACH_VM_REPORT"
SHARE_ENV = "VPC_ATTACH_VM_SHARE"
PACE_FILE = "pace.json"  # the guest's measured pace, for the host's watchdog
TIMEOUT_ENV = "VPC_ATTACH_TIMEOUT_SECONDS"
# The plugin's deadline in the guest, in cold starts measured there: a verb after its imports
# took 1-2 (ADD 7.2 s, DEL 5.3 s in all, half busy), and the default 30 s ran out once under
# CI's load (a TLS handshake); no test there is about speed, those about the deadline set theirs.
GUEST_VERB_STARTS = 15
# The host's watchdog: a test phase in the guest ends within this many of its cold starts (the
# slowest, galactic's two-node test, took 25 at a busy moment's pace), else the VM is hung.
STALL_STARTS = 150
# Until the guest has said its pace (boot, pytest's start and collection, the measurement): a
# cap that only a broken guest reaches, not a bound sized on any machine's speed.
UNTIL_PACE_S = 1800.0
# One full-kernel VM at a time on the machine (in the VM cache): another pass's VM run is waited
# for, up to a cap only a stuck run reaches (the CI's whole run is bounded at 90 min).
VM_LOCK = "vm.lock"
VM_LOCK_WAIT_S = 3600.0
# What marked tests need from the kernel, tried in a network namespace that vanishes after.
PROBE = (
    "ip link add vpa-fk-probe type vrf table 4091 && ip link set vpa-fk-probe up && "
    "sysctl -qw net.vrf.strict_mode=1 && "
    "ip -6 route add fd00:fc::/128 encap seg6local action End.DT46 vrftable 4091 dev vpa-fk-probe"
)


@dataclass
class _VMRun:
    """The session's one VM run: which tests, and what came back."""

    items: list[pytest.Item]
    via_agent: list[pytest.Item] = field(default_factory=list)  # the ONCE ones, in-process pass
    reports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    done: bool = False
    failure: str = ""  # why the VM itself failed (boot, timeout, crash), with its console tail
    share: Path | None = None
    boot_seconds: float = 0.0
    total_seconds: float = 0.0
    thread: threading.Thread | None = None
    qemu: subprocess.Popen[bytes] | None = None
    pace_note: str = ""  # what the guest measured, for the summary line
    lock_waited_s: float = 0.0  # for another pass's VM (`_one_vm_at_a_time`)

    def failed(self) -> bool:
        """Whether the VM itself or any test in it failed (or skipped: a failure here)."""
        return bool(self.failure) or any(
            report.get("outcome") != "passed" for reports in self.reports.values()
            for report in reports)


_run_key = pytest.StashKey[_VMRun]()
_cannot_run_key = pytest.StashKey[str]()  # why marked tests can run neither here nor in a VM


def kernel_lacks() -> str | None:
    """What this kernel lacks for the marked tests, or None when it has all of it."""
    probe = subprocess.run(["unshare", "--net", "sh", "-c", PROBE], capture_output=True,
                           text=True, timeout=30)
    if probe.returncode == 0:
        return None
    return probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "probe failed"


def pytest_configure(config: pytest.Config) -> None:
    """Declare nothing (pyproject declares the marker); in the VM, measure the guest's pace
    (the plugin's deadline in there follows it) and report both to the host."""
    report_path = os.environ.get(REPORT_ENV)
    if report_path:
        _calibrate_guest(Path(report_path).with_name(PACE_FILE))
        config.pluginmanager.register(_GuestReporter(config, Path(report_path)), "vm-reporter")


def _calibrate_guest(pace_file: Path) -> None:
    """Once per boot: the guest's cold start, the plugin's deadline derived from it (unless the
    run set one), both written for the host; a second pytest run of the same boot reads them."""
    from e2e.harness.pace import PACE_ENV, pace
    from netconf.host import DEFAULT_TIMEOUT_SECONDS
    with contextlib.suppress(OSError, ValueError, KeyError):
        os.environ[PACE_ENV] = str(json.loads(pace_file.read_text())["cold_start_s"])
    measured = pace()
    derived = max(DEFAULT_TIMEOUT_SECONDS, GUEST_VERB_STARTS * measured.cold_start_s)
    os.environ.setdefault(TIMEOUT_ENV, f"{math.ceil(derived)}")
    pace_file.write_text(json.dumps({"cold_start_s": measured.cold_start_s,
                                     "verb_deadline_s": float(os.environ[TIMEOUT_ENV])}))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Decide where the marked tests run: here, or in the VM; where neither can be, they fail
    saying why."""
    marked = [item for item in items if item.get_closest_marker(MARK)]
    if not marked or os.environ.get(MODE_ENV) == "native" or os.geteuid() != 0:
        return
    if os.environ.get(MODE_ENV) != "vm":
        lacks = kernel_lacks()
        if lacks is None:
            return
    from .image import missing_tools
    unavailable = missing_tools()
    if unavailable:
        # A failure, never a skip (issue 37): a skipped datapath test reads as a green run.
        config.stash[_cannot_run_key] = (
            f"needs a kernel with VRF and seg6local, and this machine has no full-kernel VM "
            f"either: {unavailable} (scripts/setup.sh all installs it)")
        return
    once = [item for item in marked
            if item.get_closest_marker(ONCE) and item.get_closest_marker("both_paths")]
    through_agent = os.environ.get(VIA_ENV) == "agent"
    if through_agent and once and os.environ.get(ONCE_RAN_ENV):
        config.hook.pytest_deselected(items=once)
        items[:] = [item for item in items if item not in set(once)]
        marked = [item for item in marked if item not in set(once)]
        if not marked:
            return
    config.stash[_run_key] = _VMRun(marked, via_agent=[] if through_agent else once)
    # Last: the native test before them tears down as if the first of them came next, and
    # nothing native comes after them that would find fixtures they never set up or tore down.
    chosen = set(marked)
    items[:] = [item for item in items if item not in chosen] + marked


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A marked test that can run neither here nor in the VM fails, saying why."""
    reason = item.config.stash.get(_cannot_run_key, None)
    if reason is not None and item.get_closest_marker(MARK):
        pytest.fail(reason, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[None]:
    """Boot the VM with its tests in the background while the native tests run."""
    vm_run = session.config.stash.get(_run_key, None)
    if vm_run is not None and not session.config.option.collectonly and vm_run.items:
        vm_run.thread = threading.Thread(target=_run_in_vm_noting_errors,
                                         args=(session.config, vm_run), name="fullkernel-vm",
                                         daemon=True)
        vm_run.thread.start()
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Report a marked test from the VM run instead of running it here."""
    vm_run = item.config.stash.get(_run_key, None)
    if vm_run is None or item not in vm_run.items:
        return None
    if vm_run.thread is not None:
        vm_run.thread.join()
    elif not vm_run.done:  # the loop did not start it (a plugin running the items itself)
        _run_in_vm(item.config, vm_run)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _reports_for(item, vm_run):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def vm_nodeids(config: pytest.Config) -> set[str]:
    """The node ids of the tests this session runs in the VM (none: it runs none there)."""
    vm_run = config.stash.get(_run_key, None)
    return {item.nodeid for item in vm_run.items} if vm_run is not None else set()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say how long the VM took and where its console is kept."""
    vm_run = config.stash.get(_run_key, None)
    if vm_run is None or not vm_run.done:
        return
    agent = f" ({len(vm_run.via_agent)} through a warm agent)" if vm_run.via_agent else ""
    line = (f"full-kernel VM: {len(vm_run.items)} tests{agent}, booted in "
            f"{vm_run.boot_seconds:.1f} s, {vm_run.total_seconds:.1f} s in all{vm_run.pace_note}")
    if vm_run.lock_waited_s >= 1:
        line += f"; waited {vm_run.lock_waited_s:.0f} s for another pass's VM"
    terminalreporter.write_sep("-", line)
    if vm_run.share is not None and vm_run.failed():
        terminalreporter.write_line(f"VM console (kept): {vm_run.share / 'console.log'}")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop a VM still running (the session ended early: -x, an interrupt); remove the VM's
    share unless something failed (then its console log is worth keeping)."""
    vm_run = config.stash.get(_run_key, None)
    if vm_run is not None and vm_run.thread is not None and vm_run.thread.is_alive():
        if vm_run.qemu is not None:
            vm_run.qemu.kill()
        vm_run.thread.join(timeout=30)
        vm_run.failure = vm_run.failure or "the session ended before the VM run did"
    if vm_run is not None and vm_run.share is not None and not vm_run.failed():
        shutil.rmtree(vm_run.share, ignore_errors=True)


def _run_in_vm_noting_errors(config: pytest.Config, vm_run: _VMRun) -> None:
    """`_run_in_vm` in a thread: what went wrong is the marked tests' failure, not lost."""
    try:
        _run_in_vm(config, vm_run)
    except Exception as exc:
        vm_run.failure = f"the full-kernel VM run could not start: {type(exc).__name__}: {exc}"


def _run_in_vm(config: pytest.Config, vm_run: _VMRun) -> None:
    vm_run.done = True
    with _one_vm_at_a_time() as waited:
        vm_run.lock_waited_s = waited
        _boot_and_run(config, vm_run)


@contextlib.contextmanager
def _one_vm_at_a_time() -> Iterator[float]:
    """Hold the machine's full-kernel VM lock (scripts/test.sh runs two passes side by side, each
    with its VM tests; two emulated vCPUs beside the native tests would slow both VMs and the
    passes); yields the seconds waited for it."""
    from cni_plugin.core.locks import acquire

    from .image import cache_root
    path = cache_root() / VM_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = time.monotonic()
        if not acquire(fd, VM_LOCK_WAIT_S):
            raise RuntimeError(f"another full-kernel VM held {path} for {VM_LOCK_WAIT_S:.0f} s")
        yield time.monotonic() - start
    finally:
        os.close(fd)


def _boot_and_run(config: pytest.Config, vm_run: _VMRun) -> None:
    from .boot import run
    vm_run.share = Path(tempfile.mkdtemp(prefix="vpc-attach-fullkernel-"))
    report_file = vm_run.share / "reports.jsonl"
    timeout = float(os.environ.get("VPC_ATTACH_VM_TIMEOUT", math.inf))
    argv = guest_command(vm_run.items, vm_run.via_agent)
    env = {REPORT_ENV: str(report_file), SHARE_ENV: str(vm_run.share)}
    progress = _Progress(report_file, vm_run.share / PACE_FILE)
    needs_cluster = any("cluster" in getattr(item, "fixturenames", ()) for item in vm_run.items)
    with open(vm_run.share / "console.log", "w") as console, \
            _host_cluster(vm_run.share, needs_cluster) as cluster_dir:

        def to_log(text: str) -> None:  # flushed: someone may be tailing it
            console.write(text)
            console.flush()

        if cluster_dir is not None:
            env[HOST_CLUSTER_ENV] = str(cluster_dir)
        result = run(argv, cwd=config.rootpath, env=env, share=vm_run.share, timeout=timeout,
                     on_output=to_log, on_start=lambda process: setattr(vm_run, "qemu", process),
                     host_network=cluster_dir is not None, watchdog=progress.stalled)
    vm_run.boot_seconds, vm_run.total_seconds = result.boot_seconds, result.total_seconds
    vm_run.pace_note = progress.note()
    if report_file.exists():
        for line in report_file.read_text().splitlines():
            data = json.loads(line)
            vm_run.reports.setdefault(data["nodeid"], []).append(data)
    if result.timed_out or result.returncode not in (0, 1):
        tail = "".join(result.console.splitlines(keepends=True)[-60:])
        vm_run.failure = (f"the full-kernel VM run ended with status {result.returncode}"
                          f"{' (timed out)' if result.timed_out else ''}; console tail:\n{tail}")


def guest_command(items: list[pytest.Item], via_agent: list[pytest.Item]) -> list[str]:
    """The guest's job: pytest over `items` as this pass runs them, then over `via_agent` (a
    part of them) through the agent."""
    pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                   "--durations=20"]
    runs = []
    as_the_pass = [item.nodeid for item in items if item not in set(via_agent)]
    if as_the_pass:
        runs.append([*pytest_argv, *as_the_pass])
    if via_agent:
        runs.append(["env", f"{VIA_ENV}=agent", *pytest_argv,
                     *(item.nodeid for item in via_agent)])
    return worst_of(runs)


def worst_of(runs: list[list[str]]) -> list[str]:
    """A command running each argv in turn and exiting with the highest status of them."""
    script = "status=0\n" + "".join(
        f'{shlex.join(run)}\ns=$?; [ "$s" -gt "$status" ] && status=$s\n' for run in runs)
    return ["sh", "-c", script + 'exit "$status"']


class _Progress:
    """The host's watchdog over the guest's tests: each finished test phase is a line in the
    reports file; the guest's measured pace (its pace file) sets how long a phase may take."""

    def __init__(self, reports: Path, pace_file: Path) -> None:
        self._reports = reports
        self._pace_file = pace_file
        self._started = self._last = time.monotonic()
        self._size = 0
        self._cold_start_s: float | None = None
        self._deadline_s: float | None = None

    def stalled(self) -> str | None:
        """Why the guest counts as hung now, or None."""
        now = time.monotonic()
        size = self._reports.stat().st_size if self._reports.exists() else 0
        if size != self._size:
            self._size, self._last = size, now
        if self._cold_start_s is None and not self._read_pace():
            if now - self._started > UNTIL_PACE_S:
                return (f"the guest did not say its pace within {UNTIL_PACE_S:.0f} s of its "
                        f"start (boot, pytest's start and collection, one measurement)")
            return None
        assert self._cold_start_s is not None
        bound = STALL_STARTS * self._cold_start_s
        if now - self._last > bound:
            return (f"no test in the VM finished a phase for {now - self._last:.0f} s (bound: "
                    f"{STALL_STARTS} x {self._cold_start_s:.2f} s, the plugin's cold start the "
                    f"guest measured at its boot)")
        return None

    def note(self) -> str:
        """What the guest measured, for the summary line."""
        if self._cold_start_s is None and not self._read_pace():
            return ""
        return (f"; its cold start {self._cold_start_s:.1f} s, the plugin's deadline in it "
                f"{self._deadline_s:.0f} s")

    def _read_pace(self) -> bool:
        try:
            measured = json.loads(self._pace_file.read_text())
        except (OSError, ValueError):
            return False
        self._cold_start_s = float(measured["cold_start_s"])
        self._deadline_s = float(measured["verb_deadline_s"])
        if not self._size:  # the first phase's time starts once the guest is measured
            self._last = time.monotonic()
        return True


@contextlib.contextmanager
def _host_cluster(share: Path, needed: bool) -> Iterator[Path | None]:
    """A control plane on the host for the VM's tests, when one of them uses it, instead of one
    emulated on the VM's one vCPU (galactic's datapath tests: 298 s instead of 399 s). Its own,
    not the native tests' (those run meanwhile and count objects cluster-wide)."""
    if not needed:
        yield None
        return
    from e2e.harness.cluster import Cluster
    cluster = Cluster.up(share / "cluster")
    try:
        yield cluster.state_dir
    finally:
        cluster.down()


def _reports_for(item: pytest.Item, vm_run: _VMRun) -> list[pytest.TestReport]:
    """The VM's reports of ``item``; a skip becomes a failure; nothing at all is a failure."""
    hook = item.config.hook
    reports = [hook.pytest_report_from_serializable(config=item.config, data=data)
               for data in vm_run.reports.get(item.nodeid, [])]
    for report in reports:
        if report.outcome == "skipped":
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            report.outcome = "failed"
            report.longrepr = f"skipped inside the full-kernel VM: {reason}"
    if not any(report.when == "call" or report.outcome != "passed" for report in reports):
        reason = vm_run.failure or "the VM run reported nothing for this test"
        reports.append(pytest.TestReport(item.nodeid, item.location, {}, "failed", reason,
                                         "call", [], 0.0))
    return reports


class _GuestReporter:
    """Inside the VM: every test report, serialised, one JSON line each, for the host."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self._config = config
        self._path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self._config.hook.pytest_report_to_serializable(config=self._config,
                                                                report=report)
        with open(self._path, "a") as out:
            out.write(json.dumps(data) + "\n")

