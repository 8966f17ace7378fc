"""How long this machine takes to start the plugin's Python, measured once per process, and the
bounds of the e2e tests' waits derived from it.

A bound sized on a fast CPU fails on a slow or busy one: under emulation (the full-kernel VM,
TCG) a cold start of the plugin takes seconds, not a fraction of one. So a wait on a process
the tests start (a verb, an agent) is bounded by what that process itself is bounded by (a
verb's own deadline) plus a number of cold starts measured here: once per test process, which
inside the VM is once per boot. A bound that expires says what it was made of (`Bound.why`).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni_plugin.ipam.plugin.config import DEFAULT_LOCK_TIMEOUT_SECONDS
from netconf.host import DEFAULT_TIMEOUT_SECONDS

# What a cold start is: a fresh interpreter importing what the agent and an in-process verb
# import (the agent's warm-up list), the largest part of either's start.
COLD_START = ("import cni_plugin.agent.server, cni_plugin.verbs.add, cni_plugin.verbs.delete, "
              "cni_plugin.verbs.check, cni_plugin.verbs.gc, cni_plugin.verbs.status")
# The calibration itself may not hang the session: a machine that cannot import the plugin
# within this long cannot run the e2e tests at all.
CALIBRATION_LIMIT_S = 600.0
# How many cold starts a process may take to start. One is what it takes at the pace measured;
# the rest is room for the machine getting busier after the measurement (another VM, a CPU
# hog: measured up to 4x slower) and for what the process does beyond its imports.
VERB_STARTS = 10  # a verb's process: the thin client, then (in-process) the plugin's imports
AGENT_STARTS = 15  # an agent: imports, the retired-link sweep, the node's host protection
AFTER_ANSWER_STARTS = 5  # an agent's work right after its answer (its reaper's link deletes)
# The thin client waits this long past the verb's deadline for the agent's answer
# (cni_plugin.agent.client.ANSWER_GRACE_SECONDS; not imported: it is the client's contract).
ANSWER_GRACE_S = 2.0
# Test-only override of the measurement (a test of this module); never passed to the VM.
PACE_ENV = "E2E_COLD_START_SECONDS"


@dataclass(frozen=True)
class Bound:
    """A wait's limit in seconds and what it was derived from (said when it expires)."""

    seconds: float
    why: str

    def __str__(self) -> str:
        return f"{self.seconds:.0f} s ({self.why})"


@dataclass(frozen=True)
class Pace:
    """The seconds of one cold start of the plugin here, measured once."""

    cold_start_s: float

    def starts(self, count: float) -> Bound:
        """The time of `count` cold starts at this pace."""
        return Bound(count * self.cold_start_s,
                     f"{count:g} x {self.cold_start_s:.2f} s, the plugin's cold start measured "
                     f"on this machine")

    def plus(self, count: float, seconds: float, what: str) -> Bound:
        """`count` cold starts and `seconds` of what the process is itself bounded by."""
        return Bound(count * self.cold_start_s + seconds,
                     f"{what} {seconds:g} s + {count:g} x {self.cold_start_s:.2f} s, the "
                     f"plugin's cold start measured on this machine")


@functools.cache
def pace() -> Pace:
    """This machine's pace, measured on first use (two cold starts; the second counts: the
    first also fills the file and bytecode caches every later start finds full)."""
    override = os.environ.get(PACE_ENV)
    if override:
        return Pace(float(override))
    _cold_start()
    return Pace(_cold_start())


def pace_now() -> Pace:
    """The pace measured again now, at least the first measurement's: for a judgement made
    when the machine may be busier than when `pace` measured it (another pass beside this one,
    a CPU hog), such as whether an answer past the deadline was late or only slow to start and
    exit. One cold start: the caches are full."""
    first = pace()
    if os.environ.get(PACE_ENV):
        return first
    return Pace(max(first.cold_start_s, _cold_start()))


def _cold_start() -> float:
    """Seconds of one cold start of the plugin's imports, measured."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", COLD_START], capture_output=True,
                          text=True, timeout=CALIBRATION_LIMIT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cannot calibrate the e2e bounds: {COLD_START!r} failed: "
                           f"{done.stderr.strip()}")
    return time.monotonic() - started


def verb_deadline(environ: Mapping[str, str], conf: Mapping[str, Any] | None = None) -> float:
    """The longest deadline a verb run with `environ` and `conf` may have (SPEC §9): the
    largest of its sources that is set (environment, the stanza, the node's host file), else
    the plugin's default. Its rollback shares it: ADD's forward work leaves it a reserve."""
    candidates = [environ.get("VPC_ATTACH_TIMEOUT_SECONDS"),
                  (conf or {}).get("timeoutSeconds"), _host_file_timeout(environ)]
    chosen = [seconds for seconds in map(_positive, candidates) if seconds is not None]
    return max(chosen) if chosen else DEFAULT_TIMEOUT_SECONDS


def lock_wait(conf: Mapping[str, Any] | None = None) -> float:
    """How long vpc-attach-ipam may wait for its pool's lock beyond the deadline (its own
    `lockTimeoutSeconds`, in the stanza or its ipam block, else its default): its lock waits
    are bounded by that setting, not by the verb's deadline."""
    conf = conf or {}
    ipam = conf.get("ipam")
    in_ipam = ipam.get("lockTimeoutSeconds") if isinstance(ipam, Mapping) else None
    chosen = [seconds for seconds in map(_positive, (conf.get("lockTimeoutSeconds"), in_ipam))
              if seconds is not None]
    return max(chosen) if chosen else DEFAULT_LOCK_TIMEOUT_SECONDS


def verb_bound(environ: Mapping[str, str], conf: Mapping[str, Any] | None = None) -> Bound:
    """How long a run of the plugin's executable may take: its deadline, its IPAM's lock wait,
    the thin client's grace for an agent's answer, and VERB_STARTS cold starts."""
    return pace().plus(VERB_STARTS,
                       verb_deadline(environ, conf) + lock_wait(conf) + ANSWER_GRACE_S,
                       "the verb's deadline + its IPAM's lock wait + the client's grace")


def agent_bound(environ: Mapping[str, str]) -> Bound:
    """How long an agent may take to accept on its socket: AGENT_STARTS cold starts, and the
    node's deadline for the host lock its host protection takes before the socket exists."""
    return pace().plus(AGENT_STARTS, verb_deadline(environ), "the node's lock deadline")


def after_answer_bound() -> Bound:
    """How long an agent may take for what it does right after answering a verb (its reaper
    deleting the links the verb retired: a VPC's unused VRF, the SID route with it)."""
    return pace().starts(AFTER_ANSWER_STARTS)


def _host_file_timeout(environ: Mapping[str, str]) -> object:
    path = environ.get("VPC_ATTACH_HOST_CONFIG")
    try:
        return json.loads(Path(path).read_text()).get("timeoutSeconds") if path else None
    except (OSError, ValueError, AttributeError):
        return None


def _positive(value: object) -> float | None:
    """value as seconds when it is a positive number (or its text), else None."""
    if not isinstance(value, (int, float, str)):
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None
