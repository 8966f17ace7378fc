"""File locks with timeouts: shared host state is serialised, never waited on forever."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from netconf.errors import TRY_AGAIN_LATER, CniError

_POLL_SECONDS = 0.005
_MAX_POLL_SECONDS = 0.05


def acquire(fd: int, timeout: float, *, shared: bool = False) -> bool:
    """Take an exclusive (or shared) flock on fd within timeout seconds (polling with back-off,
    never blocking); whether it was taken. Every lock of the project and its tools goes through
    here."""
    give_up = time.monotonic() + timeout
    delay = _POLL_SECONDS
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= give_up:
            return False
        time.sleep(delay)
        delay = min(delay * 2, _MAX_POLL_SECONDS)


def lock_path(lock_dir: str, name: str) -> str:
    """The lock file of a host object name in lock_dir (a host link, a VRF, 'host', …)."""
    return os.path.join(lock_dir, f"{name}.lock")


def container_lock_path(lock_dir: str, container_id: str, ifname: str) -> str:
    """The lock of a (container, ifname), held for a whole ADD or DEL (SPEC §9). One of 256
    files: unrelated containers rarely share one."""
    key = f"{container_id}/{ifname}".encode()
    return lock_path(lock_dir, f"container-{hashlib.sha256(key).hexdigest()[:2]}")


@contextmanager
def file_lock(path: str, timeout: float, *, shared: bool = False) -> Iterator[None]:
    """Hold an exclusive flock on path (shared: with other shared holders only); code 11 if
    not acquired within timeout seconds."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if not acquire(fd, timeout, shared=shared):
            raise CniError(TRY_AGAIN_LATER, f"timed out waiting for lock {path!r}",
                           f"waited {timeout:.1f}s; another invocation holds it")
        yield
    finally:
        os.close(fd)  # closing releases the flock
