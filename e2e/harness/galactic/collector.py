"""What the fabric's collector holds over time: waiting until its RIB is exactly what a step
must leave, the RIB sampled while a step runs, and the samples read as a timeline of who
announced a set of prefixes (`node 1 (12 samples) → none (30) → node 2 (45)`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from e2e.harness.galactic.fabric import Fabric
from e2e.harness.galactic.rib import EvpnRoute
from e2e.harness.galactic.sites import ROUTE_TIMEOUT_S
from e2e.harness.wait import wait_until

SAMPLE_EVERY_S = 0.05
# A sampler thread joins within one gobgp call (its own 30 s bound) after it is told to stop.
SAMPLER_JOIN_S = 60.0

Timeline = list[tuple[tuple[str, ...], int]]


def wait_for_rib(fabric: Fabric, step: str, want: list[EvpnRoute]) -> list[EvpnRoute]:
    """Wait until the collector holds exactly ``want``; what it held then."""
    seen: list[list[EvpnRoute]] = [[]]

    def holds() -> bool:
        seen[0] = fabric.rib()
        return seen[0] == want

    wait_until(f"the collector's RIB at step {step}", holds, ROUTE_TIMEOUT_S,
               alive=fabric.alive, detail=lambda: f"held {seen[0]}\nwanted {want}")
    return seen[0]


def describe(route: EvpnRoute, names: dict[str, str]) -> str:
    """One RIB line: prefix, RD, RT, SID, next hop, and the router (node) it came from."""
    return (f"{route.prefix:<20} rd {route.rd:<16} rt {','.join(route.route_targets)} "
            f"sid {route.sid} next-hop {route.next_hop} from {route.router} "
            f"({names.get(route.router, '?')})")


@contextlib.contextmanager
def rib_sampled(fabric: Fabric) -> Iterator[list[list[EvpnRoute]]]:
    """Every RIB the collector held while the block ran, in order, the first taken before the
    block's first step (sampled in a thread)."""
    samples = [fabric.rib()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(fabric.rib())
            stop.wait(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, name="rib sampler", daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join(SAMPLER_JOIN_S)
        assert not sampler.is_alive(), "the RIB sampler did not stop"


def every_route(samples: list[list[EvpnRoute]]) -> set[EvpnRoute]:
    """Each route any sample held."""
    return {route for rib in samples for route in rib}


def announcers(rib: list[EvpnRoute], prefixes: set[str],
               names: dict[str, str]) -> tuple[str, ...]:
    """The nodes whose routers announce any of the prefixes in one RIB ('none' if none)."""
    found = {names.get(route.router, route.router) for route in rib if route.prefix in prefixes}
    return tuple(sorted(found)) or ("none",)


def held_twice(rib: list[EvpnRoute], prefixes: set[str]) -> list[str]:
    """The prefixes one RIB holds more than once."""
    held = [route.prefix for route in rib if route.prefix in prefixes]
    return sorted({prefix for prefix in held if held.count(prefix) > 1})


def timeline(samples: list[list[EvpnRoute]], prefixes: set[str],
             names: dict[str, str]) -> Timeline:
    """The samples as runs of one state: (who announces the prefixes, how many samples)."""
    runs: Timeline = []
    for rib in samples:
        state = announcers(rib, prefixes, names)
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1] + 1)
        else:
            runs.append((state, 1))
    return runs


def shown(runs: Timeline) -> str:
    """`node 1 (12 samples) → none (30) → node 2 (45)`."""
    return " → ".join(f"{' + '.join(state)} ({count}{' samples' if n == 0 else ''})"
                      for n, (state, count) in enumerate(runs))
