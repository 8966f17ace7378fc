"""The bench's results: rows of samples, their judgement against issue 5, and the three outputs
(`latest.md`, `latest.json`, `latest.png`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.bench import stats
from e2e.bench.targets import NOT_MEASURED, PASS, Target, verdict

MIB = 1024.0


@dataclass
class Row:
    """One measured line of the table: a subject, a verb, a path."""

    key: str
    label: str
    verb: str
    path: str
    reference: str | None = None  # key of the Go row of the same verb
    # (target, basis): basis is "median", "p95" or "ratio:<row key>" (median over that median)
    targets: list[tuple[Target, str]] = field(default_factory=list)
    samples: list[float] = field(default_factory=list)  # ms
    rss_kib: list[int] = field(default_factory=list)
    in_plugin_ms: list[float] = field(default_factory=list)  # the plugin's own log line
    walls_ms: list[float] = field(default_factory=list)  # concurrent rows: one per burst
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    missed_agent: int = 0  # invocations the agent did not serve (they ran in-process)
    skipped: str | None = None

    def fail(self, message: str) -> None:
        """Count a failed invocation; keep the first few messages."""
        self.failures += 1
        if len(self.errors) < 3:
            self.errors.append(message[:300])

    @property
    def summary(self) -> stats.Summary | None:
        """Statistics of the samples (None when nothing was measured)."""
        return stats.summarize(self.samples) if self.samples else None


@dataclass
class MemoryRow:
    """A memory figure: peak RSS of executable runs, or an agent's resident set."""

    label: str
    kib: list[int]
    target: Target | None = None
    skipped: str | None = None
    detail: str = ""


@dataclass
class Judgement:
    """One row compared with one target."""

    target: Target
    row: str
    measured: float | None
    verdict: str


@dataclass
class Report:
    """Everything one run produced."""

    machine: dict[str, Any]
    settings: dict[str, Any]
    rows: list[Row]
    memory: list[MemoryRow]
    notes: list[str]

    def row(self, key: str) -> Row:
        """A row by key."""
        return next(r for r in self.rows if r.key == key)

    def median(self, key: str) -> float | None:
        """A row's median, or None."""
        summary = self.row(key).summary
        return summary.median if summary else None

    def ratio_to_reference(self, row: Row) -> float | None:
        """The row's median over its Go reference's median (same run)."""
        if row.reference is None or row.summary is None:
            return None
        return stats.ratio(row.summary.median, self.median(row.reference))

    def judge(self, row: Row) -> list[Judgement]:
        """The row against each of its targets."""
        judged = []
        for target, basis in row.targets:
            measured = _measure(self, row, basis)
            failures = row.failures + row.missed_agent
            if basis.startswith("ratio:"):
                failures += self.row(basis.removeprefix("ratio:")).failures
            judged.append(Judgement(target, row.key, measured, verdict(target, measured,
                                                                       failures)))
        return judged

    def judge_memory(self, memory: MemoryRow) -> Judgement | None:
        """A memory figure against its target (the maximum over runs counts)."""
        if memory.target is None:
            return None
        measured = max(memory.kib) / MIB if memory.kib else None
        return Judgement(memory.target, memory.label, measured, verdict(memory.target, measured))


def _measure(report: Report, row: Row, basis: str) -> float | None:
    summary = row.summary
    if summary is None:
        return None
    if basis == "median":
        return summary.median
    if basis == "p95":
        return summary.p95
    return stats.ratio(summary.median, report.median(basis.removeprefix("ratio:")))


# Markdown ------------------------------------------------------------------------------------

def markdown(report: Report) -> str:
    """latest.md: the machine, the latency table, the memory table, the targets, the notes."""
    machine, settings = report.machine, report.settings
    lines = [
        "# vpc-attach benchmark (`python -m e2e.bench`)", "",
        f"Machine: `nproc` {machine['nproc']}, {machine['cpu_model']}, Linux "
        f"{machine['kernel']}, {machine['date']}{_load(machine)} (Python {machine['python']}, "
        f"Go reference plugins {machine['go_plugins']}, Kubernetes {machine['kubernetes']}).",
        "",
        f"{'Quick run' if settings['quick'] else 'Run'}: {settings['runs']} measured runs per "
        f"row after {settings['warmup']} warm-up round(s), interleaved round-robin over all "
        f"rows (order rotated each round), each ADD/DEL pair in a fresh network namespace; "
        f"{settings['bursts']} burst(s) of 32 concurrent ADDs then DELs per concurrent row. "
        f"Median, and p95 by the {stats.PERCENTILE_METHOD} method. `x Go` is the row's median "
        f"over the Go reference median of the same verb measured in this run. `in plugin` is "
        f"the verb's own duration from the plugin's log line (agent or in-process), so "
        f"`median - in plugin` is start-up plus forwarding.", "",
        "## Latency", "",
        "| what | verb | path | n | median ms | p95 ms | x Go | peak RSS MiB | in plugin ms "
        "| issue 5 target | measured / limit | verdict |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|---|---|---|",
    ]
    for row in report.rows:
        lines.append(_latency_line(report, row))
    lines += ["", "## Memory", "",
              "| what | runs | median MiB | max MiB | issue 5 target | measured / limit "
              "| verdict |",
              "|---|--:|--:|--:|---|---|---|"]
    for memory in report.memory:
        lines.append(_memory_line(report, memory))
    lines += ["", "## Targets of issue 5", "", "| target | row | measured / limit | verdict |",
              "|---|---|---|---|"]
    for judged in all_judgements(report):
        lines.append(f"| {judged.target.text} | {judged.row} | "
                     f"{judged.target.describe(judged.measured)} | **{judged.verdict}** |")
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def _load(machine: dict[str, Any]) -> str:
    load = machine.get("load_average")
    return f", load average {load[0]:.1f} → {load[1]:.1f} over the rounds" if load else ""


def all_judgements(report: Report) -> list[Judgement]:
    """Every (row, target) and (memory figure, target) judgement, in table order."""
    judged = [j for row in report.rows for j in report.judge(row)]
    judged += [j for m in report.memory if (j := report.judge_memory(m)) is not None]
    return judged


def _latency_line(report: Report, row: Row) -> str:
    head = f"| {row.label} | {row.verb} | {row.path} |"
    summary = row.summary
    if row.skipped or summary is None:
        why = row.skipped or (f"all {row.failures} runs failed: {row.errors[0]}" if row.errors
                              else "not measured")
        targets = "; ".join(t.text for t, _ in row.targets) or "—"
        return f"{head} 0 | — | — | — | — | — | {targets} | skipped: {why} | {NOT_MEASURED} |"
    ratio = report.ratio_to_reference(row)
    rss = f"{max(row.rss_kib) / MIB:.1f}" if row.rss_kib else "—"
    in_plugin = f"{stats.median(row.in_plugin_ms):.1f}" if row.in_plugin_ms else "—"
    judged = report.judge(row)
    target_text = "; ".join(j.target.text for j in judged) or "—"
    measured = "; ".join(j.target.describe(j.measured) for j in judged) or "—"
    verdicts = " ".join(f"**{j.verdict}**" for j in judged) or "—"
    extra = []
    if row.walls_ms:
        extra.append(f"wall {stats.median(row.walls_ms):.0f} ms/burst")
    if row.failures:
        extra.append(f"{row.failures} failed")
    if row.missed_agent:
        extra.append(f"{row.missed_agent} not served by the agent")
    n = f"{summary.n}" + (f" ({', '.join(extra)})" if extra else "")
    return (f"{head} {n} | {_ms(summary.median)} | {_ms(summary.p95)} | "
            f"{'—' if ratio is None else f'{ratio:.2f}x'} | {rss} | {in_plugin} | "
            f"{target_text} | {measured} | {verdicts} |")


def _memory_line(report: Report, memory: MemoryRow) -> str:
    target = memory.target.text if memory.target else "—"
    if memory.skipped or not memory.kib:
        why = memory.skipped or "no measured invocation on this path"
        return f"| {memory.label} | 0 | — | — | {target} | skipped: {why} | {NOT_MEASURED} |"
    values = [k / MIB for k in memory.kib]
    judged = report.judge_memory(memory)
    measured = judged.target.describe(judged.measured) if judged else memory.detail or "—"
    shown = f"**{judged.verdict}**" if judged else "—"
    return (f"| {memory.label} | {len(values)} | {stats.median(values):.1f} | {max(values):.1f} "
            f"| {target} | {measured} | {shown} |")


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


# JSON ----------------------------------------------------------------------------------------

def as_json(report: Report) -> dict[str, Any]:
    """latest.json: the same content with every raw sample."""
    rows = []
    for row in report.rows:
        summary = row.summary
        rows.append({
            "key": row.key, "label": row.label, "verb": row.verb, "path": row.path,
            "skipped": row.skipped, "reference": row.reference,
            "summary_ms": summary.as_dict() if summary else None,
            "ratio_to_go_median": report.ratio_to_reference(row),
            "peak_rss_mib": {"median": stats.median(row.rss_kib) / MIB,
                             "max": max(row.rss_kib) / MIB} if row.rss_kib else None,
            "in_plugin_ms": stats.summarize(row.in_plugin_ms).as_dict()
            if row.in_plugin_ms else None,
            "burst_wall_ms": row.walls_ms or None,
            "failures": row.failures, "errors": row.errors,
            "not_served_by_agent": row.missed_agent,
            "targets": [_judgement_json(j) for j in report.judge(row)],
            "samples_ms": [round(s, 3) for s in row.samples],
            "peak_rss_kib": row.rss_kib,
        })
    memory = [{"label": m.label, "skipped": m.skipped, "kib": m.kib, "detail": m.detail,
               "target": _judgement_json(j) if (j := report.judge_memory(m)) else None}
              for m in report.memory]
    judged = all_judgements(report)
    return {"machine": report.machine, "settings": report.settings, "rows": rows,
            "memory": memory, "targets": [_judgement_json(j) for j in judged],
            "all_targets_pass": all(j.verdict == PASS for j in judged), "notes": report.notes}


def _judgement_json(judged: Judgement) -> dict[str, Any]:
    return {"target": judged.target.key, "text": judged.target.text, "row": judged.row,
            "measured": judged.measured, "limit": judged.target.limit,
            "unit": judged.target.unit, "verdict": judged.verdict}


# PNG -----------------------------------------------------------------------------------------

PATH_COLOURS = {"Go": "#4c72b0", "agent": "#55a868", "in-process": "#c44e52"}


def plot(report: Report, out: Path) -> str | None:
    """latest.png: box plots of every row's latencies (log scale); why not, if it cannot."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed: no PNG (install the project's bench extra)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if r.samples]
    if not rows:
        return "nothing was measured: no PNG"
    labels = [f"{r.label} — {r.verb} ({r.path})" for r in rows]
    figure, axes = plt.subplots(figsize=(12, 0.42 * len(rows) + 1.8))
    boxes = axes.boxplot([r.samples for r in rows], vert=False, whis=(5, 95), showfliers=True,
                         patch_artist=True, flierprops={"markersize": 2, "alpha": 0.5},
                         medianprops={"color": "black"})
    for patch, row in zip(boxes["boxes"], rows, strict=True):
        patch.set_facecolor(PATH_COLOURS.get(row.path, "#8c8c8c"))
        patch.set_alpha(0.75)
    axes.set_yticks(range(1, len(rows) + 1), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlabel("latency per invocation, ms (log scale; box: quartiles, whiskers: p5-p95)")
    machine = report.machine
    axes.set_title(f"vpc-attach vs Go reference — {machine['nproc']} CPUs, "
                   f"{machine['cpu_model']}, {machine['date']}", fontsize=10)
    axes.grid(axis="x", which="both", alpha=0.3)
    from matplotlib.patches import Patch
    handles = [Patch(color=c, alpha=0.75) for c in PATH_COLOURS.values()]
    axes.legend(handles, list(PATH_COLOURS), loc="upper left", bbox_to_anchor=(1.0, 1.0),
                fontsize=8, title="path", title_fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return None


def write(report: Report, results: Path, json_out: Path | None) -> None:
    """Write latest.md/.json/.png into results (and the JSON also to json_out); a plot that
    could not be drawn is said in the notes."""
    results.mkdir(parents=True, exist_ok=True)
    why_not = plot(report, results / "latest.png")
    if why_not:
        report.notes.append(why_not)
    document = json.dumps(as_json(report), indent=1) + "\n"
    (results / "latest.json").write_text(document)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(document)
    (results / "latest.md").write_text(markdown(report))
