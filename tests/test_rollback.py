"""The created-only rollback and its share of the deadline (SPEC §7)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from netconf.errors import TRY_AGAIN_LATER, CniError


@pytest.mark.parametrize(("whole", "forward"), [(30.0, 20.0), (6.0, 4.0), (3.0, 1.5), (60.0, 40.0)])
def test_forward_work_leaves_the_rollback_a_third_at_least_2s_at_most_half(
        whole: float, forward: float) -> None:
    deadline = Deadline(whole)
    reduced = deadline.less_rollback_reserve()
    assert reduced.seconds == pytest.approx(forward) and reduced.started == deadline.started


def test_steps_run_newest_first_and_a_failing_one_does_not_stop_the_rest() -> None:
    ran: list[str] = []

    def broken(_: Deadline) -> None:
        raise CniError(TRY_AGAIN_LATER, "API unreachable")

    rollback = Rollback(Deadline(10))
    rollback.created("first", lambda _: ran.append("first"))
    rollback.created("broken", broken)
    rollback.created("last", lambda _: ran.append("last"))
    assert rollback.run() == ["broken: API unreachable"]
    assert ran == ["last", "first"]


def test_the_error_says_what_the_rollback_could_not_undo() -> None:
    def broken(_: Deadline) -> None:
        raise CniError(TRY_AGAIN_LATER, "API unreachable")

    with pytest.raises(CniError) as caught, Rollback(Deadline(10)) as rollback:
        rollback.created("BGPVRFInstance 3e-node", broken)
        raise CniError(TRY_AGAIN_LATER, "EndpointSlice write failed", "denied")
    assert caught.value.msg == "EndpointSlice write failed"
    assert caught.value.details == \
        "denied; rollback incomplete: BGPVRFInstance 3e-node: API unreachable"


def test_steps_share_one_deadline_and_none_starts_after_it() -> None:
    seen: list[Deadline] = []
    rollback = Rollback(Deadline(0.0))
    rollback.created("link", seen.append)
    assert rollback.run() == ["link: no time left"] and seen == []


def test_a_step_whose_answer_never_comes_leaves_time_for_the_later_steps() -> None:
    given: dict[str, float] = {}

    def step(name: str) -> Callable[[Deadline], None]:
        return lambda deadline: given.__setitem__(name, deadline.remaining(0))

    rollback = Rollback(Deadline(2.0))
    for name in ("IPAM", "link", "BGPVRFInstance", "EndpointSlice"):
        rollback.created(name, step(name))
    assert rollback.run() == []
    # The newest step may use all but 0.25 s for each of the three after it.
    assert given["EndpointSlice"] == pytest.approx(1.25, abs=0.05)
    assert given["IPAM"] == pytest.approx(2.0, abs=0.05)


def test_a_step_never_takes_more_than_half_of_what_is_left_from_later_steps() -> None:
    given: list[float] = []
    rollback = Rollback(Deadline(1.0))
    for _ in range(10):
        rollback.created("step", lambda d: given.append(d.remaining(0)))
    rollback.run()
    assert given[0] == pytest.approx(0.5, abs=0.05)


def test_success_keeps_everything() -> None:
    ran: list[str] = []
    with Rollback(Deadline(10)) as rollback:
        rollback.created("link", lambda _: ran.append("undone"))
    assert ran == [] and rollback.steps == []
