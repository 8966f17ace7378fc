"""Waiting on a condition (never a fixed sleep): poll until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable

from e2e.harness.kube import ApiError


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 60.0,
               interval: float = 0.2, alive: Callable[[], None] | None = None) -> None:
    """Poll `condition` until it is true; raise TimeoutError naming `what` otherwise.

    `alive` is called on every round and may raise to abort early (e.g. a process died).
    OSError and ApiError from `condition` count as "not yet" and the last one is reported.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        if alive is not None:
            alive()
        try:
            if condition():
                return
        except (OSError, ApiError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f": last error: {last_error}" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)
