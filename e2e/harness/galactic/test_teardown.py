"""A shared deployment's teardown proves its DELs as a test would: `delete_every` runs the
runtime's DEL of each Pod left attached, every one of them even after one failed, and then fails
naming those that failed (it used to let an AssertionError pass, so a broken DEL went unseen).
No cluster needed: the Pods' DELs are stand-ins."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from e2e.harness.galactic.deployment import delete_every


@dataclass
class Site:
    index: int

    def label(self) -> str:
        return f"node {self.index}"


@dataclass
class StandInPod:
    """What delete_every reads of a ChainPod: its name, site and DEL."""

    name: str
    fails: bool
    site: Site = field(default_factory=lambda: Site(1))
    deleted: bool = False

    def delete_chain(self) -> None:
        self.deleted = True
        assert not self.fails, "DEL failed: code 11"


def test_every_del_runs_and_the_teardown_passes_when_all_succeed() -> None:
    pods = [StandInPod("a", False), StandInPod("b", False)]
    delete_every(pods)  # type: ignore[arg-type]
    assert all(pod.deleted for pod in pods)


def test_a_failing_del_fails_the_teardown_after_every_other_del_ran() -> None:
    pods = [StandInPod("a", True), StandInPod("b", False), StandInPod("c", True)]
    with pytest.raises(AssertionError, match=r"(?s)DEL of what the tests left failed:.*"
                                             r"a on node 1: DEL failed.*c on node 1"):
        delete_every(pods)  # type: ignore[arg-type]
    assert all(pod.deleted for pod in pods), "the DELs after a failed one still ran"
