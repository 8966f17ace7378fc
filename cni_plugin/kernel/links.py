"""Links: veth pairs, lookup, ownership marks, MTU, state, deletion.

Ownership (SPEC §5): every per-attachment link carries the alias
`vpc-attach/<containerID>/<ifname>`, so ADD can refuse to take over another container's
attachment and DEL only deletes what its own container created.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netconf.errors import KERNEL_FAILURE, CniError

ALIAS_PREFIX = "vpc-attach/"
T = TypeVar("T")


@dataclass(frozen=True)
class Owner:
    """Who an attachment link belongs to."""

    container_id: str
    ifname: str

    @property
    def alias(self) -> str:
        """The link alias recording this owner."""
        return f"{ALIAS_PREFIX}{self.container_id}/{self.ifname}"

    @classmethod
    def from_alias(cls, alias: str | None) -> Owner | None:
        """Parse an alias written by `alias`; None if it is not ours."""
        if not alias or not alias.startswith(ALIAS_PREFIX):
            return None
        container_id, sep, ifname = alias[len(ALIAS_PREFIX):].partition("/")
        return cls(container_id, ifname) if sep and container_id and ifname else None


@dataclass(frozen=True)
class Link:
    """What we read back about a link."""

    index: int
    name: str
    kind: str
    mac: str
    mtu: int
    up: bool
    alias: str | None
    master: int | None

    @property
    def owner(self) -> Owner | None:
        """The container recorded on the link, if any."""
        return Owner.from_alias(self.alias)


@contextmanager
def kernel_errors(action: str, obj: str) -> Iterator[None]:
    """Turn netlink/OS errors into code 100 naming the action and the object."""
    try:
        yield
    except NetlinkError as exc:
        raise CniError(KERNEL_FAILURE, f"failed to {action} {obj!r}: {exc.args[-1]}",
                       f"netlink error {exc.code}") from None
    except OSError as exc:
        raise CniError(KERNEL_FAILURE, f"failed to {action} {obj!r}: {exc.strerror or exc}",
                       f"errno {exc.errno}") from None


def ignore_missing(call: Callable[[], T]) -> T | None:
    """Run a netlink call, treating 'no such device/entry' as success (idempotent DEL)."""
    try:
        return call()
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT, errno.ESRCH, errno.EADDRNOTAVAIL):
            return None
        raise


def _to_link(msg: Any) -> Link:
    info = msg.get("IFLA_LINKINFO")
    kind = info.get("IFLA_INFO_KIND") if info is not None else None
    return Link(
        index=msg["index"],
        name=msg.get("IFLA_IFNAME"),
        kind=kind or "",
        mac=(msg.get("IFLA_ADDRESS") or "").lower(),
        mtu=msg.get("IFLA_MTU") or 0,
        up=bool(msg["flags"] & 1),
        alias=msg.get("IFLA_IFALIAS"),
        master=msg.get("IFLA_MASTER"),
    )


def find(ipr: IPRoute, name: str) -> Link | None:
    """The link called name, or None."""
    try:
        msgs = ipr.get_links(ifname=name)
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise CniError(KERNEL_FAILURE, f"failed to look up link {name!r}: {exc}") from None
    return _to_link(msgs[0]) if msgs else None


def by_index(ipr: IPRoute, index: int) -> Link | None:
    """The link with this index, or None."""
    try:
        msgs = ipr.get_links(index)
    except NetlinkError:
        return None
    return _to_link(msgs[0]) if msgs else None


def all_links(ipr: IPRoute) -> list[Link]:
    """Every link of the netns."""
    with kernel_errors("list", "links"):
        return [_to_link(msg) for msg in ipr.get_links()]


def create_veth(host_ipr: IPRoute, host_name: str, peer_name: str, peer_netns_fd: int,
                mtu: int | None) -> None:
    """Create host_name in this netns with its peer peer_name created directly in the pod netns."""
    peer: dict[str, Any] = {"ifname": peer_name, "net_ns_fd": peer_netns_fd}
    extra: dict[str, Any] = {}
    if mtu is not None:
        peer["mtu"] = mtu
        extra["mtu"] = mtu
    with kernel_errors("create veth", host_name):
        host_ipr.link("add", ifname=host_name, kind="veth", peer=peer, **extra)


def configure(ipr: IPRoute, link: Link, *, name: str | None = None, mtu: int | None = None,
              alias: str | None = None, up: bool | None = None, master: int | None = None) -> None:
    """Rename / set MTU / alias / master / state of a link, in one place with clear errors."""
    attrs: dict[str, Any] = {}
    if name is not None and name != link.name:
        attrs["ifname"] = name
    if mtu is not None and mtu != link.mtu:
        attrs["mtu"] = mtu
    if alias is not None and alias != link.alias:
        attrs["ifalias"] = alias
    if master is not None and master != link.master:
        attrs["master"] = master
    if attrs:
        with kernel_errors("configure link", link.name):
            ipr.link("set", index=link.index, **attrs)
    if up is not None and up != link.up:
        with kernel_errors("set state of link", name or link.name):
            ipr.link("set", index=link.index, state="up" if up else "down")


def delete(ipr: IPRoute, link: Link) -> None:
    """Delete a link; already gone is fine."""
    with kernel_errors("delete link", link.name):
        ignore_missing(lambda: ipr.link("del", index=link.index))
