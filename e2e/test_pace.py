"""The e2e bounds follow the machine: a verb's bound is its own deadline plus cold starts
measured here, an expired bound says what it was made of, and the full-kernel VM's watchdog
kills a guest that stopped finishing tests (by the pace the guest measured), not one that is
merely slow."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_plugin.ipam.plugin.config import DEFAULT_LOCK_TIMEOUT_SECONDS
from e2e.harness import pace
from e2e.harness.faults import matrix
from e2e.harness.plugin import Plugin
from e2e.harness.vm.boot import _wait_or_kill
from e2e.harness.vm.pytest_plugin import STALL_STARTS, _Progress, worst_of
from e2e.harness.wait import wait_until
from netconf.host import DEFAULT_TIMEOUT_SECONDS

COLD_START_S = 0.01  # the pace these tests pretend to have measured


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Iterator[pace.Pace]:
    """This process's pace replaced by COLD_START_S for one test (and measured anew after)."""
    monkeypatch.setenv(pace.PACE_ENV, str(COLD_START_S))
    pace.pace.cache_clear()
    yield pace.pace()
    pace.pace.cache_clear()


def test_the_deadline_a_verb_may_have_is_the_largest_of_its_sources(tmp_path: Path) -> None:
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps({"timeoutSeconds": 45}))
    assert pace.verb_deadline({}) == DEFAULT_TIMEOUT_SECONDS
    assert pace.verb_deadline({"VPC_ATTACH_TIMEOUT_SECONDS": "1.5"}) == 1.5
    assert pace.verb_deadline({"VPC_ATTACH_TIMEOUT_SECONDS": "1.5"}, {"timeoutSeconds": 7}) == 7
    assert pace.verb_deadline({"VPC_ATTACH_TIMEOUT_SECONDS": "1.5",
                               "VPC_ATTACH_HOST_CONFIG": str(host_file)}) == 45
    assert pace.verb_deadline({"VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent.json"),
                               "VPC_ATTACH_TIMEOUT_SECONDS": "nonsense"}) == \
        DEFAULT_TIMEOUT_SECONDS


def test_a_verbs_bound_is_its_deadline_its_lock_wait_the_grace_and_cold_starts(
        measured: pace.Pace) -> None:
    bound = pace.verb_bound({"VPC_ATTACH_TIMEOUT_SECONDS": "3"},
                            {"ipam": {"type": "vpc-attach-ipam", "lockTimeoutSeconds": 60}})
    assert bound.seconds == pytest.approx(3 + 60 + pace.ANSWER_GRACE_S +
                                          pace.VERB_STARTS * COLD_START_S)
    assert f"{pace.VERB_STARTS} x {COLD_START_S:.2f} s" in bound.why
    assert pace.lock_wait({"lockTimeoutSeconds": 0.3}) == 0.3
    assert pace.lock_wait({}) == DEFAULT_LOCK_TIMEOUT_SECONDS


def test_the_plugin_that_does_not_answer_is_stopped_at_its_bound_which_says_why(
        measured: pace.Pace, tmp_path: Path) -> None:
    (tmp_path / "vpc-attach").write_text("#!/bin/sh\nexec sleep 60\n")
    (tmp_path / "vpc-attach").chmod(0o755)
    runner = Plugin(cni_bin=tmp_path, lock_dir=tmp_path,
                    environ={"VPC_ATTACH_TIMEOUT_SECONDS": "0.5"})
    started = time.monotonic()
    conf = {"cniVersion": "1.1.0", "ipam": {"lockTimeoutSeconds": 0.1}}
    with pytest.raises(TimeoutError) as stopped:
        runner.call("ADD", conf)
    took = time.monotonic() - started
    assert pace.verb_bound(runner.env("ADD", "c1", "", "eth0"), conf).seconds <= took < 10
    assert "the verb's deadline + its IPAM's lock wait + the client's grace 2.6 s" in \
        str(stopped.value)


def test_an_expired_bound_says_what_it_was_derived_from(measured: pace.Pace) -> None:
    with pytest.raises(TimeoutError) as expired:
        wait_until("something that never happens", lambda: False, pace.pace().starts(3),
                   interval=0.01)
    assert "(bound: 3 x 0.01 s, the plugin's cold start measured on this machine)" in \
        str(expired.value)


def test_the_vm_watchdog_waits_for_the_guests_pace_then_for_a_finished_phase(
        tmp_path: Path) -> None:
    reports, pace_file = tmp_path / "reports.jsonl", tmp_path / "pace.json"
    progress = _Progress(reports, pace_file)
    assert progress.stalled() is None, "no pace yet: booting"
    pace_file.write_text(json.dumps({"cold_start_s": COLD_START_S, "verb_deadline_s": 30}))
    assert progress.stalled() is None
    stall_s = STALL_STARTS * COLD_START_S
    time.sleep(stall_s * 0.6)
    reports.write_text("{}\n")  # a phase finished: the clock starts again (polled as it happens)
    assert progress.stalled() is None
    time.sleep(stall_s * 0.6)
    assert progress.stalled() is None, "a finished phase is progress"
    time.sleep(stall_s * 0.6)
    why = progress.stalled()
    assert why is not None and f"{STALL_STARTS} x {COLD_START_S:.2f} s" in why, why
    assert "cold start 0.0 s, the plugin's deadline in it 30 s" in progress.note()


def test_a_vm_is_killed_when_its_watchdog_says_why_and_not_before() -> None:
    calls: list[float] = []

    def watchdog() -> str | None:
        calls.append(time.monotonic())
        return "stalled (test)" if len(calls) >= 2 else None

    hung = subprocess.Popen(["sleep", "60"])
    assert _wait_or_kill(hung, 60.0, time.monotonic(), watchdog) == "stalled (test)"
    assert hung.returncode is not None and len(calls) == 2
    done = subprocess.Popen(["true"])
    assert _wait_or_kill(done, 60.0, time.monotonic(), lambda: "never asked") == ""


def test_the_guests_status_is_the_worst_of_its_pytest_runs() -> None:
    def status(*codes: int) -> int:
        return subprocess.run(worst_of([["sh", "-c", f"exit {code}"] for code in codes]),
                              check=False, timeout=30).returncode

    assert (status(0, 0), status(1, 0), status(0, 1), status(0, 3), status(0)) == (0, 1, 1, 3, 0)


def test_an_answer_is_late_only_if_past_the_margin_at_the_pace_measured_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault matrix's lateness: past the deadline and two cold starts at the session's
    pace AND at the pace measured at the moment of judging (a machine busier than at the
    session's start starts and exits the plugin slower, not the verb running past its
    deadline); a busier machine's pace never shortens the first one."""
    monkeypatch.delenv(pace.PACE_ENV, raising=False)
    pace.pace.cache_clear()
    try:
        first = pace.pace()
        monkeypatch.setattr(pace, "_cold_start", lambda: first.cold_start_s * 4)
        assert pace.pace_now().cold_start_s == pytest.approx(first.cold_start_s * 4)
        monkeypatch.setattr(pace, "_cold_start", lambda: first.cold_start_s / 4)
        assert pace.pace_now() == first
    finally:
        pace.pace.cache_clear()
    monkeypatch.setattr(matrix, "pace", lambda: pace.Pace(3.0))  # late after 6 + 2 x 3 s
    monkeypatch.setattr(matrix, "pace_now", lambda: pace.Pace(3.0))
    assert matrix.is_late(13.0)  # the machine as it was: 1 s past the margin is late
    assert not matrix.is_late(11.9)
    monkeypatch.setattr(matrix, "pace_now", lambda: pace.Pace(6.0))  # twice as slow now
    assert not matrix.is_late(13.0)
    assert matrix.is_late(18.1)
    monkeypatch.setattr(matrix, "pace", lambda: pace.Pace(0.4))  # an idle machine: the floor
    monkeypatch.setattr(matrix, "pace_now", lambda: pace.Pace(0.4))
    assert not matrix.is_late(matrix.TIMEOUT_S + matrix.MARGIN_S - 0.1)
    assert matrix.is_late(matrix.TIMEOUT_S + matrix.MARGIN_S + 0.1)
