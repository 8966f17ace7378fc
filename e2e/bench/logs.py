"""The plugin's own log lines after the rounds: the time spent inside each verb, and proof that
the agent served every invocation of an agent row."""

from __future__ import annotations

import json

from e2e.bench.run import Run
from e2e.bench.subjects import IN_PROCESS, Subject


def read_plugin_logs(run: Run, made: list[Subject]) -> None:
    """Attach each invocation's in-plugin duration; count agent rows it did not serve."""
    durations: dict[tuple[str, str], float] = {}
    agent_served: set[tuple[str, str]] = set()
    for agent in run.agents.values():
        if agent.process is None:
            continue
        for line in agent.process.verb_lines():
            if "verb" in line and "durationMs" in line:
                key = (str(line["verb"]), str(line.get("containerID")))
                durations[key] = float(line["durationMs"])
                agent_served.add(key)
    for subject in made:
        path = run.workdir / "logs" / f"{subject.key}.log"
        if subject.path == IN_PROCESS and path.exists():
            for text in path.read_text().splitlines():
                line = json.loads(text) if text.startswith("{") else {}
                if "verb" in line and "durationMs" in line:
                    durations[(str(line["verb"]), str(line.get("containerID")))] = \
                        float(line["durationMs"])
    for invocation in run.invocations:
        key = (invocation.verb, invocation.container_id)
        row = run.rows[invocation.row]
        if invocation.via_agent and key not in agent_served:
            row.missed_agent += 1
        if key in durations:
            row.in_plugin_ms.append(durations[key])
    if any(r.missed_agent for r in run.rows.values()):
        run.notes.append("Some agent-row invocations were not served by the agent (they "
                         "fell back to in-process): those rows are marked and cannot pass.")
