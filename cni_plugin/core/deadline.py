"""A monotonic deadline shared by every step of one invocation (SPEC §9)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from netconf.errors import TRY_AGAIN_LATER, CniError


@dataclass
class Deadline:
    """Seconds left until the invocation must have answered."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def remaining(self, floor: float = 0.05) -> float:
        """Seconds left, never below floor (a call always gets some time to fail cleanly)."""
        return max(floor, self.started + self.seconds - time.monotonic())

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return time.monotonic() >= self.started + self.seconds

    def check(self, doing: str) -> None:
        """Code 11 if the deadline passed before `doing`."""
        if self.expired():
            raise CniError(TRY_AGAIN_LATER,
                           f"deadline of {self.seconds:g}s exceeded before {doing}")

    def fresh(self, seconds: float) -> Deadline:
        """A new deadline (rollback steps each get their own)."""
        return Deadline(seconds)
