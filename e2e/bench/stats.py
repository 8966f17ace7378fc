"""Summary statistics of latency samples (pure; tested in e2e/bench/test_stats.py).

Percentiles use the nearest-rank method: the p-th percentile of n samples is the sample of
rank ceil(p/100 * n) in ascending order (1-based). It is always a latency that was actually
measured, never an interpolation between two runs; with 50 runs p95 is the 48th fastest, with
10 runs it is the 10th (the slowest). The median is the conventional one: the middle sample,
or the mean of the two middle samples when n is even.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

PERCENTILE_METHOD = "nearest-rank"


def median(samples: Sequence[float]) -> float:
    """The median (mean of the two middle samples for an even count)."""
    if not samples:
        raise ValueError("median of no samples")
    return float(statistics.median(samples))


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile by nearest rank (0 < p <= 100)."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 < p <= 100:
        raise ValueError(f"percentile {p} is outside (0, 100]")
    ordered = sorted(samples)
    rank = math.ceil(p / 100 * len(ordered))
    return float(ordered[max(rank, 1) - 1])


def p95(samples: Sequence[float]) -> float:
    """The 95th percentile by nearest rank."""
    return percentile(samples, 95)


@dataclass(frozen=True)
class Summary:
    """What the report says about one row's samples."""

    n: int
    median: float
    p95: float
    minimum: float
    maximum: float
    mean: float

    def as_dict(self) -> dict[str, float]:
        """JSON-ready fields."""
        return asdict(self)


def summarize(samples: Sequence[float]) -> Summary:
    """Median, p95 (nearest rank), min, max and mean of non-empty samples."""
    if not samples:
        raise ValueError("summary of no samples")
    return Summary(n=len(samples), median=median(samples), p95=p95(samples),
                   minimum=float(min(samples)), maximum=float(max(samples)),
                   mean=float(statistics.fmean(samples)))


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None when either is unknown or the reference is not positive."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference
