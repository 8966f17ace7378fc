"""The targets of issue 5 (item 3) and how a measured value is judged against them (pure).

Each target is "measured value <= limit". What the measured value is (a ratio of medians, a
median, a p95, a peak RSS) is decided where the row is measured; here it is only compared.
A row whose runs failed never passes: a fast failure is not a result.
"""

from __future__ import annotations

from dataclasses import dataclass

PASS, MISS, NOT_MEASURED = "PASS", "MISS", "n/a"


@dataclass(frozen=True)
class Target:
    """One line of issue 5's targets."""

    key: str
    text: str  # how the table names it
    limit: float
    unit: str  # "x" for ratios, "ms", "MiB"

    def describe(self, measured: float | None) -> str:
        """`measured / limit` in the target's unit, e.g. `1.42x / 2.0x`."""
        shown = "—" if measured is None else _format(measured, self.unit)
        return f"{shown} / {_format(self.limit, self.unit)}"


def verdict(target: Target, measured: float | None, failures: int = 0) -> str:
    """PASS when measured <= limit and nothing failed; n/a when not measured; MISS otherwise."""
    if measured is None:
        return NOT_MEASURED
    return PASS if failures == 0 and measured <= target.limit else MISS


def _format(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "ms":
        return f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"
    return f"{value:.1f} {unit}"


KERNEL_ADD = Target("kernel-add", "T1 kernel-only ADD via agent ≤ 2.0x Go ADD", 2.0, "x")
KERNEL_DEL = Target("kernel-del", "T1 kernel-only DEL via agent ≤ 1.5x Go DEL", 1.5, "x")
FULL_ADD = Target("full-add", "T2 full ADD via agent ≤ 60 ms median", 60.0, "ms")
IN_PROCESS_ADD = Target("in-process-add", "T3 in-process ADD ≤ 450 ms median", 450.0, "ms")
FORWARDING_RSS = Target("forwarding-rss", "T4 forwarding-path peak RSS ≤ 20 MiB", 20.0, "MiB")
SCALE = Target("scale", "T5 ADD with 2,000 objects ≤ 1.2x ADD with 10", 1.2, "x")
CONCURRENT = Target("concurrent", "T6 32 concurrent ADDs all succeed, p95 ≤ 1 s", 1000.0, "ms")
