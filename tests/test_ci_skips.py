"""Under CI=true a skip fails the run (tests/ci_skips.py), whatever skipped: a marker, a fixture,
the test itself or a whole module; off CI the same skips stay skips. Each case runs pytest
(pytester, in this process) on a small module of its own, with the plugin as pyproject loads
it."""

from __future__ import annotations

import re

import pytest

pytest_plugins = ("pytester",)
CASES = '''
import pytest

@pytest.fixture
def needs_qemu():
    pytest.skip("no qemu-system-x86_64")

@pytest.mark.skipif(True, reason="containerd is not installed")
def test_marked():
    pass

def test_by_fixture(needs_qemu):
    pass

def test_by_itself():
    pytest.skip("runc is not installed")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False

def test_passing():
    pass
'''
MODULE_SKIPPED = '''
import pytest
pytest.skip("no kernel image", allow_module_level=True)

def test_never_collected():
    pass
'''


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        ci: str | None) -> tuple[int, str]:
    """pytest over pytester's directory, only our plugin loaded, CI as given (None: unset)."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    result = pytester.runpytest("-p", "tests.ci_skips", "-o", "addopts=", "-rA")
    return int(result.ret), "\n".join(result.outlines + result.errlines)


def counts(output: str) -> dict[str, int]:
    """The summary line's counts: {'passed': 1, 'failed': 2, …}."""
    summary = output.strip().splitlines()[-1]
    return {word.rstrip("s"): int(number)
            for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)",
                                            summary)}


@pytest.fixture
def cases(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_cases=CASES)
    return pytester


def test_off_ci_a_skip_is_a_skip(cases: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    status, output = run(cases, monkeypatch, None)
    assert status == 0, output
    assert counts(output) == {"passed": 1, "skipped": 3, "xfailed": 1}, output


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_every_skip_fails_and_says_why(cases: pytest.Pytester,
                                                monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    status, output = run(cases, monkeypatch, ci)
    assert status == 1, output
    # The marker's and the fixture's skips happen in setup (errors), the test's own in its call.
    assert counts(output) == {"passed": 1, "failed": 1, "error": 2, "xfailed": 1}, output
    for reason in ("containerd is not installed", "no qemu-system-x86_64",
                   "runc is not installed"):
        assert re.search(r"skipped under CI=true \(a skip fails the run there\): .*" + reason,
                         output), reason


def test_under_ci_a_module_skipped_whole_fails(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_module_skipped=MODULE_SKIPPED)
    assert run(pytester, monkeypatch, None)[0] == 5  # no tests ran: nothing but the skip
    status, output = run(pytester, monkeypatch, "true")
    assert status != 0 and "no kernel image" in output, output
    assert "skipped under CI=true" in output


def test_ci_false_is_not_ci(cases: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    status, output = run(cases, monkeypatch, "false")
    assert status == 0 and counts(output)["skipped"] == 3, output
