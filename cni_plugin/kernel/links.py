"""Links: veth pairs, lookup, ownership marks, MTU, state, retirement, deletion.

The alias `vpc-attach/<containerID>/<ifname>` records the owner, so nobody takes over or deletes
another container's link (SPEC §5); why links are retired: docs/architecture.md ("Retired links").
"""

from __future__ import annotations

import errno
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from cni_plugin.kernel.rtnl import LinkMsg, NetlinkError, Rtnl
from netconf.errors import KERNEL_FAILURE, TRY_AGAIN_LATER, CniError

ALIAS_PREFIX = "vpc-attach/"
RETIRED_ALIAS_PREFIX = "vpc-attach-retired/"
RETIRED_NAME_PREFIX = "vpz"
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
    group: int = 0

    @property
    def owner(self) -> Owner | None:
        """The container recorded on the link, if any."""
        return Owner.from_alias(self.alias)


TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.ETIMEDOUT})


@contextmanager
def kernel_errors(action: str, obj: str) -> Iterator[None]:
    """Turn netlink/OS errors into code 100 naming the action and the object (code 11 when the
    kernel was only slow or busy: no answer within the deadline, a dump that kept changing)."""
    try:
        yield
    except NetlinkError as exc:
        code = TRY_AGAIN_LATER if exc.code in TRANSIENT_ERRNOS else KERNEL_FAILURE
        raise CniError(code, f"failed to {action} {obj!r}: {exc.message}",
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


def _to_link(msg: LinkMsg) -> Link:
    return Link(index=msg.index, name=msg.name, kind=msg.kind, mac=msg.mac, mtu=msg.mtu,
                up=msg.up, alias=msg.alias, master=msg.master, group=msg.group)


def find(rtnl: Rtnl, name: str) -> Link | None:
    """The link called name, or None."""
    try:
        return _to_link(rtnl.get_link(name=name))
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise CniError(KERNEL_FAILURE, f"failed to look up link {name!r}: {exc}") from None


def by_index(rtnl: Rtnl, index: int) -> Link | None:
    """The link with this index, or None."""
    try:
        return _to_link(rtnl.get_link(index=index))
    except NetlinkError:
        return None


def all_links(rtnl: Rtnl) -> list[Link]:
    """Every link of the netns."""
    with kernel_errors("list", "links"):
        return [_to_link(msg) for msg in rtnl.links()]


def create_veth(host_rtnl: Rtnl, host_name: str, peer_name: str, peer_netns_fd: int,
                mtu: int | None) -> None:
    """Create host_name in this netns with its peer peer_name created directly in the pod netns."""
    with kernel_errors("create veth", host_name):
        host_rtnl.new_veth(host_name, peer_name, peer_netns_fd, mtu)


def configure(rtnl: Rtnl, link: Link, *, name: str | None = None, mtu: int | None = None,
              alias: str | None = None, up: bool | None = None, master: int | None = None,
              group: int | None = None) -> Link:
    """Rename / set MTU / alias / master / group / state of a link, in one request with clear
    errors;
    the link as it now is (same index, no read-back).

    Only what differs is sent. The kernel renames and sets MTU and master before IFF_UP, so
    a link can be renamed and brought up together.
    """
    changed = replace(link, name=link.name if name is None else name,
                      mtu=link.mtu if mtu is None else mtu,
                      alias=link.alias if alias is None else alias,
                      up=link.up if up is None else up,
                      master=link.master if master is None else master,
                      group=link.group if group is None else group)
    new_name = name if name is not None and name != link.name else None
    new_mtu = mtu if mtu is not None and mtu != link.mtu else None
    new_alias = alias if alias is not None and alias != link.alias else None
    new_master = master if master is not None and master != link.master else None
    new_state = up if up is not None and up != link.up else None
    new_group = group if group is not None and group != link.group else None
    attrs_change = any(v is not None for v in (new_name, new_mtu, new_alias, new_master,
                                                new_group))
    if not attrs_change and new_state is None:
        return changed
    action, obj = ("configure link", link.name) if attrs_change else \
        ("set state of link", name or link.name)
    with kernel_errors(action, obj):
        rtnl.set_link(link.index, name=new_name, mtu=new_mtu, alias=new_alias, master=new_master,
                      up=new_state, group=new_group)
    return changed


def set_mac(rtnl: Rtnl, link: Link, mac: str) -> None:
    """Give a link this MAC address (aa:bb:cc:dd:ee:ff, validated with the config)."""
    with kernel_errors("set MAC of", link.name):
        rtnl.set_link(link.index, mac=mac)


def delete(rtnl: Rtnl, link: Link) -> None:
    """Delete a link; already gone is fine."""
    with kernel_errors("delete link", link.name):
        ignore_missing(lambda: rtnl.del_link(index=link.index))


def retire(rtnl: Rtnl, link: Link) -> str:
    """Take an attachment link out of service at once (down, renamed `vpz…`, retired alias);
    its new name. Down first: the kernel refuses to rename a running link. Gone is fine."""
    name = f"{RETIRED_NAME_PREFIX}{secrets.token_hex(6)}"
    owner = (link.alias or "")[len(ALIAS_PREFIX):]
    with kernel_errors("retire link", link.name):
        ignore_missing(lambda: rtnl.set_link(link.index, up=False))
        ignore_missing(lambda: rtnl.set_link(link.index, name=name,
                                             alias=RETIRED_ALIAS_PREFIX + owner))
    return name


def is_retired(link: Link) -> bool:
    """Whether link is one of our retired links (never someone else's vpz… link)."""
    return link.name.startswith(RETIRED_NAME_PREFIX) and \
        (link.alias or "").startswith(RETIRED_ALIAS_PREFIX)


def delete_all_retired(rtnl: Rtnl) -> list[Link]:
    """Delete every retired link of the netns (a stopped agent's); the links deleted."""
    found = [link for link in all_links(rtnl) if is_retired(link)]
    for link in found:
        delete(rtnl, link)
    return found


def delete_retired(rtnl: Rtnl, name: str) -> bool:
    """Delete the retired link called name, if it still is one; whether one was deleted."""
    link = find(rtnl, name)
    if link is None or not is_retired(link):
        return False
    delete(rtnl, link)
    return True
