"""Created-only rollback (SPEC §7).

ADD records each thing at the moment it creates it, with the step that undoes exactly that.
On failure the steps run in reverse, each best-effort, all within what is left of the
invocation's deadline (forward work stopped early to leave it a reserve); the original error
is what the caller sees, with what could not be undone in its details. Things ADD merely found
or updated are never recorded, so they are never deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from cni_plugin.core.deadline import Deadline
from netconf.errors import CniError

log = logging.getLogger(__name__)

Undo = Callable[[Deadline], object]  # what it returns is ignored
# Kept for each undo step still to come while an earlier one runs (each takes milliseconds
# when its system answers).
STEP_SECONDS = 0.25
# Told whether a rollback that had something to undo finished it (the agent counts them).
RollbackObserver = Callable[[bool], None]


@dataclass
class Rollback:
    """The undo log of one ADD; its steps share `deadline` (the invocation's whole one)."""

    deadline: Deadline
    steps: list[tuple[str, Undo]] = field(default_factory=list)
    on_finish: RollbackObserver | None = None

    def created(self, what: str, undo: Undo) -> None:
        """Record that `what` was just created and how to remove it."""
        self.steps.append((what, undo))

    def run(self) -> list[str]:
        """Undo everything recorded, newest first; returns the steps that did not finish."""
        failed: list[str] = []
        had_steps = bool(self.steps)
        while self.steps:
            what, undo = self.steps.pop()
            if self.deadline.expired():
                failed.append(f"{what}: no time left")
                continue
            try:
                undo(self._share(len(self.steps)))
                log.info("rollback: removed %s", what)
            except Exception as exc:  # best effort: keep undoing the rest
                failed.append(f"{what}: {exc}")
        if failed:
            log.warning("rollback incomplete (GC or a retried DEL removes the rest): %s",
                        "; ".join(failed))
        if had_steps and self.on_finish is not None:
            try:
                self.on_finish(not failed)
            except Exception:  # an observer never changes the answer
                log.exception("rollback observer failed")
        return failed

    def _share(self, later: int) -> Deadline:
        """What one step may use: all that is left but a little for each later step, so one
        slow step (an answer that never comes) cannot starve the rest."""
        left = self.deadline.remaining(floor=0)
        kept = min(STEP_SECONDS * later, left / 2)
        return Deadline(left - kept)

    def forget(self) -> None:
        """ADD succeeded: keep everything."""
        self.steps.clear()

    def __enter__(self) -> Rollback:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Undo everything on any failure in the block (the error goes on, saying what could
        not be undone); keep it otherwise."""
        if kind is None:
            self.forget()
            return
        failed = self.run()
        if failed and isinstance(exc, CniError):
            note = "rollback incomplete: " + "; ".join(failed)
            exc.details = f"{exc.details}; {note}" if exc.details else note
