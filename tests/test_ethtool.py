"""ethtool's netlink messages: what FEATURES_SET asks for, how a FEATURES_GET reply reads, and
which features count as segmentation or receive aggregation.

Encoders and decoders are pure; one test reads the loopback link's features over a real
generic netlink socket (a GET needs no root). The writes are proven against `ethtool -k` in
e2e/test_offloads.py.
"""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.kernel import ethtool
from cni_plugin.kernel.ethtool import (
    ETHTOOL_A_BITSET_BIT_NAME,
    ETHTOOL_A_BITSET_BIT_VALUE,
    ETHTOOL_A_BITSET_BITS,
    ETHTOOL_A_BITSET_BITS_BIT,
    ETHTOOL_A_BITSET_NOMASK,
    ETHTOOL_A_FEATURES_ACTIVE,
    ETHTOOL_A_FEATURES_HEADER,
    ETHTOOL_A_FEATURES_HW,
    ETHTOOL_A_FEATURES_WANTED,
    ETHTOOL_A_HEADER_DEV_INDEX,
    ETHTOOL_A_HEADER_FLAGS,
    ETHTOOL_FLAG_OMIT_REPLY,
    ETHTOOL_MSG_FEATURES_SET,
    Ethtool,
    Features,
    nested,
)
from cni_plugin.kernel.rtnl import (
    NLA_F_NESTED,
    as_str,
    as_u32,
    attr,
    attr_str,
    iter_attrs,
    parse_attrs,
)

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=32)


def _bits(wanted: bytes) -> dict[str, bool]:
    """The WANTED bitset of a FEATURES_SET body: {name: on}."""
    bits = {}
    for kind, bit in iter_attrs(parse_attrs(wanted)[ETHTOOL_A_BITSET_BITS]):
        assert kind == ETHTOOL_A_BITSET_BITS_BIT
        fields = parse_attrs(bit)
        bits[as_str(fields[ETHTOOL_A_BITSET_BIT_NAME])] = ETHTOOL_A_BITSET_BIT_VALUE in fields
    return bits


@given(st.dictionaries(NAMES, st.booleans(), min_size=1, max_size=20),
       st.integers(min_value=1, max_value=2**31 - 1))
def test_a_set_request_names_each_feature_with_a_mask_of_only_those(
        wanted: dict[str, bool], ifindex: int) -> None:
    body = ethtool.features_set_request(ifindex, wanted)
    assert body[0] == ETHTOOL_MSG_FEATURES_SET
    attrs = parse_attrs(body, 4)
    head = parse_attrs(attrs[ETHTOOL_A_FEATURES_HEADER])
    assert as_u32(head[ETHTOOL_A_HEADER_DEV_INDEX]) == ifindex
    assert as_u32(head[ETHTOOL_A_HEADER_FLAGS]) == ETHTOOL_FLAG_OMIT_REPLY
    # No NOMASK: the bits listed are the mask, every other feature stays as it is.
    assert ETHTOOL_A_BITSET_NOMASK not in parse_attrs(attrs[ETHTOOL_A_FEATURES_WANTED])
    assert _bits(attrs[ETHTOOL_A_FEATURES_WANTED]) == wanted


def test_every_nested_attribute_is_flagged_nested() -> None:
    # ethtool's policies refuse a nest without NLA_F_NESTED ("NLA_F_NESTED is missing").
    body = ethtool.features_set_request(3, {"tx-tcp-segmentation": False})
    kind = int.from_bytes(body[4 + 2:4 + 4], "little")
    assert kind & NLA_F_NESTED and nested(7, b"")[2:4] == (7 | NLA_F_NESTED).to_bytes(2, "little")


def _reply(hw: set[str], active: set[str]) -> bytes:
    def listed(names: set[str]) -> bytes:
        return attr(ETHTOOL_A_BITSET_NOMASK, b"") + nested(ETHTOOL_A_BITSET_BITS, *(
            nested(ETHTOOL_A_BITSET_BITS_BIT, attr_str(ETHTOOL_A_BITSET_BIT_NAME, name))
            for name in sorted(names)))
    return ethtool.genl_header(ethtool.ETHTOOL_MSG_FEATURES_GET + 1) + \
        nested(ETHTOOL_A_FEATURES_HW, listed(hw)) + nested(ETHTOOL_A_FEATURES_ACTIVE,
                                                           listed(active))


@given(st.sets(NAMES, max_size=20), st.sets(NAMES, max_size=20))
def test_a_reply_without_masks_lists_the_features_that_are_set(hw: set[str],
                                                                active: set[str]) -> None:
    assert ethtool.decode_features(_reply(hw, active)) == Features(frozenset(hw),
                                                                   frozenset(active))


def test_a_bitset_with_a_mask_counts_only_the_bits_whose_value_is_set() -> None:
    bitset = nested(ETHTOOL_A_BITSET_BITS, *(
        nested(ETHTOOL_A_BITSET_BITS_BIT, attr_str(ETHTOOL_A_BITSET_BIT_NAME, name),
               *([attr(ETHTOOL_A_BITSET_BIT_VALUE, b"")] if on else []))
        for name, on in (("rx-gro", True), ("rx-lro", False))))
    assert ethtool.bitset_names(bitset) == (frozenset({"rx-gro", "rx-lro"}),
                                            frozenset({"rx-gro"}))


def test_segmentation_offloads_are_every_device_segmentation_but_the_stacks_own() -> None:
    # As Linux 6.18 names a veth's features (`ethtool -k`).
    veth = {"tx-generic-segmentation", "tx-tcp-segmentation", "tx-tcp6-segmentation",
            "tx-tcp-ecn-segmentation", "tx-tcp-mangleid-segmentation",
            "tx-tcp-accecn-segmentation", "tx-udp-segmentation", "tx-sctp-segmentation",
            "tx-gre-segmentation", "tx-udp_tnl-segmentation", "tx-gso-list", "rx-gro",
            "tx-scatter-gather", "tx-checksum-ip-generic"}
    assert ethtool.segmentation_offloads(veth) == veth - {
        "tx-generic-segmentation", "rx-gro", "tx-scatter-gather", "tx-checksum-ip-generic"}


def test_receive_aggregation_is_gro_hardware_gro_lro_and_fraglist() -> None:
    features = Features(frozenset(), frozenset({"rx-gro", "rx-lro", "rx-checksum",
                                                "rx-gro-hw", "rx-gro-list"}))
    assert ethtool.receive_aggregation_on(features) == {"rx-gro", "rx-lro", "rx-gro-hw",
                                                        "rx-gro-list"}


def test_the_loopback_links_features_read_over_a_real_socket() -> None:
    with Ethtool(timeout=5.0) as reader:
        features = reader.features(socket.if_nametoindex("lo"))
    # Loopback takes packets of any size: its segmentation offloads are on, by name.
    assert "tx-tcp-segmentation" in ethtool.segmentation_offloads_on(features)
    assert "loopback" in features.active and "loopback" not in features.changeable
