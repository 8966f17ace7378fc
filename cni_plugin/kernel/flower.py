"""Stateful tc filters over rtnetlink: flower classifiers with conntrack (`act_ct`) and
generic (`gact`) actions on a link's clsact hooks, as `tc filter add … flower … action ct …`
sends them; no `tc` subprocess.

A filter is a frozen `FlowerFilter`; its handle is a hash of everything it says, so the filters
a link should carry can be compared with those it has by handle alone (`dump_handles`), and a
change is "add the new handles, then delete the old ones" in one netlink batch each.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cni_plugin.kernel.rtnl import (
    NLA_F_NESTED,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NetlinkError,
    Rtnl,
    as_str,
    attr,
    attr_str,
    attr_u32,
    nested,
    parse_attrs,
)
from cni_plugin.kernel.tc import (
    RTM_DELTFILTER,
    RTM_GETTFILTER,
    RTM_NEWTFILTER,
    TCA_KIND,
    TCA_OPTIONS,
    TCMSG,
    filter_info,
    tcmsg,
)

FLOWER = "flower"
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
IPPROTO = {"tcp": 6, "udp": 17, "sctp": 132, "icmpv6": 58}

# linux/pkt_cls.h
TCA_FLOWER_ACT, TCA_FLOWER_KEY_ETH_TYPE, TCA_FLOWER_KEY_IP_PROTO = 3, 8, 9
TCA_FLOWER_KEY_IPV4_SRC, TCA_FLOWER_KEY_IPV4_SRC_MASK = 10, 11
TCA_FLOWER_KEY_IPV4_DST, TCA_FLOWER_KEY_IPV4_DST_MASK = 12, 13
TCA_FLOWER_KEY_IPV6_SRC, TCA_FLOWER_KEY_IPV6_SRC_MASK = 14, 15
TCA_FLOWER_KEY_IPV6_DST, TCA_FLOWER_KEY_IPV6_DST_MASK = 16, 17
TCA_FLOWER_FLAGS = 22
TCA_FLOWER_KEY_ICMPV6_TYPE, TCA_FLOWER_KEY_ICMPV6_TYPE_MASK = 55, 56
TCA_FLOWER_KEY_PORT_DST_MIN, TCA_FLOWER_KEY_PORT_DST_MAX = 89, 90
TCA_FLOWER_KEY_CT_STATE, TCA_FLOWER_KEY_CT_STATE_MASK = 91, 92
TCA_FLOWER_KEY_CT_MARK, TCA_FLOWER_KEY_CT_MARK_MASK = 95, 96
TCA_CLS_FLAGS_SKIP_HW = 1
CT_NEW, CT_ESTABLISHED, CT_RELATED, CT_TRACKED, CT_INVALID = 1, 2, 4, 8, 16
_PORT_KEYS = {"tcp": (19, 36), "udp": (21, 38), "sctp": (42, 40)}  # (DST, DST_MASK)

# linux/pkt_cls.h (actions), linux/tc_act/tc_ct.h, tc_gact.h
TCA_ACT_KIND, TCA_ACT_OPTIONS = 1, 2
TCA_CT_PARMS, TCA_CT_ACTION, TCA_CT_ZONE, TCA_CT_MARK, TCA_CT_MARK_MASK = 1, 3, 4, 5, 6
TCA_CT_ACT_COMMIT = 1
TCA_GACT_PARMS = 2
TC_ACT_UNSPEC, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_PIPE = -1, 0, 2, 3
_TC_GEN = struct.Struct("=IIiii")  # index, capab, action, refcnt, bindcnt (tc_ct, tc_gact)
_U16 = struct.Struct("=H")
_BE16 = struct.Struct("!H")


@dataclass(frozen=True, order=True)
class ConnTrack:
    """An `act_ct` action: look the packet up in `zone` (and with `commit`, confirm it, its
    connection mark set to `mark` under `mark_mask`), then go on to the next filter."""

    zone: int
    commit: bool = False
    mark: int = 0
    mark_mask: int = 0


@dataclass(frozen=True, order=True)
class FlowerFilter:
    """One flower filter: where it sits, what it matches, what it does.

    `verdict` is "continue" (the next filter decides), "ok" (pass, no later filter runs) or
    "drop"; `conntrack` runs first when given."""

    hook: int
    priority: int
    protocol: int  # ETH_P_IP / ETH_P_IPV6
    verdict: str = "continue"
    conntrack: ConnTrack | None = None
    ct_state: tuple[int, int] | None = None  # (flags, mask)
    ct_mark: tuple[int, int] | None = None  # (mark, mask)
    src: str | None = None  # a network, e.g. "10.0.0.0/24"
    dst: str | None = None
    ip_proto: str | None = None  # tcp, udp, sctp, icmpv6
    ports: tuple[int, int] | None = None  # destination port range
    icmpv6_type: int | None = None

    @property
    def handle(self) -> int:
        """A handle naming exactly this filter (never 0)."""
        digest = hashlib.sha256(repr(self).encode()).digest()
        return int.from_bytes(digest[:4], "big") or 1


# Messages (pure) ----------------------------------------------------------------------------

def filter_request(ifindex: int, flt: FlowerFilter) -> bytes:
    """RTM_NEWTFILTER body of one flower filter with its actions."""
    return tcmsg(ifindex, flt.handle, flt.hook, filter_info(flt.priority, flt.protocol)) + \
        attr_str(TCA_KIND, FLOWER) + nested(TCA_OPTIONS, *_keys(flt), _actions(flt),
                                            attr_u32(TCA_FLOWER_FLAGS, TCA_CLS_FLAGS_SKIP_HW))


def delete_request(ifindex: int, hook: int, priority: int, protocol: int,
                   handle: int) -> bytes:
    """RTM_DELTFILTER body naming one flower filter."""
    return tcmsg(ifindex, handle, hook, filter_info(priority, protocol)) + \
        attr_str(TCA_KIND, FLOWER)


def _keys(flt: FlowerFilter) -> list[bytes]:
    keys = [attr(TCA_FLOWER_KEY_ETH_TYPE, _BE16.pack(flt.protocol))]
    if flt.ip_proto is not None:
        keys.append(attr(TCA_FLOWER_KEY_IP_PROTO, bytes([IPPROTO[flt.ip_proto]])))
    for network, (v4, v4_mask, v6, v6_mask) in (
            (flt.src, (TCA_FLOWER_KEY_IPV4_SRC, TCA_FLOWER_KEY_IPV4_SRC_MASK,
                       TCA_FLOWER_KEY_IPV6_SRC, TCA_FLOWER_KEY_IPV6_SRC_MASK)),
            (flt.dst, (TCA_FLOWER_KEY_IPV4_DST, TCA_FLOWER_KEY_IPV4_DST_MASK,
                       TCA_FLOWER_KEY_IPV6_DST, TCA_FLOWER_KEY_IPV6_DST_MASK))):
        if network is None:
            continue
        net = ipaddress.ip_network(network)
        key, mask = (v4, v4_mask) if net.version == 4 else (v6, v6_mask)
        keys += [attr(key, net.network_address.packed), attr(mask, net.netmask.packed)]
    if flt.ports is not None:
        assert flt.ip_proto in _PORT_KEYS, "ports need tcp, udp or sctp"
        first, last = flt.ports
        if first == last:
            port_key, mask_key = _PORT_KEYS[flt.ip_proto]
            keys += [attr(port_key, _BE16.pack(first)), attr(mask_key, _BE16.pack(0xFFFF))]
        else:
            keys += [attr(TCA_FLOWER_KEY_PORT_DST_MIN, _BE16.pack(first)),
                     attr(TCA_FLOWER_KEY_PORT_DST_MAX, _BE16.pack(last))]
    if flt.icmpv6_type is not None:
        keys += [attr(TCA_FLOWER_KEY_ICMPV6_TYPE, bytes([flt.icmpv6_type])),
                 attr(TCA_FLOWER_KEY_ICMPV6_TYPE_MASK, b"\xff")]
    if flt.ct_state is not None:
        keys += [attr(TCA_FLOWER_KEY_CT_STATE, _U16.pack(flt.ct_state[0])),
                 attr(TCA_FLOWER_KEY_CT_STATE_MASK, _U16.pack(flt.ct_state[1]))]
    if flt.ct_mark is not None:
        keys += [attr_u32(TCA_FLOWER_KEY_CT_MARK, flt.ct_mark[0]),
                 attr_u32(TCA_FLOWER_KEY_CT_MARK_MASK, flt.ct_mark[1])]
    return keys


def _actions(flt: FlowerFilter) -> bytes:
    verdicts = {"continue": TC_ACT_UNSPEC, "ok": TC_ACT_OK, "drop": TC_ACT_SHOT}
    actions: list[bytes] = []
    if flt.conntrack is not None:
        ct = flt.conntrack
        # With a verdict after it, ct pipes on to it; alone, its own verdict is the filter's.
        then = TC_ACT_PIPE if flt.verdict != "continue" else TC_ACT_UNSPEC
        options = [attr(TCA_CT_PARMS, _TC_GEN.pack(0, 0, then, 0, 0)),
                   attr(TCA_CT_ZONE, _U16.pack(ct.zone))]
        if ct.commit:
            options.append(attr(TCA_CT_ACTION, _U16.pack(TCA_CT_ACT_COMMIT)))
            if ct.mark_mask:
                options += [attr_u32(TCA_CT_MARK, ct.mark), attr_u32(TCA_CT_MARK_MASK,
                                                                     ct.mark_mask)]
        # act_ct parses its options strictly (nla_parse_nested): the nest must say it is one,
        # or the kernel refuses the filter with EINVAL "NLA_F_NESTED is missing" (gact does not).
        actions.append(nested(len(actions) + 1, attr_str(TCA_ACT_KIND, "ct"),
                              nested(TCA_ACT_OPTIONS | NLA_F_NESTED, *options)))
    if flt.conntrack is None or flt.verdict != "continue":
        actions.append(nested(len(actions) + 1, attr_str(TCA_ACT_KIND, "gact"), nested(
            TCA_ACT_OPTIONS, attr(TCA_GACT_PARMS, _TC_GEN.pack(
                0, 0, verdicts[flt.verdict], 0, 0)))))
    return nested(TCA_FLOWER_ACT, *actions)


def decode_handle(payload: bytes) -> tuple[int, int, int] | None:
    """(priority, protocol, handle) of a flower filter in a dump; None for anything else (a
    dump also lists each priority's classifier itself, handle 0)."""
    _, _, handle, _, info = TCMSG.unpack_from(payload)
    kind = as_str(parse_attrs(payload, TCMSG.size).get(TCA_KIND, b""))
    if kind != FLOWER or handle == 0:
        return None
    return info >> 16, socket.ntohs(info & 0xFFFF), handle


# Requests -----------------------------------------------------------------------------------

def dump_handles(rtnl: Rtnl, ifindex: int, hook: int) -> set[tuple[int, int, int]]:
    """(priority, protocol, handle) of every flower filter on a clsact hook of the link."""
    try:
        replies = rtnl.dump(RTM_GETTFILTER, tcmsg(ifindex, parent=hook))
    except NetlinkError as exc:
        if exc.code in (errno.EINVAL, errno.ENOENT, errno.ENODEV):  # no clsact (yet)
            return set()
        raise
    found = (decode_handle(msg.payload) for msg in replies if msg.type == RTM_NEWTFILTER)
    return {entry for entry in found if entry is not None}


def add_filters(rtnl: Rtnl, ifindex: int, filters: Sequence[FlowerFilter]) -> None:
    """Add filters (their handles new on the link) in one netlink batch."""
    rtnl.requests([(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL, filter_request(ifindex, flt))
                   for flt in filters])


def delete_filters(rtnl: Rtnl, ifindex: int,
                   handles: Iterable[tuple[int, int, int, int]]) -> None:
    """Delete filters by (hook, priority, protocol, handle) in one netlink batch; one already
    gone is no error."""
    rtnl.requests([(RTM_DELTFILTER, 0, delete_request(ifindex, hook, priority, protocol, handle))
                   for hook, priority, protocol, handle in handles], ignore=(errno.ENOENT,))
