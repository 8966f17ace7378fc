"""The agent's reaper: deletes retired links once the DEL that retired them has answered.

The runtime then no longer waits for the kernel's veth teardown (docs/architecture.md,
"Retired links"). One thread, in order: the kernel serialises link deletions anyway.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from cni_plugin.kernel import links, netns
from cni_plugin.kernel.rtnl import Rtnl
from netconf.errors import CniError

log = logging.getLogger(__name__)
# Beyond this many, a DEL deletes its own link before answering: a DEL storm cannot pile up work.
MAX_PENDING = 256
NETLINK_TIMEOUT = 10.0


class Reaper:
    """A queue of retired host links and the thread deleting them."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._pending: deque[str] = deque()
        self._busy = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, name: str) -> None:
        """Delete the retired host link name soon (now, in this thread, if too many wait)."""
        with self._cond:
            if len(self._pending) < self.max_pending:
                self._pending.append(name)
                self._start()
                self._cond.notify_all()
                return
        log.info("reaper: %d deletions pending; deleting %s now", self.max_pending, name)
        with netns.open_netlink(None, NETLINK_TIMEOUT) as rtnl:
            _delete(rtnl, name)

    def pending(self) -> int:
        """Retired links waiting for deletion or being deleted now."""
        with self._cond:
            return len(self._pending) + self._busy

    def sweep(self) -> int:
        """Delete every retired link of the host netns now (a killed agent's); how many."""
        with netns.open_netlink(None, NETLINK_TIMEOUT) as rtnl:
            deleted = len(links.delete_all_retired(rtnl))
        if deleted:
            log.info("reaper: deleted %d retired link(s) left by an earlier agent", deleted)
        return deleted

    def drain(self, timeout: float) -> bool:
        """Wait until nothing is pending or being deleted; whether that happened in time."""
        give_up = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = give_up - time.monotonic()
                if left <= 0:
                    log.warning("reaper: %d retired link(s) still pending at shutdown; the "
                                "next agent or a GC deletes them",
                                len(self._pending) + self._busy)
                    return False
                self._cond.wait(left)
        return True

    def start(self) -> None:
        """Start the deleting thread (the agent does at start-up, from its main thread: a
        thread begins in its creator's netns); submit() starts it otherwise."""
        with self._cond:
            self._start()

    def _start(self) -> None:
        # With the lock held. A verb thread that submits is back in the host netns by then
        # (netns.entered restores it), so a lazily started thread is too.
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vpc-attach-reaper",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        rtnl: Rtnl | None = None
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                name = self._pending.popleft()
                self._busy = True
            try:
                if rtnl is None:
                    rtnl = netns.open_netlink(None, NETLINK_TIMEOUT)
                _delete(rtnl, name)
            except (CniError, OSError) as exc:
                log.warning("reaper: could not delete retired link %s: %s", name, exc)
                if rtnl is not None:
                    rtnl.close()
                    rtnl = None
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def _delete(rtnl: Rtnl, name: str) -> bool:
    deleted = links.delete_retired(rtnl, name)
    if deleted:
        log.debug("reaper: deleted retired link %s", name)
    return deleted
