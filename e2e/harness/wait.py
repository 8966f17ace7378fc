"""Waiting on a condition (never a fixed sleep): poll until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable

from e2e.harness.kube import ApiError
from e2e.harness.pace import Bound


def wait_until(what: str, condition: Callable[[], bool], timeout: float | Bound = 60.0,
               interval: float = 0.2, alive: Callable[[], None] | None = None,
               detail: Callable[[], str] | None = None) -> None:
    """Poll `condition` until it is true; raise TimeoutError naming `what` otherwise.

    `alive` is called on every round and may raise to abort early (e.g. a process died).
    OSError and ApiError from `condition` count as "not yet" and the last one is reported.
    `detail`, if given, is called on timeout and its text (what was last seen) ends the message.
    A `Bound` as `timeout` says on timeout what it was derived from.
    """
    seconds = timeout.seconds if isinstance(timeout, Bound) else timeout
    deadline = time.monotonic() + seconds
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
            message = f"timed out after {seconds:.0f} s waiting for {what}"
            if isinstance(timeout, Bound):
                message += f" (bound: {timeout.why})"
            if last_error is not None:
                message += f": last error: {last_error}"
            if detail is not None:
                message += f"\n{detail()}"
            raise TimeoutError(message)
        time.sleep(interval)
