"""Deterministic names and encodings (SPEC §5, §6): base62, kernel names, object names, RT, SID."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core import naming
from cni_plugin.core.naming import (
    advertisement_name,
    annotation_cid,
    guest_link_name,
    hex_id,
    host_link_name,
    pad_base62,
    route_target,
    shared_advertisement_name,
    srv6_sid,
    tenant_id,
    vrf_instance_name,
    vrf_name,
)
from netconf.base62 import (
    ATTACHMENT_LIMIT,
    BASE62_ALPHABET,
    VPC_LIMIT,
    decode_base62,
    encode_base62,
)

KERNEL_NAME_MAX = 15
vpc_values = st.integers(min_value=0, max_value=VPC_LIMIT - 1)
attachment_values = st.integers(min_value=0, max_value=ATTACHMENT_LIMIT - 1)
base62_text = st.text(alphabet=BASE62_ALPHABET, min_size=1, max_size=20)


# --- base62 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("9", 9), ("a", 10), ("z", 35), ("A", 36), ("Z", 61), ("10", 62),
    ("G", 42), ("jU", 1234), ("zz", 35 * 62 + 35), ("100", 62 * 62),
])
def test_base62_digits_are_0_9_then_lowercase_then_uppercase(text: str, value: int) -> None:
    assert decode_base62(text) == value
    assert encode_base62(value) == text


@given(st.integers(min_value=0, max_value=2**128))
def test_encode_then_decode_returns_the_value(value: int) -> None:
    assert decode_base62(encode_base62(value)) == value


@given(st.integers(min_value=0, max_value=2**128))
def test_encoding_is_the_shortest_string(value: int) -> None:
    text = encode_base62(value)
    assert text == "0" or not text.startswith("0")
    assert set(text) <= set(BASE62_ALPHABET)


@given(base62_text)
def test_decode_then_encode_strips_only_leading_zeros(text: str) -> None:
    assert encode_base62(decode_base62(text)) == (text.lstrip("0") or "0")


@given(st.integers(min_value=0, max_value=2**64), st.integers(min_value=0, max_value=2**64))
def test_encoding_preserves_order_among_equal_lengths(a: int, b: int) -> None:
    width = max(len(encode_base62(a)), len(encode_base62(b)))
    # Digits sort in value order in the alphabet, so padded strings compare like numbers.
    assert (a < b) == ([BASE62_ALPHABET.index(c) for c in encode_base62(a).rjust(width, "0")]
                       < [BASE62_ALPHABET.index(c) for c in encode_base62(b).rjust(width, "0")])


@pytest.mark.parametrize("text", ["", "-", "1-2", "a b", "é", "1.5", "0_1", "+1", " 1", "1\n"])
def test_decode_rejects_anything_but_base62_digits(text: str) -> None:
    with pytest.raises(ValueError):
        decode_base62(text)


@given(st.text(min_size=1, max_size=12).filter(lambda t: any(c not in BASE62_ALPHABET for c in t)))
def test_decode_rejects_every_string_with_a_foreign_character(text: str) -> None:
    with pytest.raises(ValueError):
        decode_base62(text)


def test_encode_rejects_negative_values() -> None:
    with pytest.raises(ValueError):
        encode_base62(-1)


@pytest.mark.parametrize(("text", "width", "padded"), [
    ("10", 9, "000000010"), ("jU", 9, "0000000jU"), ("G", 3, "00G"), ("10", 3, "010"),
    ("0010", 3, "010"), ("0", 3, "000"), ("zzz", 3, "zzz"),
])
def test_padding_left_fills_the_canonical_string_with_zeros(text: str, width: int,
                                                             padded: str) -> None:
    assert pad_base62(text, width) == padded


def test_padding_refuses_a_value_wider_than_the_field() -> None:
    with pytest.raises(ValueError):
        pad_base62("1000", 3)


@given(base62_text, st.integers(min_value=1, max_value=20))
def test_padded_string_decodes_to_the_same_value(text: str, width: int) -> None:
    value = decode_base62(text)
    if len(encode_base62(value)) > width:
        with pytest.raises(ValueError):
            pad_base62(text, width)
    else:
        padded = pad_base62(text, width)
        assert len(padded) == width
        assert decode_base62(padded) == value


def test_largest_identifiers_fit_their_fields() -> None:
    assert len(encode_base62(VPC_LIMIT - 1)) <= naming.VPC_WIDTH
    assert len(encode_base62(ATTACHMENT_LIMIT - 1)) <= naming.ATTACHMENT_WIDTH


# --- kernel interface names (SPEC §5) ---------------------------------------------------------


@pytest.mark.parametrize(("vpc", "att", "vrf", "host", "guest"), [
    ("10", "10", "G000000010V", "G000000010010H", "G000000010010G"),
    ("jU", "G", "G0000000jUV", "G0000000jU00GH", "G0000000jU00GG"),
])
def test_spec_examples_of_kernel_names(vpc: str, att: str, vrf: str, host: str,
                                       guest: str) -> None:
    assert vrf_name(vpc) == vrf
    assert host_link_name(vpc, att) == host
    assert guest_link_name(vpc, att) == guest


def test_leading_zeros_in_identifiers_give_the_same_names() -> None:
    assert host_link_name("0010", "010") == host_link_name("10", "10")
    assert vrf_name("000000010") == vrf_name("10")


@given(vpc_values, attachment_values)
def test_every_kernel_name_fits_the_15_character_limit(vpc: int, att: int) -> None:
    vpc62, att62 = encode_base62(vpc), encode_base62(att)
    for name in (vrf_name(vpc62), host_link_name(vpc62, att62), guest_link_name(vpc62, att62)):
        assert len(name) <= KERNEL_NAME_MAX
        assert len(name.encode()) <= KERNEL_NAME_MAX
        assert name.isascii() and name.isalnum()


@given(vpc_values, attachment_values)
def test_kernel_names_encode_vpc_and_attachment_recoverably(vpc: int, att: int) -> None:
    vpc62, att62 = encode_base62(vpc), encode_base62(att)
    host = host_link_name(vpc62, att62)
    guest = guest_link_name(vpc62, att62)
    vrf = vrf_name(vpc62)
    assert (host[0], host[-1], guest[-1], vrf[0], vrf[-1]) == ("G", "H", "G", "G", "V")
    assert decode_base62(host[1:10]) == vpc and decode_base62(host[10:13]) == att
    assert host[:-1] == guest[:-1]
    assert decode_base62(vrf[1:10]) == vpc


@given(vpc_values, attachment_values, vpc_values, attachment_values)
def test_distinct_attachments_get_distinct_host_links(v1: int, a1: int, v2: int,
                                                      a2: int) -> None:
    same = (v1, a1) == (v2, a2)
    names_equal = host_link_name(encode_base62(v1), encode_base62(a1)) == \
        host_link_name(encode_base62(v2), encode_base62(a2))
    assert names_equal == same


@given(vpc_values, attachment_values, vpc_values)
def test_a_host_link_is_recognised_as_its_vpcs_only(vpc: int, att: int, other: int) -> None:
    vpc62, att62, other62 = encode_base62(vpc), encode_base62(att), encode_base62(other)
    host = host_link_name(vpc62, att62)
    assert naming.is_host_link_of(host, vpc62)
    assert naming.is_host_link_of(host, other62) == (vpc == other)
    for name in (vrf_name(vpc62), guest_link_name(vpc62, att62), host[:-1], host + "H",
                 "vpz" + host[3:]):
        assert not naming.is_host_link_of(name, vpc62)


# --- Kubernetes object names, route targets (SPEC §6) --------------------------------------------


@pytest.mark.parametrize(("base62", "hexed"), [("10", "3e"), ("jU", "4d2"), ("G", "2a"),
                                               ("0", "0"), ("Z", "3d")])
def test_hex_id_is_lowercase_hex_of_the_value(base62: str, hexed: str) -> None:
    assert hex_id(base62) == hexed


@given(vpc_values)
def test_hex_id_round_trips_through_int(vpc: int) -> None:
    hexed = hex_id(encode_base62(vpc))
    assert hexed == hexed.lower()
    assert int(hexed, 16) == vpc


def test_spec_examples_of_object_names() -> None:
    assert vrf_instance_name("10", "worker-1") == "3e-worker-1"
    assert advertisement_name("10", "10", "worker-1") == "3e-3e-worker-1"
    assert advertisement_name("jU", "G", "worker-1") == "4d2-2a-worker-1"
    assert shared_advertisement_name("10", "10") == "3e-3e"
    assert shared_advertisement_name("jU", "G") == "4d2-2a"
    assert tenant_id("10", "10") == "10-10"


@given(st.integers(0, 2**48 - 1), st.integers(0, 2**16 - 1),
       st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,300}[a-z0-9])?", fullmatch=True))
def test_per_node_advertisement_names_fit_and_stay_apart(vpc: int, att: int, node: str) -> None:
    name = advertisement_name(encode_base62(vpc), encode_base62(att), node)
    shared = shared_advertisement_name(encode_base62(vpc), encode_base62(att))
    assert len(name) <= 253 and name.startswith(shared + "-")
    assert name != advertisement_name(encode_base62(vpc), encode_base62(att), node + "x")


def test_a_long_node_name_is_shortened_with_a_hash() -> None:
    name = advertisement_name("10", "10", "n" * 260)
    assert len(name) == 253 and name.startswith("3e-3e-nnn")
    assert name != advertisement_name("10", "10", "n" * 261)


def test_tenant_id_keeps_the_raw_base62_strings() -> None:
    assert tenant_id("jU", "G") == "jU-G"


@pytest.mark.parametrize(("vpc", "target"), [("10", "65000:62"), ("jU", "65000:1234")])
def test_spec_examples_of_route_targets(vpc: str, target: str) -> None:
    assert route_target(65000, vpc) == target


@given(vpc_values, st.integers(min_value=1, max_value=2**32 - 1))
def test_route_target_is_asn_and_the_low_32_bits_of_the_vpc(vpc: int, asn: int) -> None:
    left, right = route_target(asn, encode_base62(vpc)).split(":")
    assert int(left) == asn
    assert int(right) == vpc & 0xFFFFFFFF
    # The CRD accepts up to 10 digits a side (SPEC §6).
    assert len(left) <= 10 and len(right) <= 10


def test_route_target_of_a_vpc_above_32_bits_uses_only_the_low_bits() -> None:
    assert route_target(65000, encode_base62(2**32 + 7)) == "65000:7"
    assert route_target(65000, encode_base62(VPC_LIMIT - 1)) == "65000:4294967295"


def test_annotation_container_id_is_the_first_41_characters() -> None:
    cid = "a" * 41 + "b" * 23
    assert annotation_cid(cid) == "a" * 41
    assert annotation_cid("short") == "short"


# --- SRv6 SID (SPEC §6) ----------------------------------------------------------------------


@pytest.mark.parametrize(("locator", "node", "vrf", "sid"), [
    ("2001:db8:ff01::/48", 1, 1, "2001:db8:ff01:1:e001::"),
    ("2001:db8:ff01::/48", 1, 100, "2001:db8:ff01:1:e064::"),
    ("fd00:abcd:1234::/48", 42, 0x123, "fd00:abcd:1234:2a:e123::"),
])
def test_spec_examples_of_srv6_sids(locator: str, node: int, vrf: int, sid: str) -> None:
    assert srv6_sid(locator, node, vrf) == sid


@given(st.integers(min_value=0, max_value=2**48 - 1), st.integers(min_value=1, max_value=254),
       st.integers(min_value=1, max_value=4095))
def test_sid_layout_is_locator_node_function_vrf_zeros(prefix: int, node: int,
                                                       vrf: int) -> None:
    locator = ipaddress.IPv6Network((prefix << 80, 48))
    sid = srv6_sid(str(locator), node, vrf)
    packed = ipaddress.IPv6Address(sid).packed
    assert packed[:6] == locator.network_address.packed[:6]
    assert int.from_bytes(packed[6:8], "big") == node
    assert packed[8] >> 4 == 0xE
    assert ((packed[8] & 0x0F) << 8) | packed[9] == vrf
    assert packed[10:] == bytes(6)
    assert sid == str(ipaddress.IPv6Address(sid))  # RFC 5952 form


@pytest.mark.parametrize(("locator", "node", "vrf"), [
    ("2001:db8::/32", 1, 1), ("2001:db8:ff01::/64", 1, 1), ("2001:db8:ff01::/48", -1, 1),
    ("2001:db8:ff01::/48", 0x10000, 1), ("2001:db8:ff01::/48", 1, 0x1000),
    ("2001:db8:ff01::/48", 1, -1),
])
def test_sid_rejects_bad_locator_node_or_vrf(locator: str, node: int, vrf: int) -> None:
    with pytest.raises(ValueError):
        srv6_sid(locator, node, vrf)
