"""The rtnetlink client's wire format: attributes, messages, requests, replies, the reply loop.

Encoders and decoders are pure; the few socket tests use a real NETLINK_ROUTE socket in this
process's own netns (no root needed) and read only the loopback link.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import struct
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import rtnl
from cni_plugin.kernel.links import kernel_errors
from cni_plugin.kernel.rtnl import (
    IFF_UP,
    IFLA_ADDRESS,
    IFLA_IFALIAS,
    IFLA_IFNAME,
    IFLA_INFO_DATA,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_NET_NS_FD,
    IFLA_VRF_TABLE,
    NLM_F_ACK_TLVS,
    NLM_F_CAPPED,
    NLM_F_DUMP_INTR,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSGERR_ATTR_MSG,
    RTM_NEWLINK,
    VETH_INFO_PEER,
    Message,
    NetlinkError,
    Rtnl,
    align,
    attr,
    attr_str,
    attr_u32,
    iter_attrs,
    iter_messages,
    nested,
    pack_message,
    parse_attrs,
)
from netconf.errors import KERNEL_FAILURE, TRY_AGAIN_LATER, CniError

IFINFOMSG = struct.Struct("=BxHiII")
RTMSG = struct.Struct("=BBBBBBBBI")

attr_types = st.integers(min_value=0, max_value=0x3FFF)
payloads = st.binary(max_size=70)
attr_lists = st.lists(st.tuples(attr_types, payloads), max_size=12)
link_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_",
                     min_size=1, max_size=15)
u32s = st.integers(min_value=0, max_value=2**32 - 1)
macs = st.binary(min_size=6, max_size=6)
ipv4s = st.builds(ipaddress.IPv4Address, st.integers(min_value=0, max_value=2**32 - 1))
ipv6s = st.builds(ipaddress.IPv6Address, st.integers(min_value=0, max_value=2**128 - 1))
ips = st.one_of(ipv4s, ipv6s)
networks = st.one_of(
    st.builds(lambda ip, n: ipaddress.ip_network(f"{ip}/{n}", strict=False), ipv4s,
              st.integers(min_value=0, max_value=32)),
    st.builds(lambda ip, n: ipaddress.ip_network(f"{ip}/{n}", strict=False), ipv6s,
              st.integers(min_value=0, max_value=128)))


def _family(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> int:
    return socket.AF_INET if ip.version == 4 else socket.AF_INET6


def _mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


# Attributes ---------------------------------------------------------------------------------

@given(attr_lists)
def test_attributes_round_trip_in_order(pairs: list[tuple[int, bytes]]) -> None:
    encoded = b"".join(attr(kind, payload) for kind, payload in pairs)
    assert list(iter_attrs(encoded)) == pairs


@given(attr_types, payloads)
def test_attributes_are_padded_to_four_bytes_and_their_length_excludes_the_padding(
        kind: int, payload: bytes) -> None:
    encoded = attr(kind, payload)
    assert len(encoded) == align(4 + len(payload)) and len(encoded) % 4 == 0
    length, encoded_kind = struct.unpack_from("=HH", encoded)
    assert (length, encoded_kind) == (4 + len(payload), kind)
    assert encoded[length:] == bytes(len(encoded) - length)


@given(attr_lists, attr_lists)
def test_nested_attributes_round_trip(outer: list[tuple[int, bytes]],
                                      inner: list[tuple[int, bytes]]) -> None:
    inner_bytes = [attr(kind, payload) for kind, payload in inner]
    encoded = b"".join(attr(k, p) for k, p in outer) + nested(7, *inner_bytes)
    decoded = list(iter_attrs(encoded))
    assert decoded[:-1] == outer
    assert decoded[-1][0] == 7 and list(iter_attrs(decoded[-1][1])) == inner


def test_nested_and_byte_order_flags_are_not_part_of_the_type() -> None:
    encoded = attr(IFLA_LINKINFO | 0x8000, attr_str(IFLA_INFO_KIND, "veth"))
    assert parse_attrs(encoded) == {IFLA_LINKINFO: attr_str(IFLA_INFO_KIND, "veth")}


@given(st.binary(max_size=200))
def test_malformed_attribute_bytes_raise_value_error_only(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        list(iter_attrs(data))


@given(attr_lists)
def test_a_truncated_attribute_is_refused(pairs: list[tuple[int, bytes]]) -> None:
    encoded = b"".join(attr(kind, payload) for kind, payload in pairs) + attr(1, b"abcdefgh")
    with pytest.raises(ValueError):
        list(iter_attrs(encoded[:-6]))


@given(u32s)
def test_integers_are_host_byte_order_and_addresses_network_byte_order(value: int) -> None:
    assert attr_u32(1, value)[4:] == value.to_bytes(4, sys.byteorder)
    assert rtnl.as_u32(attr_u32(1, value)[4:]) == value
    ip = ipaddress.IPv4Address(value)
    assert rtnl.as_ip(ip.packed) == str(ip)
    assert ip.packed == value.to_bytes(4, "big")


@given(link_names)
def test_strings_are_nul_terminated_unless_asked_and_decode_up_to_the_nul(name: str) -> None:
    assert attr_str(1, name)[4:4 + len(name) + 1] == name.encode() + b"\0"
    assert rtnl.as_str(parse_attrs(attr_str(1, name))[1]) == name
    assert parse_attrs(attr_str(1, name, nul=False))[1] == name.encode()


@given(macs)
def test_mac_addresses_round_trip(raw: bytes) -> None:
    assert rtnl.mac_bytes(rtnl.as_mac(raw)) == raw
    assert rtnl.as_mac(raw) == _mac_text(raw)


# Messages -----------------------------------------------------------------------------------

messages = st.lists(st.tuples(st.integers(min_value=0, max_value=0xFFFF),
                              st.integers(min_value=0, max_value=0xFFFF), u32s, payloads),
                    max_size=8)


@given(messages)
def test_messages_of_one_datagram_round_trip(specs: list[tuple[int, int, int, bytes]]) -> None:
    # The kernel pads each message to 4 bytes within a datagram.
    datagram = b""
    for msg_type, flags, seq, body in specs:
        packed = pack_message(msg_type, flags, seq, body)
        datagram += packed + bytes(align(len(packed)) - len(packed))
    assert list(iter_messages(datagram)) == [Message(t, f, s, b) for t, f, s, b in specs]


@given(st.binary(max_size=120))
def test_malformed_datagrams_raise_value_error_only(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        list(iter_messages(data))


def _error_message(code: int, request: bytes, flags: int, tlvs: bytes = b"") -> Message:
    echoed = request[:16] if flags & NLM_F_CAPPED else request
    return Message(NLMSG_ERROR, flags, 1, struct.pack("=i", -code) + echoed + tlvs)


def test_an_ack_is_not_an_error() -> None:
    request = pack_message(RTM_NEWLINK, 5, 1, b"x" * 20)
    assert rtnl.error_of(_error_message(0, request, NLM_F_CAPPED)) is None


@pytest.mark.parametrize("capped", [True, False])
def test_errors_carry_errno_and_the_extended_ack_text(capped: bool) -> None:
    request = pack_message(RTM_NEWLINK, 5, 1, b"y" * 22)
    request += bytes(align(len(request)) - len(request))
    flags = NLM_F_ACK_TLVS | (NLM_F_CAPPED if capped else 0)
    tlvs = attr_str(NLMSGERR_ATTR_MSG, "Unknown device type")
    error = rtnl.error_of(_error_message(errno.EOPNOTSUPP, request, flags, tlvs))
    assert error is not None and error.code == errno.EOPNOTSUPP
    assert str(error) == "Operation not supported: Unknown device type"
    assert error.args == (errno.EOPNOTSUPP, str(error))


def test_an_error_without_extended_ack_is_the_strerror() -> None:
    error = rtnl.error_of(_error_message(errno.ENODEV, pack_message(18, 5, 1, b""), 0))
    assert error is not None and (error.code, error.message) == (errno.ENODEV, "No such device")


def test_a_dump_ended_by_an_error_reports_it() -> None:
    tlvs = attr_str(NLMSGERR_ATTR_MSG, "Invalid values in header")
    done = Message(NLMSG_DONE, NLM_F_ACK_TLVS, 3, struct.pack("=i", -errno.EINVAL) + tlvs)
    error = rtnl.done_error_of(done)
    assert error is not None and error.code == errno.EINVAL
    assert error.message == "Invalid argument: Invalid values in header"
    assert rtnl.done_error_of(Message(NLMSG_DONE, 0, 3, struct.pack("=i", 0))) is None


# Replies ------------------------------------------------------------------------------------

@given(index=st.integers(min_value=1, max_value=2**31 - 1), flags=u32s, name=link_names,
       mtu=u32s, mac=macs, alias=st.none() | st.text(min_size=1, max_size=60).filter(
           lambda a: "\0" not in a),
       master=st.none() | u32s, vrf_table=st.none() | u32s)
def test_link_replies_decode(index: int, flags: int, name: str, mtu: int, mac: bytes,
                             alias: str | None, master: int | None,
                             vrf_table: int | None) -> None:
    kind = "vrf" if vrf_table is not None else "veth"
    info = [attr_str(IFLA_INFO_KIND, kind)]
    if vrf_table is not None:
        info.append(nested(IFLA_INFO_DATA | 0x8000, attr_u32(IFLA_VRF_TABLE, vrf_table)))
    payload = IFINFOMSG.pack(0, 1, index, flags, 0) + attr_str(IFLA_IFNAME, name) + \
        attr(IFLA_ADDRESS, mac) + attr_u32(IFLA_MTU, mtu) + \
        (attr_str(IFLA_IFALIAS, alias) if alias is not None else b"") + \
        (attr_u32(IFLA_MASTER, master) if master is not None else b"") + \
        nested(IFLA_LINKINFO, *info) + attr(99, b"\x01\x02\x03")
    link = rtnl.decode_link(payload)
    assert link == rtnl.LinkMsg(index=index, flags=flags, name=name, kind=kind,
                                mac=_mac_text(mac), mtu=mtu, alias=alias, master=master,
                                vrf_table=vrf_table)
    assert link.up == bool(flags & IFF_UP)


@given(ips, st.integers(min_value=0, max_value=128), st.integers(min_value=0, max_value=255),
       st.integers(min_value=1, max_value=2**31))
def test_address_replies_decode(ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
                                prefixlen: int, scope: int, index: int) -> None:
    payload = struct.pack("=BBBBI", _family(ip), prefixlen, 0x80, scope, index) + \
        attr(rtnl.IFA_ADDRESS, ip.packed) + attr(rtnl.IFA_LOCAL, ip.packed) + \
        attr_u32(rtnl.IFA_FLAGS, 0x280)
    assert rtnl.decode_addr(payload) == rtnl.AddrMsg(
        family=_family(ip), prefixlen=prefixlen, scope=scope, index=index, address=str(ip),
        local=str(ip))


@given(networks, st.none() | u32s, st.none() | u32s, u32s)
def test_route_replies_decode_with_the_32_bit_table(
        dst: ipaddress.IPv4Network | ipaddress.IPv6Network, oif: int | None,
        priority: int | None, table: int) -> None:
    family = _family(dst.network_address)
    gateway = dst.network_address
    payload = RTMSG.pack(family, dst.prefixlen, 0, 0, min(table, 252), 4, 0, 1, 4) + \
        attr_u32(rtnl.RTA_TABLE, table) + attr(rtnl.RTA_DST, dst.network_address.packed) + \
        attr(rtnl.RTA_GATEWAY, gateway.packed) + \
        (attr_u32(rtnl.RTA_OIF, oif) if oif is not None else b"") + \
        (attr_u32(rtnl.RTA_PRIORITY, priority) if priority is not None else b"")
    assert rtnl.decode_route(payload) == rtnl.RouteMsg(
        family=family, dst_len=dst.prefixlen, table=table, type=1, scope=0, flags=4,
        dst=str(dst.network_address), gateway=str(gateway), oif=oif, priority=priority)


def test_a_route_without_rta_table_keeps_rtm_table() -> None:
    payload = RTMSG.pack(socket.AF_INET, 0, 0, 0, 254, 4, 0, 1, 0)
    route = rtnl.decode_route(payload)
    assert (route.table, route.dst, route.gateway, route.oif) == (254, None, None, None)


@given(ips, macs, st.integers(min_value=1, max_value=2**31 - 1),
       st.integers(min_value=0, max_value=0xFFFF))
def test_neighbour_replies_decode(ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
                                  mac: bytes, index: int, state: int) -> None:
    payload = struct.pack("=BxxxiHBB", _family(ip), index, state, 0, 1) + \
        attr(rtnl.NDA_DST, ip.packed) + attr(rtnl.NDA_LLADDR, mac)
    assert rtnl.decode_neigh(payload) == rtnl.NeighMsg(
        family=_family(ip), ifindex=index, state=state, dst=str(ip), lladdr=_mac_text(mac))


@given(st.sampled_from([socket.AF_INET, socket.AF_INET6]), link_names, u32s,
       st.none() | u32s)
def test_rule_replies_decode(family: int, iif: str, table: int, priority: int | None) -> None:
    payload = struct.pack("=BBBBBBBBI", family, 0, 0, 0, min(table, 252), 0, 0, 1, 0) + \
        attr_str(rtnl.FRA_IIFNAME, iif) + attr_u32(rtnl.FRA_TABLE, table) + \
        (attr_u32(rtnl.FRA_PRIORITY, priority) if priority is not None else b"")
    assert rtnl.decode_rule(payload) == rtnl.RuleMsg(
        family=family, table=table, priority=priority, action=1, iifname=iif)


@pytest.mark.parametrize("decode", [rtnl.decode_link, rtnl.decode_addr, rtnl.decode_route,
                                    rtnl.decode_neigh, rtnl.decode_rule])
@given(payload=st.binary(max_size=40))
def test_malformed_replies_are_netlink_errors(decode: Any, payload: bytes) -> None:
    try:
        rtnl.decoded(decode, payload)
    except NetlinkError as exc:
        assert exc.code == errno.EBADMSG


# Requests -----------------------------------------------------------------------------------

@given(link_names, link_names, st.integers(min_value=0, max_value=2**31 - 1),
       st.none() | st.integers(min_value=68, max_value=65535))
def test_veth_request_creates_the_peer_in_the_given_netns(name: str, peer: str, fd: int,
                                                          mtu: int | None) -> None:
    body = rtnl.veth_request(name, peer, fd, mtu)
    attrs = parse_attrs(body, IFINFOMSG.size)
    assert rtnl.as_str(attrs[IFLA_IFNAME]) == name
    assert (rtnl.as_u32(attrs[IFLA_MTU]) if IFLA_MTU in attrs else None) == mtu
    info = parse_attrs(attrs[IFLA_LINKINFO])
    assert info[IFLA_INFO_KIND] == b"veth\0"
    peer_msg = parse_attrs(info[IFLA_INFO_DATA])[VETH_INFO_PEER]
    assert IFINFOMSG.unpack_from(peer_msg) == (socket.AF_UNSPEC, 0, 0, 0, 0)
    peer_attrs = parse_attrs(peer_msg, IFINFOMSG.size)
    assert rtnl.as_str(peer_attrs[IFLA_IFNAME]) == peer
    assert rtnl.as_u32(peer_attrs[IFLA_NET_NS_FD]) == fd
    assert (rtnl.as_u32(peer_attrs[IFLA_MTU]) if IFLA_MTU in peer_attrs else None) == mtu


@given(link_names, u32s)
def test_vrf_request_names_its_table(name: str, table: int) -> None:
    attrs = parse_attrs(rtnl.vrf_request(name, table), IFINFOMSG.size)
    info = parse_attrs(attrs[IFLA_LINKINFO])
    assert rtnl.as_str(info[IFLA_INFO_KIND]) == "vrf"
    assert rtnl.as_u32(parse_attrs(info[IFLA_INFO_DATA])[IFLA_VRF_TABLE]) == table


@given(index=st.integers(min_value=1, max_value=2**31 - 1), name=st.none() | link_names,
       mtu=st.none() | u32s, alias=st.none() | st.text(max_size=40).filter(
           lambda a: "\0" not in a),
       master=st.none() | u32s, mac=st.none() | macs, up=st.none() | st.booleans())
def test_set_link_request_sends_exactly_the_changes(
        index: int, name: str | None, mtu: int | None, alias: str | None, master: int | None,
        mac: bytes | None, up: bool | None) -> None:
    body = rtnl.set_link_request(index, name=name, mtu=mtu, alias=alias, master=master,
                                 mac=_mac_text(mac) if mac is not None else None, up=up)
    _, _, got_index, flags, change = IFINFOMSG.unpack_from(body)
    assert got_index == index
    assert (flags, change) == {None: (0, 0), True: (IFF_UP, IFF_UP), False: (0, IFF_UP)}[up]
    attrs = parse_attrs(body, IFINFOMSG.size)
    expected: dict[int, Any] = {IFLA_IFNAME: name, IFLA_MTU: mtu, IFLA_MASTER: master,
                                IFLA_ADDRESS: mac,
                                IFLA_IFALIAS: alias.encode() if alias is not None else None}
    decoded: dict[int, Any] = {
        IFLA_IFNAME: rtnl.as_str(attrs[IFLA_IFNAME]) if IFLA_IFNAME in attrs else None,
        IFLA_MTU: rtnl.as_u32(attrs[IFLA_MTU]) if IFLA_MTU in attrs else None,
        IFLA_MASTER: rtnl.as_u32(attrs[IFLA_MASTER]) if IFLA_MASTER in attrs else None,
        IFLA_ADDRESS: attrs.get(IFLA_ADDRESS),
        IFLA_IFALIAS: attrs.get(IFLA_IFALIAS),  # the alias goes without a NUL
    }
    assert decoded == expected
    assert set(attrs) == {k for k, v in expected.items() if v is not None}


@given(st.integers(min_value=1, max_value=2**31 - 1), ips,
       st.integers(min_value=0, max_value=128), st.sampled_from([0, 0x02, 0x200, 0x202]))
def test_address_request_carries_flags_beyond_eight_bits_in_ifa_flags(
        index: int, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, prefixlen: int,
        flags: int) -> None:
    interface = ipaddress.ip_interface(f"{ip}/{min(prefixlen, ip.max_prefixlen)}")
    body = rtnl.addr_request(index, interface, flags)
    family, got_prefixlen, low_flags, scope, got_index = struct.unpack_from("=BBBBI", body)
    assert (family, got_prefixlen, low_flags, scope, got_index) == (
        _family(ip), interface.network.prefixlen, flags & 0xFF, 0, index)
    attrs = parse_attrs(body, 8)
    assert attrs[rtnl.IFA_LOCAL] == attrs[rtnl.IFA_ADDRESS] == ip.packed
    assert (rtnl.as_u32(attrs[rtnl.IFA_FLAGS]) if rtnl.IFA_FLAGS in attrs else 0) == flags


@given(networks, u32s, st.none() | st.integers(min_value=1, max_value=2**31 - 1), st.booleans(),
       st.none() | u32s)
def test_route_request_puts_large_tables_in_rta_table(
        dst: ipaddress.IPv4Network | ipaddress.IPv6Network, table: int, oif: int | None,
        with_gateway: bool, priority: int | None) -> None:
    gateway = dst.network_address if with_gateway else None
    body = rtnl.route_request(dst, table=table, oif=oif, gateway=gateway, onlink=with_gateway,
                              priority=priority)
    family, dst_len, _, _, rtm_table, proto, scope, rtype, flags = RTMSG.unpack_from(body)
    assert (family, dst_len, proto, scope, rtype) == (
        _family(dst.network_address), dst.prefixlen, rtnl.RTPROT_STATIC, 0, rtnl.RTN_UNICAST)
    assert rtm_table == (table if table < 256 else rtnl.RT_TABLE_COMPAT)
    assert flags == (rtnl.RTNH_F_ONLINK if with_gateway else 0)
    attrs = parse_attrs(body, RTMSG.size)
    assert rtnl.as_u32(attrs[rtnl.RTA_TABLE]) == table
    assert attrs[rtnl.RTA_DST] == dst.network_address.packed
    assert attrs.get(rtnl.RTA_GATEWAY) == (gateway.packed if gateway is not None else None)
    assert (rtnl.as_u32(attrs[rtnl.RTA_OIF]) if rtnl.RTA_OIF in attrs else None) == oif
    assert (rtnl.as_u32(attrs[rtnl.RTA_PRIORITY]) if rtnl.RTA_PRIORITY in attrs else None) \
        == priority


@given(st.integers(min_value=1, max_value=2**32 - 1), st.integers(min_value=1, max_value=2**31 - 1),
       st.integers(min_value=0, max_value=2**128 - 1))
def test_an_end_dt46_route_reads_back_as_decapsulating_into_its_vrf_table(
        vrf_table: int, oif: int, sid_bits: int) -> None:
    from cni_plugin.kernel import srv6
    sid = ipaddress.IPv6Network((sid_bits, 128))
    body = rtnl.route_request(sid, table=srv6.MAIN_TABLE, oif=oif,
                              encap=rtnl.seg6local_end_dt46(vrf_table))
    route = rtnl.decode_route(body)  # a reply has the request's layout
    assert (route.dst, route.dst_len, route.oif) == (str(sid.network_address), 128, oif)
    assert route.encap_type == rtnl.LWTUNNEL_ENCAP_SEG6_LOCAL
    assert srv6.decap_table(route) == vrf_table
    plain = rtnl.decode_route(rtnl.route_request(sid, table=srv6.MAIN_TABLE, oif=oif))
    assert srv6.decap_table(plain) is None


@given(st.integers(min_value=1, max_value=2**31 - 1), ips, macs)
def test_neighbour_request_is_permanent(index: int,
                                        ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
                                        mac: bytes) -> None:
    body = rtnl.neigh_request(index, ip, _mac_text(mac))
    assert rtnl.decode_neigh(body) == rtnl.NeighMsg(
        family=_family(ip), ifindex=index, state=rtnl.NUD_PERMANENT, dst=str(ip),
        lladdr=_mac_text(mac))


@given(st.sampled_from([socket.AF_INET, socket.AF_INET6]), link_names, u32s, u32s)
def test_rule_request_looks_up_the_table(family: int, iif: str, table: int,
                                         priority: int) -> None:
    body = rtnl.rule_request(family, iif, table, priority)
    assert body[4] == (table if table < 256 else rtnl.RT_TABLE_COMPAT)
    assert rtnl.decode_rule(body) == rtnl.RuleMsg(
        family=family, table=table, priority=priority, action=rtnl.FR_ACT_TO_TBL, iifname=iif)


# The reply loop, on a real socket of this process's netns ---------------------------------

def test_a_lookup_reads_the_loopback_link() -> None:
    with Rtnl(timeout=5) as nl:
        lo = nl.get_link(name="lo")
        assert (lo.index, lo.name, lo.mac) == (1, "lo", "00:00:00:00:00:00")
        assert nl.get_link(index=lo.index) == lo
        assert lo in nl.links()


def test_a_missing_link_is_enodev() -> None:
    with Rtnl(timeout=5) as nl, pytest.raises(NetlinkError) as raised:
        nl.get_link(name="vpa-no-such0")
    assert raised.value.code == errno.ENODEV


def test_answers_to_earlier_requests_are_skipped() -> None:
    with Rtnl(timeout=5) as nl:
        nl._send(rtnl.RTM_GETLINK, 0, rtnl.link_lookup(index=1))  # never read: stays queued
        nl._send(rtnl.RTM_GETLINK, rtnl.NLM_F_DUMP, rtnl.ifinfomsg())
        assert nl.get_link(name="lo").index == 1


def test_no_answer_within_the_timeout_is_etimedout() -> None:
    with Rtnl(timeout=0.05) as nl, pytest.raises(NetlinkError) as raised:
        nl._receive()  # nothing was asked
    assert raised.value.code == errno.ETIMEDOUT


def test_a_wait_never_outlasts_the_invocations_deadline() -> None:
    with Rtnl(timeout=30, deadline=Deadline(0.05)) as nl, pytest.raises(NetlinkError) as raised:
        nl._receive()  # nothing was asked: waits for what is left of the deadline, not 30 s
    assert raised.value.code == errno.ETIMEDOUT and "0.05s" in raised.value.message


def test_a_reply_larger_than_the_buffer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rtnl, "RECV_BUFFER", 24)
    with Rtnl(timeout=5) as nl, pytest.raises(NetlinkError) as raised:
        nl.links()
    assert raised.value.code == errno.EMSGSIZE


class _ScriptedSocket:
    """Answers each dump with the next scripted flags; for the kernel's rare DUMP_INTR."""

    def __init__(self, dump_flags: list[int]) -> None:
        self.dump_flags = dump_flags
        self.seq = 0

    def send(self, data: bytes) -> int:
        self.seq = struct.unpack_from("=IHHII", data)[3]
        return len(data)

    def recvmsg(self, _: int) -> tuple[bytes, list[Any], int, Any]:
        flags = self.dump_flags.pop(0)
        link = IFINFOMSG.pack(0, 0, 1, 0, 0) + attr_str(IFLA_IFNAME, "lo")
        datagram = pack_message(RTM_NEWLINK, 2 | flags, self.seq, link) + \
            pack_message(NLMSG_DONE, 2 | flags, self.seq, struct.pack("=i", 0))
        return datagram, [], 0, None

    def settimeout(self, _: float) -> None:
        pass

    def close(self) -> None:
        pass


def test_an_interrupted_dump_is_read_again() -> None:
    with Rtnl(timeout=5) as nl:
        nl._sock.close()
        scripted = _ScriptedSocket([NLM_F_DUMP_INTR, 0])
        nl._sock = scripted  # type: ignore[assignment]
        assert [link.name for link in nl.links()] == ["lo"]
        assert scripted.dump_flags == []


def test_a_dump_that_keeps_changing_is_used_as_last_read() -> None:
    with Rtnl(timeout=5) as nl:
        nl._sock.close()
        scripted = _ScriptedSocket([NLM_F_DUMP_INTR] * rtnl.DUMP_ATTEMPTS)
        nl._sock = scripted  # type: ignore[assignment]
        assert [link.name for link in nl.links()] == ["lo"]
        assert scripted.dump_flags == []


def test_a_dump_that_decides_an_allocation_and_keeps_changing_is_eagain() -> None:
    with Rtnl(timeout=5) as nl:
        nl._sock.close()
        nl._sock = _ScriptedSocket([NLM_F_DUMP_INTR] * rtnl.DUMP_ATTEMPTS)  # type: ignore
        with pytest.raises(NetlinkError) as raised:
            nl.links(consistent=True)
        assert raised.value.code == errno.EAGAIN


def test_a_kernel_that_keeps_changing_or_does_not_answer_is_code_11() -> None:
    for code in (errno.EAGAIN, errno.ETIMEDOUT):
        with pytest.raises(CniError) as raised, kernel_errors("list", "links"):
            raise NetlinkError(code)
        assert raised.value.code == TRY_AGAIN_LATER
    with pytest.raises(CniError) as raised, kernel_errors("create", "veth"):
        raise NetlinkError(errno.EPERM)
    assert raised.value.code == KERNEL_FAILURE
