"""Waiting on a condition in a unit test (a thread or a child process getting somewhere): poll
until it holds, never a fixed sleep. OSError counts as "not yet" (a file being replaced, a FIFO
whose reader is not there yet)."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(what: str, condition: Callable[[], bool], timeout: float,
               interval: float = 0.02) -> None:
    """Poll ``condition`` until it is true; raise TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last_error: OSError | None = None
    while True:
        try:
            if condition():
                return
        except OSError as exc:
            last_error = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                               + (f": last error: {last_error}" if last_error else ""))
        time.sleep(interval)
