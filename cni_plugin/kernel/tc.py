"""TC over rtnetlink: a link's clsact qdisc and its bpf classifier filters.

What galactic's Go attach (vishvananda/netlink's QdiscAdd and FilterReplace) sends, byte for
byte, over the project's own rtnetlink client; no `tc` subprocess.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cni_plugin.kernel.rtnl import (
    NLM_F_CREATE,
    NLM_F_EXCL,
    NetlinkError,
    Rtnl,
    as_str,
    as_u32,
    attr_str,
    attr_u32,
    decoded,
    nested,
    optional,
    parse_attrs,
)

RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC = 36, 37, 38
RTM_NEWTFILTER, RTM_DELTFILTER, RTM_GETTFILTER = 44, 45, 46
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS, TCA_BPF_TAG, TCA_BPF_ID = 6, 7, 8, 10, 11
TCA_BPF_FLAG_ACT_DIRECT = 1

TC_H_CLSACT = 0xFFFFFFF1  # the clsact qdisc's parent (TC_H_INGRESS)
CLSACT_HANDLE = 0xFFFF0000  # ffff:
TC_H_INGRESS_HOOK = 0xFFFFFFF2  # ffff:fff2 (TC_H_MIN_INGRESS under clsact)
TC_H_EGRESS_HOOK = 0xFFFFFFF3  # ffff:fff3 (TC_H_MIN_EGRESS)
ETH_P_ALL = 0x0003
CLSACT, BPF = "clsact", "bpf"

# struct tcmsg: family, pad, pad, ifindex, handle, parent, info.
TCMSG = struct.Struct("=BxxxiIII")

_HOOK_NAMES = {TC_H_INGRESS_HOOK: "ingress", TC_H_EGRESS_HOOK: "egress"}


@dataclass(frozen=True)
class BpfFilter:
    """A bpf classifier on a clsact hook, as a dump shows it."""

    priority: int
    handle: int
    protocol: int
    name: str
    prog_id: int | None
    direct_action: bool


# Messages (pure) ----------------------------------------------------------------------------

def tcmsg(ifindex: int, handle: int = 0, parent: int = 0, info: int = 0) -> bytes:
    """The TC header (family AF_UNSPEC)."""
    return TCMSG.pack(socket.AF_UNSPEC, ifindex, handle, parent, info)


def filter_info(priority: int, protocol: int) -> int:
    """tcm_info of a filter: its priority above the protocol in network byte order."""
    return (priority << 16) | socket.htons(protocol)


def clsact_request(ifindex: int) -> bytes:
    """RTM_NEWQDISC body: a clsact qdisc on ifindex (no TCA_OPTIONS, as netlink's Clsact)."""
    return tcmsg(ifindex, CLSACT_HANDLE, TC_H_CLSACT) + attr_str(TCA_KIND, CLSACT)


def bpf_filter_request(ifindex: int, prog_fd: int, name: str, *, hook: int, priority: int,
                       handle: int, protocol: int, direct_action: bool) -> bytes:
    """RTM_NEWTFILTER body of a bpf classifier running prog_fd, as netlink's BpfFilter: fd,
    name, then flags (sent even when 0)."""
    flags = TCA_BPF_FLAG_ACT_DIRECT if direct_action else 0
    return tcmsg(ifindex, handle, hook, filter_info(priority, protocol)) + \
        attr_str(TCA_KIND, BPF) + nested(
            TCA_OPTIONS, attr_u32(TCA_BPF_FD, prog_fd), attr_str(TCA_BPF_NAME, name),
            attr_u32(TCA_BPF_FLAGS, flags))


def filter_delete_request(ifindex: int, *, hook: int, priority: int, handle: int,
                          protocol: int) -> bytes:
    """RTM_DELTFILTER body naming one bpf filter by hook, priority, protocol and handle."""
    return tcmsg(ifindex, handle, hook, filter_info(priority, protocol)) + \
        attr_str(TCA_KIND, BPF)


def decode_kind(payload: bytes) -> tuple[int, str]:
    """(ifindex, TCA_KIND) of a qdisc or filter message."""
    _, ifindex, _, _, _ = TCMSG.unpack_from(payload)
    return ifindex, as_str(parse_attrs(payload, TCMSG.size).get(TCA_KIND, b""))


def decode_bpf_filter(payload: bytes) -> BpfFilter | None:
    """A filter message as a BpfFilter; None when it is not a bpf classifier with options
    (a dump also lists each priority's classifier itself, without options)."""
    _, _, handle, _, info = TCMSG.unpack_from(payload)
    attrs = parse_attrs(payload, TCMSG.size)
    if as_str(attrs.get(TCA_KIND, b"")) != BPF or TCA_OPTIONS not in attrs:
        return None
    options = parse_attrs(attrs[TCA_OPTIONS])
    return BpfFilter(
        priority=info >> 16, handle=handle, protocol=socket.ntohs(info & 0xFFFF),
        name=optional(options, TCA_BPF_NAME, as_str) or "",
        prog_id=optional(options, TCA_BPF_ID, as_u32),
        direct_action=bool((optional(options, TCA_BPF_FLAGS, as_u32) or 0)
                           & TCA_BPF_FLAG_ACT_DIRECT))


# Requests -----------------------------------------------------------------------------------

def hook_name(hook: int) -> str:
    """ingress / egress, or the parent in hex."""
    return _HOOK_NAMES.get(hook, f"parent {hook:#x}")


@contextmanager
def _naming(operation: str, ifindex: int) -> Iterator[None]:
    """A NetlinkError raised in the block, its message naming the operation and link."""
    try:
        yield
    except NetlinkError as exc:
        raise NetlinkError(exc.code, f"{operation} on ifindex {ifindex}: {exc.message}") \
            from None


def has_clsact(rtnl: Rtnl, ifindex: int) -> bool:
    """Whether link ifindex has a clsact qdisc."""
    with _naming("list qdiscs", ifindex):
        replies = rtnl.dump(RTM_GETQDISC, tcmsg(ifindex))
    return any(decoded(decode_kind, msg.payload) == (ifindex, CLSACT)
               for msg in replies if msg.type == RTM_NEWQDISC)


def ensure_clsact(rtnl: Rtnl, ifindex: int) -> bool:
    """Give link ifindex a clsact qdisc unless it has one; True when this call created it.

    As galactic: list first, then add; an EEXIST from a concurrent add is success.
    """
    if has_clsact(rtnl, ifindex):
        return False
    try:
        with _naming("add clsact qdisc", ifindex):
            rtnl.request(RTM_NEWQDISC, clsact_request(ifindex), NLM_F_CREATE | NLM_F_EXCL)
    except NetlinkError as exc:
        if exc.code == errno.EEXIST:
            return False
        raise
    return True


def replace_bpf_filter(rtnl: Rtnl, ifindex: int, prog_fd: int, name: str, *,
                       hook: int = TC_H_INGRESS_HOOK, priority: int = 1, handle: int = 1,
                       protocol: int = ETH_P_ALL, direct_action: bool = True) -> None:
    """Attach the program of prog_fd as bpf filter `name` on a clsact hook of link ifindex,
    replacing the filter at the same priority and handle (NLM_F_CREATE without EXCL, as
    netlink.FilterReplace). The link needs its clsact qdisc (`ensure_clsact`)."""
    with _naming(f"attach bpf filter {name!r} (priority {priority}, handle {handle:#x}) to "
                 f"{hook_name(hook)}", ifindex):
        rtnl.request(RTM_NEWTFILTER, bpf_filter_request(
            ifindex, prog_fd, name, hook=hook, priority=priority, handle=handle,
            protocol=protocol, direct_action=direct_action), NLM_F_CREATE)


def bpf_filters(rtnl: Rtnl, ifindex: int, hook: int = TC_H_INGRESS_HOOK) -> list[BpfFilter]:
    """The bpf filters on a clsact hook of link ifindex ([] without clsact)."""
    with _naming(f"list filters of {hook_name(hook)}", ifindex):
        replies = rtnl.dump(RTM_GETTFILTER, tcmsg(ifindex, parent=hook))
    found = (decoded(decode_bpf_filter, msg.payload)
             for msg in replies if msg.type == RTM_NEWTFILTER)
    return [bpf_filter for bpf_filter in found if bpf_filter is not None]


def delete_filter(rtnl: Rtnl, ifindex: int, priority: int, handle: int = 1,
                  protocol: int = ETH_P_ALL, hook: int = TC_H_INGRESS_HOOK) -> bool:
    """Delete the bpf filter at priority and handle of a clsact hook; False when there was
    none (nor any clsact qdisc)."""
    try:
        with _naming(f"delete bpf filter (priority {priority}, handle {handle:#x}) from "
                     f"{hook_name(hook)}", ifindex):
            rtnl.request(RTM_DELTFILTER, filter_delete_request(
                ifindex, hook=hook, priority=priority, handle=handle, protocol=protocol))
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            return False
        if exc.code == errno.EINVAL and not has_clsact(rtnl, ifindex):
            return False  # "Parent Qdisc doesn't exists"
        raise
    return True
