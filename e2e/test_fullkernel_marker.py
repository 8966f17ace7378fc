"""A `fullkernel` test that can run neither on this kernel nor in the full-kernel VM fails,
saying why; it never skips (issue 37 item 6): a skipped datapath test reads as a green run."""

from __future__ import annotations

import pytest

from e2e.harness.vm import image, pytest_plugin

pytest_plugins = ["pytester"]
pytestmark = [pytest.mark.root]

MARKED = """
import pytest

@pytest.mark.fullkernel
def test_needs_vrf():
    pass

def test_needs_nothing():
    pass
"""


def test_a_fullkernel_test_without_kernel_or_vm_fails_and_the_others_run(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pytest_plugin.MODE_ENV, "vm")
    monkeypatch.setattr(image, "missing_tools", lambda: "qemu-system-x86_64 is not installed")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_inprocess("-p", "e2e.harness.vm.pytest_plugin", "-rA")
    result.assert_outcomes(passed=1, errors=1)  # fails in its set-up: the run fails
    assert "qemu-system-x86_64 is not installed" in result.stdout.str()
    assert result.ret != 0 and "skipped" not in result.stdout.str()


def test_the_same_test_runs_where_the_vm_is_not_needed(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The positive control: with the kernel's features at hand, the marked test runs."""
    monkeypatch.setenv(pytest_plugin.MODE_ENV, "native")
    monkeypatch.setattr(image, "missing_tools", lambda: "qemu-system-x86_64 is not installed")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_inprocess("-p", "e2e.harness.vm.pytest_plugin")
    result.assert_outcomes(passed=2)
