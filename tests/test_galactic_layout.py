"""galactic's map rows as vpc-attach encodes them: keys are what galactic's `usid_ingress`
computes from a packet to the SID vpc-attach publishes, values round-trip, and every layout is
the size of `usid.c`'s structs."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core import naming
from cni_plugin.galactic import layout

NATIVE_U64 = struct.Struct("=Q")
locators = st.integers(min_value=0, max_value=(1 << 48) - 1).map(
    lambda block: str(ipaddress.IPv6Network((block << 80, 48))))
node_ids = st.integers(min_value=layout.NODE_ID_MIN, max_value=254)
vrf_ids = st.integers(min_value=layout.ARGUMENT_MIN, max_value=layout.ARGUMENT_MAX)


@given(locators, node_ids, vrf_ids)
def test_keys_are_what_usid_ingress_reads_from_the_published_sid(locator: str, node_id: int,
                                                                 vrf_id: int) -> None:
    sid = ipaddress.IPv6Address(naming.srv6_sid(locator, node_id, vrf_id)).packed
    block = layout.block_of(locator)
    # usid.c: locator_key = read_be64(daddr[0..8]); function = daddr[8] >> 4;
    # argument = (daddr[8] & 0xF) << 8 | daddr[9]; keys are native u64s.
    (locator_key,) = NATIVE_U64.unpack(layout.locator_key(block, node_id))
    assert locator_key == int.from_bytes(sid[:8], "big")
    assert locator_key >> 16 == block
    (function_key,) = NATIVE_U64.unpack(layout.function_key(block))
    assert function_key == (block << 4) | (sid[8] >> 4)
    argument = ((sid[8] & 0x0F) << 8) | sid[9]
    (vrf_key,) = NATIVE_U64.unpack(layout.vrf_key(block, argument))
    assert vrf_key == (block << 12) | argument
    assert layout.decode_vrf_key(layout.vrf_key(block, argument)) == (block, vrf_id)


def test_locator_key_of_the_documented_example() -> None:
    # 2001:db8:ff01::/48, node 1 (SPEC §6's SID example): Block 0x20010db8ff01, key
    # 0x20010db8ff010001 in the host's byte order.
    block = layout.block_of("2001:db8:ff01::/48")
    assert block == 0x20010DB8FF01
    assert layout.locator_key(block, 1) == NATIVE_U64.pack(0x20010DB8FF010001)


def test_sizes_are_those_of_usid_c() -> None:
    sizes = {m.name: (m.key_size, m.value_size) for m in layout.MAPS}
    assert sizes == {
        "locator_table": (8, 8),  # __u64 -> struct locator_value {__u64}
        "function_table": (8, 4),  # __u64 -> struct function_value {__u32}
        "vrf_table": (8, 48),  # __u64 -> struct vrf_value {__u32 x2, __u64 x5}
        "ifindex_vrf_table": (4, 16),  # __u32 -> struct ifindex_vrf_value {__u64, __u16} padded
        "egress_route_table": (25, 32),  # packed {__u32, __u32, __u8, __u8[16]} -> packed
        "node_src_addr_table": (4, 16),
        "public_uplink_table": (4, 16),  # {__u32, __u8[6], __u8[6]}
    }


@given(st.integers(min_value=1, max_value=2**32 - 1),
       st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
       st.integers(min_value=0, max_value=128))
def test_route_key_round_trips(table: int, address: ipaddress.IPv4Address | ipaddress.IPv6Address,
                               length: int) -> None:
    prefix = ipaddress.ip_network((address, min(length, address.max_prefixlen)), strict=False)
    key = layout.route_key(table, prefix)
    assert len(key) == layout.EGRESS_ROUTE_TABLE.key_size
    bits, = struct.unpack_from("=I", key)
    assert bits == 40 + prefix.prefixlen  # table_id and family always match in full
    assert key[8] == (1 if prefix.version == 4 else 0)
    assert layout.decode_route_key(key) == (table, prefix)


@given(st.builds(layout.VrfRow, *(st.integers(min_value=0, max_value=2**32 - 1),) * 2,
                 *(st.integers(min_value=0, max_value=2**64 - 1),) * 5))
def test_vrf_row_round_trips(row: layout.VrfRow) -> None:
    assert layout.VrfRow.decode(row.encode()) == row


@given(st.ip_addresses(v=6), st.integers(min_value=0, max_value=2**32 - 1),
       st.binary(min_size=6, max_size=6), st.binary(min_size=6, max_size=6))
def test_egress_route_round_trips(sid: ipaddress.IPv6Address, ifindex: int, dmac: bytes,
                                  smac: bytes) -> None:
    route = layout.EgressRoute(str(sid), ifindex, dmac.hex(":"), smac.hex(":"))
    assert len(route.encode()) == layout.EGRESS_ROUTE_TABLE.value_size
    assert layout.EgressRoute.decode(route.encode()) == route


def test_pass_through_is_link_index_zero() -> None:
    assert layout.EgressRoute.decode(layout.PASS_THROUGH).link_ifindex == 0


@given(st.integers(min_value=0, max_value=(1 << 48) - 1), vrf_ids)
def test_ifindex_value_round_trips(block: int, argument: int) -> None:
    value = layout.ifindex_value(block, argument)
    assert len(value) == 16 and value[10:] == bytes(6)  # the struct's tail padding is zero
    assert layout.decode_ifindex_value(value) == (block, argument)


@pytest.mark.parametrize("node_id", [0, 0xE000])
def test_node_ids_galactic_refuses_are_refused(node_id: int) -> None:
    with pytest.raises(ValueError, match="node ID"):
        layout.locator_key(1, node_id)


@pytest.mark.parametrize("argument", [0, 0x1000])
def test_arguments_galactic_refuses_are_refused(argument: int) -> None:
    with pytest.raises(ValueError, match="VRF ID"):
        layout.vrf_key(1, argument)
