"""The benchmark's statistics and verdicts (e2e/bench): median, nearest-rank p95, ratios, and
how a row is judged against issue 5's targets. Synthetic numbers only: no timing is asserted."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.bench import stats
from e2e.bench.report import MemoryRow, Report, Row, all_judgements, as_json, markdown
from e2e.bench.targets import (
    FORWARDING_RSS,
    FULL_ADD,
    KERNEL_ADD,
    MISS,
    NOT_MEASURED,
    PASS,
    SCALE,
    Target,
    verdict,
)

latencies = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1,
                     max_size=200)


def test_median_of_an_odd_count_is_the_middle_sample() -> None:
    assert stats.median([9.0, 1.0, 5.0]) == 5.0


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_samples() -> None:
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_p95_of_20_samples_is_the_19th_fastest() -> None:
    assert stats.p95([float(v) for v in range(20, 0, -1)]) == 19.0


def test_p95_of_50_runs_is_the_48th_fastest_and_of_10_runs_the_slowest() -> None:
    assert stats.p95([float(v) for v in range(1, 51)]) == 48.0
    assert stats.p95([float(v) for v in range(1, 11)]) == 10.0


def test_percentile_of_one_sample_is_that_sample() -> None:
    assert stats.percentile([7.5], 1) == 7.5
    assert stats.percentile([7.5], 100) == 7.5


def test_percentile_never_interpolates_between_runs() -> None:
    assert stats.percentile([10.0, 20.0], 50) == 10.0
    assert stats.percentile([10.0, 20.0], 51) == 20.0


@pytest.mark.parametrize("p", [0, -1, 100.5])
def test_percentile_outside_0_100_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match="outside"):
        stats.percentile([1.0], p)


def test_statistics_of_no_samples_are_refused() -> None:
    for function in (stats.median, stats.p95, stats.summarize):
        with pytest.raises(ValueError):
            function([])


@given(latencies, st.floats(min_value=0.01, max_value=100))
def test_percentile_is_a_measured_sample(samples: list[float], p: float) -> None:
    assert stats.percentile(samples, p) in samples


@given(latencies)
def test_at_least_95_percent_of_samples_are_at_or_below_p95(samples: list[float]) -> None:
    p95 = stats.p95(samples)
    assert sum(s <= p95 for s in samples) >= 0.95 * len(samples)


@given(latencies)
def test_p95_is_the_smallest_sample_covering_95_percent(samples: list[float]) -> None:
    p95 = stats.p95(samples)
    below = [s for s in samples if s < p95]
    assert len(below) < math.ceil(0.95 * len(samples))


@given(latencies, st.randoms())
def test_statistics_ignore_the_order_of_runs(samples: list[float], rng: random.Random) -> None:
    shuffled = list(samples)
    rng.shuffle(shuffled)
    assert stats.summarize(shuffled) == stats.summarize(samples)


@given(latencies)
def test_min_le_median_le_p95_le_max(samples: list[float]) -> None:
    summary = stats.summarize(samples)
    assert summary.minimum <= summary.median <= summary.p95 <= summary.maximum
    assert summary.n == len(samples)


@given(latencies, st.floats(min_value=0.01, max_value=100),
       st.floats(min_value=0.01, max_value=100))
def test_percentile_grows_with_p(samples: list[float], p: float, q: float) -> None:
    low, high = sorted((p, q))
    assert stats.percentile(samples, low) <= stats.percentile(samples, high)


def test_ratio_is_unknown_without_a_positive_reference() -> None:
    assert stats.ratio(20.0, 10.0) == 2.0
    assert stats.ratio(None, 10.0) is None
    assert stats.ratio(20.0, None) is None
    assert stats.ratio(20.0, 0.0) is None


def test_verdict_passes_at_the_limit_and_misses_above_it() -> None:
    target = Target("t", "t <= 2", 2.0, "x")
    assert verdict(target, 2.0) == PASS
    assert verdict(target, 2.01) == MISS
    assert verdict(target, None) == NOT_MEASURED


def test_a_fast_row_with_failed_runs_never_passes() -> None:
    assert verdict(FULL_ADD, 1.0, failures=1) == MISS


def test_target_describes_measured_against_limit() -> None:
    assert KERNEL_ADD.describe(1.5) == "1.50x / 2.00x"
    assert FULL_ADD.describe(None) == "— / 60.0 ms"


def _report(*rows: Row, memory: list[MemoryRow] | None = None) -> Report:
    machine = {"nproc": 2, "cpu_model": "test CPU", "kernel": "6.1", "date": "2000-01-01",
               "python": "3.11", "go_plugins": "v1", "kubernetes": "v1"}
    settings = {"runs": 3, "warmup": 1, "bursts": 1, "quick": True}
    return Report(machine, settings, list(rows), memory or [], [])


def test_ratio_targets_divide_by_the_median_of_the_named_row() -> None:
    go = Row("go/ADD", "Go", "ADD", "Go", samples=[10.0, 10.0, 12.0])
    ours = Row("ours/ADD", "ours", "ADD", "agent", reference="go/ADD",
               samples=[15.0, 15.0, 30.0], targets=[(KERNEL_ADD, "ratio:go/ADD")])
    report = _report(go, ours)
    [judged] = report.judge(ours)
    assert judged.measured == 1.5 and judged.verdict == PASS
    assert report.ratio_to_reference(ours) == 1.5


def test_a_ratio_against_a_failing_baseline_is_a_miss() -> None:
    few = Row("few/ADD", "10 objects", "ADD", "agent", samples=[20.0], failures=1)
    many = Row("many/ADD", "2000 objects", "ADD", "agent", samples=[21.0],
               targets=[(SCALE, "ratio:few/ADD")])
    [judged] = _report(few, many).judge(many)
    assert judged.verdict == MISS


def test_rows_the_agent_did_not_serve_cannot_pass() -> None:
    row = Row("a/ADD", "a", "ADD", "agent", samples=[1.0], missed_agent=1,
              targets=[(FULL_ADD, "median")])
    assert _report(row).judge(row)[0].verdict == MISS


def test_memory_target_uses_the_largest_peak() -> None:
    memory = MemoryRow("forwarding", [10 * 1024, 21 * 1024], FORWARDING_RSS)
    judged = _report(memory=[memory]).judge_memory(memory)
    assert judged is not None and judged.measured == 21.0 and judged.verdict == MISS


def test_skipped_rows_are_listed_with_their_reason_and_not_judged() -> None:
    row = Row("a/ADD", "agent row", "ADD", "agent", skipped="`vpc-attach agent` did not start",
              targets=[(FULL_ADD, "median")])
    report = _report(row)
    assert "skipped: `vpc-attach agent` did not start" in markdown(report)
    assert [j.verdict for j in all_judgements(report)] == [NOT_MEASURED]
    assert as_json(report)["all_targets_pass"] is False


def test_markdown_names_the_machine_and_marks_each_target() -> None:
    row = Row("a/ADD", "full", "ADD", "agent", samples=[50.0, 70.0],
              targets=[(FULL_ADD, "median")])
    text = markdown(_report(row))
    assert "`nproc` 2, test CPU, Linux 6.1, 2000-01-01" in text
    assert "T2 full ADD via agent ≤ 60 ms median" in text
    assert "**PASS**" in text
