"""Created-only rollback (SPEC §7).

ADD records each thing at the moment it creates it, with the step that undoes exactly that.
On failure the steps run in reverse, each best-effort with a fresh deadline; the original error
is what the caller sees. Things ADD merely found or updated are never recorded, so they are
never deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from cni_plugin.core.deadline import Deadline

log = logging.getLogger(__name__)
UNDO_STEP_SECONDS = 10.0

Undo = Callable[[Deadline], None]


@dataclass
class Rollback:
    """The undo log of one ADD."""

    steps: list[tuple[str, Undo]] = field(default_factory=list)

    def created(self, what: str, undo: Undo) -> None:
        """Record that `what` was just created and how to remove it."""
        self.steps.append((what, undo))

    def run(self) -> list[str]:
        """Undo everything recorded, newest first; returns the steps that failed."""
        failed: list[str] = []
        while self.steps:
            what, undo = self.steps.pop()
            try:
                undo(Deadline(UNDO_STEP_SECONDS))
                log.info("rollback: removed %s", what)
            except Exception as exc:  # best effort: keep undoing the rest
                log.warning("rollback: could not remove %s: %s", what, exc)
                failed.append(f"{what}: {exc}")
        return failed

    def forget(self) -> None:
        """ADD succeeded: keep everything."""
        self.steps.clear()

    def __enter__(self) -> Rollback:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Undo everything on any failure in the block (the error goes on); keep it otherwise."""
        if kind is None:
            self.forget()
        else:
            self.run()
