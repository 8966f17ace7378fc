"""Persistent tap devices, made with the /dev/net/tun ioctls (what `ip tuntap add` does)."""

from __future__ import annotations

import fcntl
import os
import struct

from netconf.errors import KERNEL_FAILURE, CniError

TUN_DEVICE = "/dev/net/tun"
TUNSETIFF = 0x400454CA
TUNSETPERSIST = 0x400454CB
TUNSETOWNER = 0x400454CC
TUNSETGROUP = 0x400454CE
IFF_TAP = 0x0002
IFF_MULTI_QUEUE = 0x0100
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000


def create_tap(name: str, *, owner: int | None, group: int | None, multi_queue: bool,
               vnet_hdr: bool) -> None:
    """Create a persistent tap `name`; the link exists (down) when this returns."""
    flags = IFF_TAP | IFF_NO_PI
    if multi_queue:
        flags |= IFF_MULTI_QUEUE
    if vnet_hdr:
        flags |= IFF_VNET_HDR
    try:
        fd = os.open(TUN_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise CniError(KERNEL_FAILURE, f"failed to open {TUN_DEVICE}: {exc.strerror}",
                       "the tun module must be loaded to create taps") from None
    try:
        ifreq = struct.pack("16sH22x", name.encode(), flags)
        _ioctl(fd, TUNSETIFF, ifreq, f"create tap {name!r}")
        if owner is not None:
            _ioctl(fd, TUNSETOWNER, owner, f"set owner of tap {name!r}")
        if group is not None:
            _ioctl(fd, TUNSETGROUP, group, f"set group of tap {name!r}")
        _ioctl(fd, TUNSETPERSIST, 1, f"make tap {name!r} persistent")
    finally:
        os.close(fd)


def _ioctl(fd: int, request: int, arg: bytes | int, action: str) -> None:
    try:
        fcntl.ioctl(fd, request, arg)
    except OSError as exc:
        raise CniError(KERNEL_FAILURE, f"failed to {action}: {exc.strerror}",
                       f"errno {exc.errno}") from None
