"""Network namespaces: netlink sockets bound to a netns without forking.

A netlink socket stays in the namespace it was created in, so the calling thread briefly
enters the target netns (setns only affects this thread), opens the socket and returns.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel.rtnl import DEFAULT_TIMEOUT, Rtnl
from netconf.errors import INVALID_ENV, KERNEL_FAILURE, CniError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsGone(CniError):
    """The netns path does not exist (or is not a netns)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(INVALID_ENV, f"failed to open netns {path!r}", reason)
        self.path = path


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise CniError(KERNEL_FAILURE, f"failed to enter netns {what!r}", os.strerror(err))


@contextmanager
def opened(path: str) -> Iterator[int]:
    """An fd of the netns at path, closed after the block (NetnsGone when it cannot open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetnsGone(path, exc.strerror or str(exc)) from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def entered(path: str) -> Iterator[None]:
    """Run the block with this thread inside the netns at path."""
    with opened(path) as target:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                _setns(target, path)
            except CniError as exc:
                raise NetnsGone(path, exc.details) from None
            try:
                yield
            finally:
                _setns(home, "host")
        finally:
            os.close(home)


@contextmanager
def scratch() -> Iterator[None]:
    """Run the block with this thread in a new, empty netns (what it and the processes it
    starts meanwhile make there vanishes with it); back home after."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise CniError(KERNEL_FAILURE, "failed to create a scratch netns", os.strerror(err))
        try:
            yield
        finally:
            _setns(home, "host")
    finally:
        os.close(home)


def open_netlink(path: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 deadline: Deadline | None = None) -> Rtnl:
    """An rtnetlink socket living in the netns at path (host netns when None).

    Every request on it waits at most timeout seconds for the kernel's answer, and never past
    the deadline when one is given.
    """
    if path is None:
        return Rtnl(timeout, deadline)
    with entered(path):
        return Rtnl(timeout, deadline)


def exists(path: str) -> bool:
    """True when path names a network namespace."""
    try:
        with opened(path):
            return True
    except NetnsGone:
        return False
