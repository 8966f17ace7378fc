"""A small rtnetlink client on the standard library: links, addresses, routes, neighbours, rules.

Not pyroute2: its import would dominate an in-process ADD (docs/architecture.md). One blocking
socket per netns; each request waits for its ACK (or NLMSG_DONE), every read under a timeout.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from cni_plugin.core.deadline import Deadline

NETLINK_ROUTE = 0
NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
NETLINK_GET_STRICT_CHK = 12

NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE, NLMSG_OVERRUN = 1, 2, 3, 4
NLM_F_REQUEST = 0x01
NLM_F_ACK = 0x04
NLM_F_DUMP_INTR = 0x10
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_DUMP = 0x300
NLM_F_CAPPED = 0x100  # on NLMSG_ERROR: the request is echoed as its header only
NLM_F_ACK_TLVS = 0x200  # on NLMSG_ERROR: extended ACK attributes follow
NLMSGERR_ATTR_MSG = 1

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWNEIGH, RTM_GETNEIGH = 28, 30
RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE = 32, 33, 34

IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MASTER = 1, 3, 4, 10
IFLA_LINKINFO, IFLA_IFALIAS, IFLA_GROUP, IFLA_NET_NS_FD, IFLA_EXT_MASK = 18, 20, 27, 28, 29
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFLA_VRF_TABLE = 1
RTEXT_FILTER_SKIP_STATS = 1 << 3
IFF_UP = 0x1

IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE = 1, 4, 5, 6, 15
RTA_ENCAP_TYPE, RTA_ENCAP = 21, 22
LWTUNNEL_ENCAP_SEG6_LOCAL = 7
SEG6_LOCAL_ACTION, SEG6_LOCAL_VRFTABLE = 1, 9
SEG6_LOCAL_ACTION_END_DT46 = 16
RTN_UNICAST, RTN_UNREACHABLE = 1, 7
RTNH_F_ONLINK = 0x04
RTPROT_STATIC = 4
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_NOWHERE = 0, 253, 255
RT_TABLE_COMPAT = 252
NDA_DST, NDA_LLADDR, NDA_IFINDEX = 1, 2, 8
NUD_PERMANENT = 0x80
FRA_IIFNAME, FRA_PRIORITY, FRA_FWMARK, FRA_TABLE, FRA_FWMASK = 3, 6, 10, 15, 16
FR_ACT_TO_TBL = 1

NLA_F_NESTED = 1 << 15
NLA_TYPE_MASK = ~(NLA_F_NESTED | 1 << 14) & 0xFFFF  # without NESTED / NET_BYTEORDER

DEFAULT_TIMEOUT = 10.0
RECV_BUFFER = 1 << 16  # the kernel sends dumps in parts of at most 32 KiB
DUMP_ATTEMPTS = 4
REQUESTS_PER_SEND = 128  # a batch of requests per datagram, well inside the socket buffer

# Headers and integer attributes are host byte order; IP addresses network order.
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLATTR = struct.Struct("=HH")  # len, type
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst/src len, tos, table, proto, scope, type, flags
_NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
_FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")  # family, dst/src len, tos, table, res, action, flags
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
T = TypeVar("T")


class NetlinkError(Exception):
    """The kernel refused a request (or did not answer): a positive errno and a message."""

    def __init__(self, code: int, message: str | None = None) -> None:
        message = message or os.strerror(code)
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


# Attributes ---------------------------------------------------------------------------------

def align(length: int) -> int:
    """NLA_ALIGN / NLMSG_ALIGN: round up to a multiple of 4."""
    return (length + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute: header, payload, zero padding to the 4-byte boundary."""
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + bytes(align(length) - length)


def attr_u32(kind: int, value: int) -> bytes:
    """A u32 attribute (host byte order)."""
    return attr(kind, _U32.pack(value))


def attr_str(kind: int, text: str, nul: bool = True) -> bytes:
    """A string attribute, NUL-terminated unless nul is False."""
    return attr(kind, text.encode() + (b"\0" if nul else b""))


def nested(kind: int, *children: bytes) -> bytes:
    """An attribute holding other attributes."""
    return attr(kind, b"".join(children))


def iter_attrs(data: bytes, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute in data[offset:]; ValueError when truncated."""
    end = len(data)
    while offset + _NLATTR.size <= end:
        length, kind = _NLATTR.unpack_from(data, offset)
        if length < _NLATTR.size or offset + length > end:
            raise ValueError(f"malformed netlink attribute at offset {offset}")
        yield kind & NLA_TYPE_MASK, data[offset + _NLATTR.size:offset + length]
        offset += align(length)
    if offset < end and any(data[offset:]):
        raise ValueError(f"trailing bytes after netlink attributes at offset {offset}")


def parse_attrs(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """Attributes by type (the last one wins when a type repeats)."""
    return dict(iter_attrs(data, offset))


def as_str(payload: bytes) -> str:
    """A string attribute (up to its first NUL)."""
    return payload.split(b"\0", 1)[0].decode(errors="replace")


def as_u32(payload: bytes) -> int:
    """A u32 attribute."""
    return int(_U32.unpack_from(payload)[0])


def as_mac(payload: bytes) -> str:
    """A link-layer address as lower-case aa:bb:... ."""
    return ":".join(f"{b:02x}" for b in payload)


def as_ip(payload: bytes) -> str:
    """An IP address attribute (network byte order, 4 or 16 bytes) as `ipaddress` spells it.

    Callers compare it with str(ip_address(...)); inet_ntop spells some IPv6 forms otherwise.
    """
    return str(ipaddress.ip_address(payload))


def optional(attrs: dict[int, bytes], key: int, convert: Callable[[bytes], T]) -> T | None:
    """convert(attrs[key]), or None when the attribute is absent."""
    value = attrs.get(key)
    return None if value is None else convert(value)


def mac_bytes(mac: str) -> bytes:
    """aa:bb:cc:dd:ee:ff -> 6 bytes; ValueError when malformed."""
    return bytes(int(octet, 16) for octet in mac.split(":"))


def family_of(version: int) -> int:
    """AF_INET / AF_INET6 of an IP version."""
    return socket.AF_INET if version == 4 else socket.AF_INET6


# Messages -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Message:
    """One netlink message: header fields and the payload after the header."""

    type: int
    flags: int
    seq: int
    payload: bytes


def pack_message(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    """nlmsghdr + body (the port id 0 lets the kernel fill in ours)."""
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body


def iter_messages(data: bytes) -> Iterator[Message]:
    """The messages of one datagram; ValueError when truncated."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, msg_type, flags, seq, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            raise ValueError(f"malformed netlink message at offset {offset}")
        yield Message(msg_type, flags, seq, data[offset + _NLMSGHDR.size:offset + length])
        offset += align(length)


def error_of(msg: Message) -> NetlinkError | None:
    """The error an NLMSG_ERROR carries (None for an ACK), with the extended ACK text."""
    if len(msg.payload) < _I32.size:
        return NetlinkError(errno.EBADMSG, "truncated netlink error message")
    code = -_I32.unpack_from(msg.payload)[0]
    if code == 0:
        return None
    tlvs_at = _I32.size
    if len(msg.payload) >= _I32.size + _NLMSGHDR.size:  # skip the echoed request
        tlvs_at += _NLMSGHDR.size if msg.flags & NLM_F_CAPPED else \
            align(_NLMSGHDR.unpack_from(msg.payload, _I32.size)[0])
    return _error_with_ext_ack(code, msg, tlvs_at)


def done_error_of(msg: Message) -> NetlinkError | None:
    """The error that ended a dump (NLMSG_DONE with a negative status), if any."""
    status = _I32.unpack_from(msg.payload)[0] if len(msg.payload) >= _I32.size else 0
    return _error_with_ext_ack(-status, msg, _I32.size) if status < 0 else None


def _error_with_ext_ack(code: int, msg: Message, tlvs_at: int) -> NetlinkError:
    text = os.strerror(code)
    if msg.flags & NLM_F_ACK_TLVS:
        try:
            tlvs = parse_attrs(msg.payload, tlvs_at)
        except ValueError:
            tlvs = {}
        if NLMSGERR_ATTR_MSG in tlvs:
            text = f"{text}: {as_str(tlvs[NLMSGERR_ATTR_MSG])}"
    return NetlinkError(code, text)


# What we read back --------------------------------------------------------------------------

@dataclass(frozen=True)
class LinkMsg:
    """A link (RTM_NEWLINK reply)."""

    index: int
    flags: int
    name: str
    kind: str
    mac: str
    mtu: int
    alias: str | None
    master: int | None
    vrf_table: int | None
    group: int = 0

    @property
    def up(self) -> bool:
        """IFF_UP is set."""
        return bool(self.flags & IFF_UP)


@dataclass(frozen=True)
class AddrMsg:
    """An address (RTM_NEWADDR reply)."""

    family: int
    prefixlen: int
    scope: int
    index: int
    address: str | None  # IFA_ADDRESS (the peer on point-to-point links)
    local: str | None  # IFA_LOCAL


@dataclass(frozen=True)
class RouteMsg:
    """A route (RTM_NEWROUTE reply)."""

    family: int
    dst_len: int
    table: int
    type: int
    scope: int
    flags: int
    dst: str | None
    gateway: str | None
    oif: int | None
    priority: int | None
    encap_type: int | None = None  # a lightweight tunnel (e.g. seg6local) and its attributes
    encap: bytes | None = None


@dataclass(frozen=True)
class NeighMsg:
    """A neighbour entry (RTM_NEWNEIGH reply)."""

    family: int
    ifindex: int
    state: int
    dst: str | None
    lladdr: str | None


@dataclass(frozen=True)
class RuleMsg:
    """A policy rule (RTM_NEWRULE reply)."""

    family: int
    table: int
    priority: int | None
    action: int
    iifname: str | None
    fwmark: int | None = None
    fwmask: int | None = None


def decode_link(payload: bytes) -> LinkMsg:
    """ifinfomsg + attributes."""
    _, _, index, flags, _ = _IFINFOMSG.unpack_from(payload)
    attrs = parse_attrs(payload, _IFINFOMSG.size)
    kind = ""
    vrf_table = None
    if IFLA_LINKINFO in attrs:
        info = parse_attrs(attrs[IFLA_LINKINFO])
        kind = as_str(info.get(IFLA_INFO_KIND, b""))
        if kind == "vrf" and IFLA_INFO_DATA in info:
            vrf_table = optional(parse_attrs(info[IFLA_INFO_DATA]), IFLA_VRF_TABLE, as_u32)
    return LinkMsg(
        index=index, flags=flags, name=as_str(attrs.get(IFLA_IFNAME, b"")), kind=kind,
        mac=as_mac(attrs.get(IFLA_ADDRESS, b"")),
        mtu=as_u32(attrs[IFLA_MTU]) if IFLA_MTU in attrs else 0,
        alias=optional(attrs, IFLA_IFALIAS, as_str),
        master=optional(attrs, IFLA_MASTER, as_u32),
        vrf_table=vrf_table, group=optional(attrs, IFLA_GROUP, as_u32) or 0)


def decode_addr(payload: bytes) -> AddrMsg:
    """ifaddrmsg + attributes."""
    family, prefixlen, _, scope, index = _IFADDRMSG.unpack_from(payload)
    attrs = parse_attrs(payload, _IFADDRMSG.size)
    return AddrMsg(
        family=family, prefixlen=prefixlen, scope=scope, index=index,
        address=optional(attrs, IFA_ADDRESS, as_ip),
        local=optional(attrs, IFA_LOCAL, as_ip))


def decode_route(payload: bytes) -> RouteMsg:
    """rtmsg + attributes; the table is RTA_TABLE (rtm_table only holds 8 bits)."""
    family, dst_len, _, _, table, _, scope, rtype, flags = _RTMSG.unpack_from(payload)
    attrs = parse_attrs(payload, _RTMSG.size)
    return RouteMsg(
        family=family, dst_len=dst_len,
        table=as_u32(attrs[RTA_TABLE]) if RTA_TABLE in attrs else table,
        type=rtype, scope=scope, flags=flags,
        dst=optional(attrs, RTA_DST, as_ip),
        gateway=optional(attrs, RTA_GATEWAY, as_ip),
        oif=optional(attrs, RTA_OIF, as_u32),
        priority=optional(attrs, RTA_PRIORITY, as_u32),
        encap_type=optional(attrs, RTA_ENCAP_TYPE, lambda b: int.from_bytes(b[:2], "little")),
        encap=attrs.get(RTA_ENCAP))


def decode_neigh(payload: bytes) -> NeighMsg:
    """ndmsg + attributes."""
    family, ifindex, state, _, _ = _NDMSG.unpack_from(payload)
    attrs = parse_attrs(payload, _NDMSG.size)
    return NeighMsg(
        family=family, ifindex=ifindex, state=state,
        dst=optional(attrs, NDA_DST, as_ip),
        lladdr=optional(attrs, NDA_LLADDR, as_mac))


def decode_rule(payload: bytes) -> RuleMsg:
    """fib_rule_hdr + attributes; the table is FRA_TABLE when present."""
    family, _, _, _, table, _, _, action, _ = _FIB_RULE_HDR.unpack_from(payload)
    attrs = parse_attrs(payload, _FIB_RULE_HDR.size)
    return RuleMsg(
        family=family, table=as_u32(attrs[FRA_TABLE]) if FRA_TABLE in attrs else table,
        priority=optional(attrs, FRA_PRIORITY, as_u32),
        action=action,
        iifname=optional(attrs, FRA_IIFNAME, as_str),
        fwmark=optional(attrs, FRA_FWMARK, as_u32),
        fwmask=optional(attrs, FRA_FWMASK, as_u32))


def decoded(decode: Callable[[bytes], T], payload: bytes) -> T:
    """decode(payload); a malformed reply is a NetlinkError like any other kernel failure."""
    try:
        return decode(payload)
    except (ValueError, struct.error) as exc:
        raise NetlinkError(errno.EBADMSG, f"malformed netlink reply: {exc}") from None


# Requests (pure: the message bodies) --------------------------------------------------------

def ifinfomsg(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    """The link header (family AF_UNSPEC)."""
    return _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, flags, change)


def veth_request(name: str, peer_name: str, peer_netns_fd: int, mtu: int | None) -> bytes:
    """RTM_NEWLINK body: veth `name` here, its peer created directly in another netns."""
    mtu_attr = attr_u32(IFLA_MTU, mtu) if mtu is not None else b""
    peer = ifinfomsg() + attr_str(IFLA_IFNAME, peer_name) + \
        attr_u32(IFLA_NET_NS_FD, peer_netns_fd) + mtu_attr
    return ifinfomsg() + attr_str(IFLA_IFNAME, name) + mtu_attr + nested(
        IFLA_LINKINFO, attr_str(IFLA_INFO_KIND, "veth"),
        nested(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer)))


def vrf_request(name: str, table: int) -> bytes:
    """RTM_NEWLINK body: a VRF device bound to table."""
    return ifinfomsg() + attr_str(IFLA_IFNAME, name) + nested(
        IFLA_LINKINFO, attr_str(IFLA_INFO_KIND, "vrf"),
        nested(IFLA_INFO_DATA, attr_u32(IFLA_VRF_TABLE, table)))


def set_link_request(index: int, *, name: str | None = None, mtu: int | None = None,
                     alias: str | None = None, master: int | None = None,
                     mac: str | None = None, up: bool | None = None,
                     group: int | None = None) -> bytes:
    """RTM_NEWLINK body changing an existing link; the kernel renames before setting IFF_UP."""
    flags = IFF_UP if up else 0
    body = ifinfomsg(index, flags, IFF_UP if up is not None else 0)
    if name is not None:
        body += attr_str(IFLA_IFNAME, name)
    if mtu is not None:
        body += attr_u32(IFLA_MTU, mtu)
    if alias is not None:
        body += attr_str(IFLA_IFALIAS, alias, nul=False)  # the kernel keeps exactly these bytes
    if master is not None:
        body += attr_u32(IFLA_MASTER, master)
    if mac is not None:
        body += attr(IFLA_ADDRESS, mac_bytes(mac))
    if group is not None:
        body += attr_u32(IFLA_GROUP, group)
    return body


def link_lookup(*, index: int = 0, name: str | None = None) -> bytes:
    """RTM_GETLINK / RTM_DELLINK body naming a link by index or by name."""
    body = ifinfomsg(index)
    if name is not None:
        body += attr_str(IFLA_IFNAME, name)
    return body + attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)


def addr_request(index: int, address: IPInterface, flags: int) -> bytes:
    """RTM_NEWADDR body; IFA_FLAGS carries the flags above the 8 bits of ifa_flags."""
    family = family_of(address.version)
    packed = address.ip.packed
    body = _IFADDRMSG.pack(family, address.network.prefixlen, flags & 0xFF, RT_SCOPE_UNIVERSE,
                           index) + attr(IFA_LOCAL, packed) + attr(IFA_ADDRESS, packed)
    if flags:
        body += attr_u32(IFA_FLAGS, flags)
    return body


def route_request(dst: IPNetwork, *, table: int, oif: int | None = None,
                  gateway: IPAddr | None = None, onlink: bool = False,
                  scope: int = RT_SCOPE_UNIVERSE, rtype: int = RTN_UNICAST,
                  priority: int | None = None, encap: tuple[int, bytes] | None = None) -> bytes:
    """RTM_NEWROUTE body (protocol static); ``encap`` is (lwtunnel type, its attributes)."""
    header = _RTMSG.pack(family_of(dst.version), dst.prefixlen, 0, 0,
                         table if table < 256 else RT_TABLE_COMPAT, RTPROT_STATIC, scope, rtype,
                         RTNH_F_ONLINK if onlink else 0)
    body = header + attr(RTA_DST, dst.network_address.packed) + attr_u32(RTA_TABLE, table)
    if oif is not None:
        body += attr_u32(RTA_OIF, oif)
    if gateway is not None:
        body += attr(RTA_GATEWAY, gateway.packed)
    if priority is not None:
        body += attr_u32(RTA_PRIORITY, priority)
    if encap is not None:
        body += attr(RTA_ENCAP_TYPE, struct.pack("=H", encap[0])) + nested(RTA_ENCAP, encap[1])
    return body


def seg6local_end_dt46(vrf_table: int) -> tuple[int, bytes]:
    """The encap of a seg6local End.DT46 route: decapsulate into the VRF of ``vrf_table``."""
    return LWTUNNEL_ENCAP_SEG6_LOCAL, (attr_u32(SEG6_LOCAL_ACTION, SEG6_LOCAL_ACTION_END_DT46)
                                       + attr_u32(SEG6_LOCAL_VRFTABLE, vrf_table))



def neigh_request(index: int, ip: IPAddr, mac: str, state: int = NUD_PERMANENT) -> bytes:
    """RTM_NEWNEIGH body: ip -> mac on link index."""
    return _NDMSG.pack(family_of(ip.version), index, state, 0, 0) + \
        attr(NDA_DST, ip.packed) + attr(NDA_LLADDR, mac_bytes(mac))


def rule_request(family: int, iifname: str | None, table: int, priority: int,
                 fwmark: int | None = None, fwmask: int | None = None) -> bytes:
    """RTM_NEWRULE / RTM_DELRULE body: `[iif iifname] [fwmark fwmark/fwmask] lookup table`."""
    header = _FIB_RULE_HDR.pack(family, 0, 0, 0, table if table < 256 else RT_TABLE_COMPAT,
                                0, 0, FR_ACT_TO_TBL, 0)
    body = header + (attr_str(FRA_IIFNAME, iifname) if iifname is not None else b"")
    if fwmark is not None:
        body += attr_u32(FRA_FWMARK, fwmark) + attr_u32(FRA_FWMASK, fwmask or 0xFFFFFFFF)
    return body + attr_u32(FRA_TABLE, table) + attr_u32(FRA_PRIORITY, priority)


def route_delete_request(route: RouteMsg) -> bytes:
    """RTM_DELROUTE body naming a route as a dump returned it (table, type, dst, oif, metric)."""
    header = _RTMSG.pack(route.family, route.dst_len, 0, 0,
                         route.table if route.table < 256 else RT_TABLE_COMPAT, 0,
                         RT_SCOPE_NOWHERE, route.type, 0)  # NOWHERE: any scope matches
    body = header + attr_u32(RTA_TABLE, route.table)
    if route.dst is not None:
        body += attr(RTA_DST, ipaddress.ip_address(route.dst).packed)
    if route.oif is not None:
        body += attr_u32(RTA_OIF, route.oif)
    if route.priority is not None:
        body += attr_u32(RTA_PRIORITY, route.priority)
    return body


def route_dump_request(family: int, table: int | None, oif: int | None) -> bytes:
    """RTM_GETROUTE dump body; with strict checking the kernel filters by table and oif."""
    body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
    if table is not None:
        body += attr_u32(RTA_TABLE, table)
    if oif is not None:
        body += attr_u32(RTA_OIF, oif)
    return body


# What each dump answers with.
_REPLY_TYPES = {RTM_GETLINK: RTM_NEWLINK, RTM_GETADDR: RTM_NEWADDR, RTM_GETROUTE: RTM_NEWROUTE,
                RTM_GETNEIGH: RTM_NEWNEIGH, RTM_GETRULE: RTM_NEWRULE}


# The socket ---------------------------------------------------------------------------------

class Rtnl:
    """An rtnetlink socket in the netns of the thread that created it."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, deadline: Deadline | None = None,
                 protocol: int = NETLINK_ROUTE) -> None:
        self.timeout = timeout
        self.deadline = deadline  # when given, no wait outlasts it
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        try:
            self._sock.bind((0, 0))
            for option in (NETLINK_EXT_ACK, NETLINK_CAP_ACK, NETLINK_GET_STRICT_CHK):
                # An older kernel lacks some: plain errors, unfiltered dumps (filtered here too).
                with suppress(OSError):
                    self._sock.setsockopt(SOL_NETLINK, option, 1)
            self._sock.settimeout(timeout)
        except BaseException:
            self._sock.close()
            raise
        self._seq = 0

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _wait(self) -> float:
        """Seconds the next send or read may wait (set on the socket)."""
        wait = self.timeout
        if self.deadline is not None:
            wait = min(wait, self.deadline.remaining())
        self._sock.settimeout(wait)
        return wait

    def _send(self, msg_type: int, flags: int, body: bytes) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        wait = self._wait()
        try:
            self._sock.send(pack_message(msg_type, flags | NLM_F_REQUEST | NLM_F_ACK, self._seq,
                                         body))
        except TimeoutError:
            raise NetlinkError(errno.ETIMEDOUT,
                               f"the kernel took no request within {wait:g}s") from None
        return self._seq

    def _receive(self) -> bytes:
        wait = self._wait()
        try:
            data, _, msg_flags, _ = self._sock.recvmsg(RECV_BUFFER)
        except TimeoutError:
            raise NetlinkError(errno.ETIMEDOUT,
                               f"no answer from the kernel within {wait:g}s") from None
        if msg_flags & socket.MSG_TRUNC:
            raise NetlinkError(errno.EMSGSIZE, "netlink reply larger than the receive buffer")
        return data

    def _messages(self) -> list[Message]:
        data = self._receive()
        try:
            return list(iter_messages(data))
        except ValueError as exc:
            raise NetlinkError(errno.EBADMSG, f"malformed netlink reply: {exc}") from None

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[Message]:
        """Send one request and wait for its ACK; the replies before the ACK (a GET's answer)."""
        seq = self._send(msg_type, flags, body)
        replies: list[Message] = []
        while True:
            for msg in self._messages():
                if msg.seq != seq:
                    continue  # a late answer to an earlier request that timed out
                if msg.type == NLMSG_ERROR:
                    error = error_of(msg)
                    if error is not None:
                        raise error
                    return replies
                if msg.type not in (NLMSG_NOOP, NLMSG_DONE, NLMSG_OVERRUN):
                    replies.append(msg)

    def batch(self, begin: int, end: int, header: bytes, msg_type: int, flags: int,
              body: bytes) -> None:
        """nfnetlink: one message in its own transaction (begin … end in one datagram); waits
        for its ACK."""
        self._seq = (self._seq + 3) & 0xFFFFFFFF
        seq = self._seq - 1
        datagram = pack_message(begin, NLM_F_REQUEST, seq - 1, header) + \
            pack_message(msg_type, flags | NLM_F_REQUEST | NLM_F_ACK, seq, body) + \
            pack_message(end, NLM_F_REQUEST, seq + 1, header)
        wait = self._wait()
        try:
            self._sock.send(datagram)
        except TimeoutError:
            raise NetlinkError(errno.ETIMEDOUT,
                               f"the kernel took no request within {wait:g}s") from None
        while True:
            for msg in self._messages():
                if msg.seq == seq and msg.type == NLMSG_ERROR:
                    error = error_of(msg)
                    if error is not None:
                        raise error
                    return

    def requests(self, messages: Sequence[tuple[int, int, bytes]],
                 ignore: tuple[int, ...] = ()) -> None:
        """Many (type, flags, body) requests, up to REQUESTS_PER_SEND in one datagram, each
        acknowledged; the first error whose errno is not in `ignore` is raised once every
        answer of its datagram has come."""
        for start in range(0, len(messages), REQUESTS_PER_SEND):
            chunk = messages[start:start + REQUESTS_PER_SEND]
            first = (self._seq + 1) & 0xFFFFFFFF
            datagram = b""
            for offset, (msg_type, flags, body) in enumerate(chunk):
                datagram += pack_message(msg_type, flags | NLM_F_REQUEST | NLM_F_ACK,
                                         (first + offset) & 0xFFFFFFFF, body)
            self._seq = (first + len(chunk) - 1) & 0xFFFFFFFF
            wait = self._wait()
            try:
                self._sock.send(datagram)
            except TimeoutError:
                raise NetlinkError(errno.ETIMEDOUT,
                                   f"the kernel took no request within {wait:g}s") from None
            pending = {(first + offset) & 0xFFFFFFFF for offset in range(len(chunk))}
            failure: NetlinkError | None = None
            while pending:
                for msg in self._messages():
                    if msg.type != NLMSG_ERROR or msg.seq not in pending:
                        continue
                    pending.discard(msg.seq)
                    error = error_of(msg)
                    if error is not None and error.code not in ignore and failure is None:
                        failure = error
            if failure is not None:
                raise failure

    def dump(self, msg_type: int, body: bytes, consistent: bool = False) -> list[Message]:
        """Every object a dump returns; read again while the kernel flags it inconsistent.

        After DUMP_ATTEMPTS the last answer is used, as iproute2 does; unless the caller needs
        a consistent one (it decides an allocation): then EAGAIN.
        """
        for _ in range(DUMP_ATTEMPTS - 1):
            replies, interrupted = self._dump_once(msg_type, body)
            if not interrupted:
                return replies
        replies, interrupted = self._dump_once(msg_type, body)
        if interrupted and consistent:
            raise NetlinkError(errno.EAGAIN, f"the kernel's answer kept changing over "
                               f"{DUMP_ATTEMPTS} reads")
        return replies

    def _dump_once(self, msg_type: int, body: bytes) -> tuple[list[Message], bool]:
        seq = self._send(msg_type, NLM_F_DUMP, body)
        replies: list[Message] = []
        interrupted = False
        while True:
            for msg in self._messages():
                if msg.seq != seq:
                    continue
                interrupted = interrupted or bool(msg.flags & NLM_F_DUMP_INTR)
                if msg.type == NLMSG_DONE:
                    error = done_error_of(msg)
                    if error is not None:
                        raise error
                    return replies, interrupted
                if msg.type == NLMSG_ERROR:
                    error = error_of(msg)
                    if error is not None:
                        raise error
                    continue
                if msg.type not in (NLMSG_NOOP, NLMSG_OVERRUN):
                    replies.append(msg)

    def _decoded(self, decode: Callable[[bytes], T], msg_type: int, body: bytes,
                 filtered: bool = False, consistent: bool = False) -> list[T]:
        """A dump decoded; a kernel-side filter naming a missing link or table means none."""
        try:
            replies = self.dump(msg_type, body, consistent)
        except NetlinkError as exc:
            if filtered and exc.code in (errno.ENODEV, errno.ENOENT):
                return []
            raise
        reply_type = _REPLY_TYPES[msg_type]
        return [decoded(decode, msg.payload) for msg in replies if msg.type == reply_type]

    # Links

    def get_link(self, *, index: int = 0, name: str | None = None) -> LinkMsg:
        """One link by index or name; NetlinkError ENODEV when there is none."""
        replies = self.request(RTM_GETLINK, link_lookup(index=index, name=name))
        if not replies:
            raise NetlinkError(errno.ENODEV)
        return decoded(decode_link, replies[0].payload)

    def links(self, consistent: bool = False) -> list[LinkMsg]:
        """Every link of the netns (consistent: see `dump`)."""
        return self._decoded(decode_link, RTM_GETLINK,
                             ifinfomsg() + attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS),
                             consistent=consistent)

    def new_veth(self, name: str, peer_name: str, peer_netns_fd: int, mtu: int | None) -> None:
        """Create veth name here with its peer peer_name in the netns of peer_netns_fd."""
        self.request(RTM_NEWLINK, veth_request(name, peer_name, peer_netns_fd, mtu),
                     NLM_F_CREATE | NLM_F_EXCL)

    def new_vrf(self, name: str, table: int) -> None:
        """Create VRF device name bound to table."""
        self.request(RTM_NEWLINK, vrf_request(name, table), NLM_F_CREATE | NLM_F_EXCL)

    def set_link(self, index: int, *, name: str | None = None, mtu: int | None = None,
                 alias: str | None = None, master: int | None = None, mac: str | None = None,
                 up: bool | None = None, group: int | None = None) -> None:
        """Change name / MTU / alias / master / MAC / IFF_UP / group of link index in one
        request."""
        self.request(RTM_NEWLINK, set_link_request(index, name=name, mtu=mtu, alias=alias,
                                                   master=master, mac=mac, up=up, group=group))

    def del_link(self, *, index: int = 0, name: str | None = None) -> None:
        """Delete a link by index or name."""
        self.request(RTM_DELLINK, link_lookup(index=index, name=name))

    # Addresses, routes, neighbours, rules

    def new_addr(self, index: int, address: IPInterface, flags: int = 0) -> None:
        """Add address to link index; EEXIST when it is there already."""
        self.request(RTM_NEWADDR, addr_request(index, address, flags), NLM_F_CREATE | NLM_F_EXCL)

    def addrs(self, family: int = socket.AF_UNSPEC, index: int = 0) -> list[AddrMsg]:
        """Addresses of the netns (of link index when given)."""
        found = self._decoded(decode_addr, RTM_GETADDR,
                              _IFADDRMSG.pack(family, 0, 0, 0, index), filtered=bool(index))
        return [a for a in found if not index or a.index == index]

    def replace_route(self, dst: IPNetwork, *, table: int, oif: int | None = None,
                      gateway: IPAddr | None = None, onlink: bool = False,
                      scope: int = RT_SCOPE_UNIVERSE, rtype: int = RTN_UNICAST,
                      priority: int | None = None,
                      encap: tuple[int, bytes] | None = None) -> None:
        """Create or replace a route."""
        self.request(RTM_NEWROUTE, route_request(dst, table=table, oif=oif, gateway=gateway,
                                                 onlink=onlink, scope=scope, rtype=rtype,
                                                 priority=priority, encap=encap),
                     NLM_F_CREATE | NLM_F_REPLACE)

    def routes(self, family: int, table: int | None = None,
               oif: int | None = None) -> list[RouteMsg]:
        """Routes of one family (in table / through oif when given)."""
        found = self._decoded(decode_route, RTM_GETROUTE, route_dump_request(family, table, oif),
                              filtered=table is not None or oif is not None)
        return [r for r in found
                if (table is None or r.table == table) and (oif is None or r.oif == oif)]

    def route_get(self, dst: IPAddr) -> RouteMsg:
        """The route the kernel would take to dst (`ip route get`; NetlinkError when none)."""
        body = _RTMSG.pack(family_of(dst.version), dst.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + \
            attr(RTA_DST, dst.packed)
        replies = self.request(RTM_GETROUTE, body)
        routes = [decode_route(msg.payload) for msg in replies if msg.type == RTM_NEWROUTE]
        if not routes:
            raise NetlinkError(errno.ENETUNREACH, f"no route to {dst}")
        return routes[0]

    def replace_neigh(self, index: int, ip: IPAddr, mac: str,
                      state: int = NUD_PERMANENT) -> None:
        """Create or replace the neighbour entry ip -> mac on link index."""
        self.request(RTM_NEWNEIGH, neigh_request(index, ip, mac, state),
                     NLM_F_CREATE | NLM_F_REPLACE)

    def neighbours(self, index: int = 0) -> list[NeighMsg]:
        """IPv4 and IPv6 neighbour entries (on link index when given)."""
        body = _NDMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        if index:
            body += attr_u32(NDA_IFINDEX, index)
        found = self._decoded(decode_neigh, RTM_GETNEIGH, body, filtered=bool(index))
        return [n for n in found if n.family in (socket.AF_INET, socket.AF_INET6)
                and (not index or n.ifindex == index)]

    def new_rule(self, family: int, iifname: str | None, table: int, priority: int,
                 fwmark: int | None = None, fwmask: int | None = None) -> None:
        """Add `[iif iifname] [fwmark m/mask] lookup table` at priority; EEXIST when the same
        rule exists."""
        self.request(RTM_NEWRULE, rule_request(family, iifname, table, priority, fwmark, fwmask),
                     NLM_F_CREATE | NLM_F_EXCL)

    def del_rule(self, family: int, iifname: str | None, table: int, priority: int,
                 fwmark: int | None = None, fwmask: int | None = None) -> None:
        """Delete the rule `new_rule` with the same arguments added; ENOENT when there is none."""
        self.request(RTM_DELRULE, rule_request(family, iifname, table, priority, fwmark, fwmask))

    def del_route(self, route: RouteMsg) -> None:
        """Delete a route as a dump returned it; ESRCH when it is gone."""
        self.request(RTM_DELROUTE, route_delete_request(route))

    def rules(self, family: int, consistent: bool = False) -> list[RuleMsg]:
        """Policy rules of one family (consistent: see `dump`)."""
        return self._decoded(decode_rule, RTM_GETRULE,
                             _FIB_RULE_HDR.pack(family, 0, 0, 0, 0, 0, 0, 0, 0),
                             consistent=consistent)
