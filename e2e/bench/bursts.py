"""Bursts: 32 ADDs released at once (each in its own netns), then their 32 DELs at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from e2e.bench import rounds, spawn
from e2e.bench.run import CONCURRENCY, Invocation, Run
from e2e.bench.subjects import AGENT, Subject
from e2e.harness.wait import wait_until
from netconf import base62

BURST_END_S = 120.0  # a failed burst's threads end once their children are killed

T = TypeVar("T")
U = TypeVar("U")


def burst_rounds(runs: int, bursts: int) -> set[int]:
    """Measured rounds after which a burst runs, spread evenly over the run."""
    return {min(runs - 1, int((b + 0.5) * runs / bursts)) for b in range(bursts)}


def burst(run: Run, subject: Subject, number: int) -> None:
    """The subject's number-th burst: its ADDs and DELs feed the xCONCURRENCY rows."""
    members = [(j, f"b{number}-{j}") for j in range(CONCURRENCY)]
    namespaces = [run.janitor.netns() for _ in members]

    def container(run_id: str) -> str:
        return f"bench-{run.token}-{subject.key}-{run_id}"

    try:
        def add(member: tuple[int, str]) -> tuple[float, float, Any]:
            j, run_id = member
            t0 = time.perf_counter()
            outcome = rounds.add(run, subject, namespaces[j], container(run_id),
                                 f"{subject.key}-{run_id}", base62.encode_base62(j + 1))
            return t0, time.perf_counter(), outcome

        added = _concurrently(add, members)
        row = run.rows[f"{subject.key}/ADDx{CONCURRENCY}"]
        for (_, run_id), (_, _, (done, _, problem)) in zip(members, added, strict=True):
            run.record(row, done, problem,
                       Invocation(row.key, "ADD", container(run_id), subject.path == AGENT))
        row.walls_ms.append(_wall(added))

        def delete(member: tuple[int, str]) -> tuple[float, float, Any]:
            j, run_id = member
            t0 = time.perf_counter()
            outcome = rounds.delete(run, subject, namespaces[j], container(run_id),
                                    f"{subject.key}-{run_id}", base62.encode_base62(j + 1),
                                    added[j][2][1])
            return t0, time.perf_counter(), outcome

        deleted = _concurrently(delete, members)
        rounds.after_agent_dels(subject)
        row = run.rows[f"{subject.key}/DELx{CONCURRENCY}"]
        for (j, run_id), (_, _, (done, problem)) in zip(members, deleted, strict=True):
            if added[j][2][1] is not None:
                run.record(row, done, problem,
                           Invocation(row.key, "DEL", container(run_id), subject.path == AGENT))
        row.walls_ms.append(_wall(deleted))
    finally:
        for netns in namespaces:
            run.janitor.remove(netns)


def _concurrently(work: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """work(item) for all items at once (released together by a barrier); results in order."""
    barrier = threading.Barrier(len(items), timeout=60)

    def released(item: T) -> U:
        barrier.wait()
        return work(item)

    pool = ThreadPoolExecutor(len(items), thread_name_prefix="bench-burst")
    futures = [pool.submit(released, item) for item in items]
    try:
        return [future.result() for future in futures]
    except BaseException:
        barrier.abort()

        def ended() -> bool:
            spawn.kill_all()  # kill what runs so the threads end
            return all(f.done() for f in futures)

        wait_until("the burst's threads to end", ended, BURST_END_S, interval=0.05)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _wall(outcomes: Sequence[tuple[float, float, Any]]) -> float:
    return (max(end for _, end, _ in outcomes) - min(start for start, _, _ in outcomes)) * 1000
