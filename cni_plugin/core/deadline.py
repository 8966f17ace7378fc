"""A monotonic deadline shared by every step of one invocation (SPEC §9)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from netconf.errors import TRY_AGAIN_LATER, CniError

# What ADD's forward work leaves its rollback (SPEC §7): a third, at least 2 s, at most half.
ROLLBACK_SHARE = 1 / 3
ROLLBACK_MIN_SECONDS = 2.0


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

    def less_rollback_reserve(self) -> Deadline:
        """The part of this deadline forward work may use: it ends early enough to leave a
        rollback its reserve, which the rollback's steps then share."""
        reserve = min(max(self.seconds * ROLLBACK_SHARE, ROLLBACK_MIN_SECONDS), self.seconds / 2)
        return Deadline(self.seconds - reserve, self.started)
