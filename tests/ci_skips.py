"""Under `CI=true` a skipped test fails the run (loaded for every pytest run: pyproject's
`addopts`).

A skip counted as a pass hides a missing piece: a CI machine set up by `scripts/setup.sh` has
everything every test needs (root, qemu and the kernel image for the full-kernel VM, containerd,
runc, bpftool, clang…), so a test that skips there says the set-up or the test is broken. Off
CI a skip stays a skip and says why (`-ra`). A test that truly cannot run anywhere is not
collected at all; its module says why.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

CI_ENV = "CI"
PREFIX = "skipped under CI=true (a skip fails the run there):"


def ci_forbids_skips() -> bool:
    """Whether this run is CI's (`CI=true`, as CI services and `.ci/run` set it)."""
    return os.environ.get(CI_ENV, "").strip().lower() in ("true", "1", "yes")


def skip_reason(longrepr: object) -> str:
    """The reason pytest recorded for a skip ((path, line, reason) or its text)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def as_failure(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skip report into a failure that still says why it skipped."""
    report.longrepr = f"{PREFIX} {skip_reason(report.longrepr)}"
    report.outcome = "failed"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                         pytest.TestReport]:
    """A test's skip (a marker, `pytest.skip` in a fixture or the test) fails under CI."""
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and ci_forbids_skips():
        as_failure(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
        collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                  pytest.CollectReport]:
    """A module skipped whole at collection (`allow_module_level`) fails under CI too."""
    report = yield
    if report.skipped and ci_forbids_skips():
        as_failure(report)
    return report
