"""The sequential rounds: every subject's ADD then DEL in a fresh netns, and the VERSION rows,
in an order rotated by one each round."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, TypeVar

from e2e.bench import kernel, spawn, subjects
from e2e.bench.kernel import Netns
from e2e.bench.run import INVOKE_TIMEOUT, VERSION_TIMEOUT, Invocation, Run, log, one_line
from e2e.bench.subjects import AGENT, Subject

CONSOLE_SCRIPT = "console-script-vpc-attach"  # pip's wrapper, for the start-up comparison
# VERSION steps of a round: executable (relative to the work dir) and the row it feeds
VERSION_STEPS = {"go-version": ("bin/ptp", "go-ptp/VERSION"),
                 "vpc-version": ("bin/vpc-attach", "vpc-attach/VERSION"),
                 "console-version": (CONSOLE_SCRIPT, "console/VERSION")}

T = TypeVar("T")


def measure_round(run: Run, sequential: list[Subject], number: int, run_id: str,
                  measured: bool) -> None:
    """Every subject once (ADD then DEL in a fresh netns), plus the VERSION rows."""
    steps: list[Subject | str] = [*sequential, *VERSION_STEPS]
    namespaces = {s.key: run.janitor.netns() for s in sequential}
    try:
        for step in rotated(steps, number):
            if isinstance(step, str):
                _version(run, step, measured)
            else:
                _pair(run, step, namespaces[step.key], run_id, measured)
    finally:
        for netns in namespaces.values():
            run.janitor.remove(netns)


def _version(run: Run, which: str, measured: bool) -> None:
    executable, key = VERSION_STEPS[which]
    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "VERSION"}
    done = spawn.run([str(run.workdir / executable)], env,
                     json.dumps(subjects.version_stanza()).encode(), VERSION_TIMEOUT)
    if measured:
        run.record(run.rows[key], done, problem(done, "VERSION", needs_json=True))


def _pair(run: Run, subject: Subject, netns: Netns, run_id: str, measured: bool) -> None:
    container_id = f"bench-{run.token}-{subject.key}-{run_id}"
    pod = f"{subject.key}-{run_id}"
    added, result, add_problem = add(run, subject, netns, container_id, pod, "1")
    if measured:
        run.record(run.rows[f"{subject.key}/ADD"], added, add_problem,
                   Invocation(f"{subject.key}/ADD", "ADD", container_id, subject.path == AGENT))
    deleted, del_problem = delete(run, subject, netns, container_id, pod, "1", result)
    after_agent_dels(subject)
    if measured and result is not None:
        run.record(run.rows[f"{subject.key}/DEL"], deleted, del_problem,
                   Invocation(f"{subject.key}/DEL", "DEL", container_id, subject.path == AGENT))


def add(run: Run, subject: Subject, netns: Netns, container_id: str, pod: str,
        att: str) -> tuple[spawn.Execution, dict[str, Any] | None, str | None]:
    """One ADD: what ran, its parsed result (None when it failed) and why it failed."""
    done = _invoke(run, subject, "ADD", subject.stanza(att), container_id, netns, pod)
    add_problem = problem(done, "ADD", needs_json=True)
    result = None
    if add_problem is None:
        result = json.loads(done.stdout)
        add_problem = _not_the_claims(subject, result)
    return done, result, add_problem


def addresses(result: dict[str, Any]) -> list[str]:
    """The addresses of an ADD's result, sorted."""
    return sorted(str(ip.get("address")) for ip in result.get("ips") or [])


def _not_the_claims(subject: Subject, result: dict[str, Any]) -> str | None:
    """A claim's later Pod that did not get the claim's addresses was not the case its row
    measures."""
    if subject.claim_ips is None or addresses(result) == subject.claim_ips:
        return None
    return f"ADD got {addresses(result)}, not the IPAMClaim's {subject.claim_ips}"


def delete(run: Run, subject: Subject, netns: Netns, container_id: str, pod: str, att: str,
           result: dict[str, Any] | None) -> tuple[spawn.Execution, str | None]:
    """One DEL, with the ADD's result as prevResult (as libcni sends it); why it failed."""
    stanza = subject.stanza(att)
    if result is not None:
        stanza["prevResult"] = result  # as libcni sends DEL
    done = _invoke(run, subject, "DEL", stanza, container_id, netns, pod)
    return done, problem(done, "DEL", needs_json=False)


def _invoke(run: Run, subject: Subject, verb: str, stanza: dict[str, Any], container_id: str,
            netns: Netns, pod: str) -> spawn.Execution:
    args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE=vpc-attach-bench;K8S_POD_NAME={pod};"
            f"K8S_POD_INFRA_CONTAINER_ID={container_id}")
    if subject.has_pods and subject.cluster:
        args += f";K8S_POD_UID={run.pods[subject.cluster][pod]}"
    env = subject.env(verb, container_id, netns.path, args)
    return spawn.run([str(subject.executable)], env, json.dumps(stanza).encode(),
                     INVOKE_TIMEOUT)


def after_agent_dels(subject: Subject) -> None:
    """Outside any measurement: let the agent finish deleting what its DELs retired, so
    that kernel work overlaps no other row (the Go reference's in particular)."""
    if subject.path == AGENT and not kernel.reaper_done():
        log(f"{subject.key}: retired links still present after "
            f"{kernel.REAPER_TIMEOUT:.0f} s; the next rows may overlap their deletion")


def rotated(items: Sequence[T], number: int) -> list[T]:
    """items starting at position number (mod len): round-robin order, rotated per round."""
    if not items:
        return []
    shift = number % len(items)
    return [*items[shift:], *items[:shift]]


def problem(done: spawn.Execution, verb: str, needs_json: bool) -> str | None:
    """Why an invocation did not succeed, or None."""
    if done.timed_out:
        return f"{verb} timed out after {INVOKE_TIMEOUT:.0f} s"
    out = done.stdout.decode(errors="replace")
    if done.status != 0:
        return f"{verb} exit {done.status}: {one_line(out)} {one_line(done.stderr.decode())}"
    if needs_json:
        try:
            json.loads(out)
        except ValueError:
            return f"{verb} printed no JSON: {one_line(out)}"
    return None
