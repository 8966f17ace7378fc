"""vpc-attach-ipam without a subprocess: config parser, pool arithmetic, on-disk allocator, verbs.

Everything runs in tmp dirs and needs no root.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cni_plugin import dispatch
from cni_plugin.core.locks import file_lock
from cni_plugin.core.request import Request
from cni_plugin.ipam.plugin import allocator
from cni_plugin.ipam.plugin.config import (
    DEFAULT_DATA_DIR,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    IpamConfig,
    parse_ipam,
    parse_network,
)
from cni_plugin.ipam.plugin.pool import Pool
from cni_plugin.ipam.plugin.store import INDEX_DIR, TMP_PREFIX, Attachment, PoolState
from netconf.errors import (
    CHECK_MISMATCH,
    DECODE_FAILURE,
    INCOMPATIBLE_VERSION,
    INTERNAL_ERROR,
    INVALID_CONFIG,
    INVALID_ENV,
    IO_FAILURE,
    IPAM_EXHAUSTED,
    STATUS_NOT_AVAILABLE,
    TRY_AGAIN_LATER,
    UNSUPPORTED_FIELD,
    CniError,
)
from netconf.host import IPAM_DATA_ROOT_ENV
from netconf.versions import LEGACY_RESULT_VERSIONS, SUPPORTED_VERSIONS

TYPE = "vpc-attach-ipam"
ETH0 = "eth0"
DATA_ROOT = tempfile.gettempdir()  # this node's ipamDataRoot: every tmp_path is below it


def run_ipam(req: Request) -> tuple[int, dict[str, Any] | None]:
    """The vpc-attach-ipam executable's answer, in this process."""
    outcome = dispatch.run(req, dispatch.ipam_verbs, log_line=False)
    return outcome.status, outcome.payload


def ipam_conf(data_dir: Path | str = DEFAULT_DATA_DIR, **keys: Any) -> IpamConfig:
    """Parse an ipam block of `keys` (plus type and dataDir)."""
    return parse_ipam({"type": TYPE, "dataDir": str(data_dir), **keys}, "1.1.0", "net1")


def code_of(call: Any, *args: Any, **kwargs: Any) -> CniError:
    """The CniError `call` raises."""
    with pytest.raises(CniError) as info:
        call(*args, **kwargs)
    return info.value


def att(container_id: str, ifname: str = ETH0) -> Attachment:
    return Attachment(container_id, ifname)


# ---------------------------------------------------------------------------------------------
# Config parser


def test_ipv6_pool_defaults_to_96_blocks_gateway_one_and_default_data_dir() -> None:
    conf = parse_ipam({"type": TYPE, "ipv6_subnet": "fd00:10::/64"}, "1.0.0", "net1")
    assert conf.mode == "pools"
    (pool,) = conf.pools
    assert pool.subnet == ipaddress.ip_network("fd00:10::/64")
    assert pool.block_prefix == 96
    assert str(pool.gateway) == "fd00:10::1"
    assert conf.data_dir == DEFAULT_DATA_DIR
    assert conf.lock_timeout == DEFAULT_LOCK_TIMEOUT_SECONDS
    assert conf.network_dir == f"{DEFAULT_DATA_DIR}/net1"


def test_ipv6_prefix_length_sets_block_length() -> None:
    (pool,) = ipam_conf(ipv6_subnet="fd00::/64", ipv6_prefix_length=112).pools
    assert pool.block_prefix == 112
    assert pool.answer(1) == "fd00::1:0/112"


@pytest.mark.parametrize("length", [63, 129, 0, -1])
def test_ipv6_prefix_length_outside_subnet_and_128_is_code_7(length: int) -> None:
    err = code_of(ipam_conf, ipv6_subnet="fd00::/64", ipv6_prefix_length=length)
    assert err.code == INVALID_CONFIG
    assert "ipam.ipv6_prefix_length" in err.msg


def test_ipv6_prefix_length_as_string_is_code_7() -> None:
    err = code_of(ipam_conf, ipv6_subnet="fd00::/64", ipv6_prefix_length="96")
    assert err.code == INVALID_CONFIG and "ipam.ipv6_prefix_length" in err.msg


def test_ipv6_prefix_length_equal_to_subnet_leaves_no_allocatable_block() -> None:
    (pool,) = ipam_conf(ipv6_subnet="fd00::/96").pools
    assert pool.size == 1 and pool.capacity == 0


def test_ipv4_pool_hands_out_slash_32_and_reserves_network_gateway_broadcast() -> None:
    (pool,) = ipam_conf(ipv4_subnet="10.1.0.0/24").pools
    assert pool.block_prefix == 32
    assert str(pool.gateway) == "10.1.0.1"
    assert pool.reserved == {0, 1, 255}
    assert pool.capacity == 253
    assert pool.answer(2) == "10.1.0.2/32"


@pytest.mark.parametrize("subnet", ["10.0.0.0/31", "10.0.0.0/32"])
def test_ipv4_subnet_smaller_than_30_is_code_7(subnet: str) -> None:
    err = code_of(ipam_conf, ipv4_subnet=subnet)
    assert err.code == INVALID_CONFIG and "ipam.ipv4_subnet" in err.msg


@pytest.mark.parametrize(("key", "value"), [
    ("ipv6_subnet", "not-a-cidr"),
    ("ipv6_subnet", "fd00::"),
    ("ipv6_subnet", "fd00::/129"),
    ("ipv6_subnet", "10.0.0.0/8"),
    ("ipv6_subnet", "fe80::%eth0/64"),
    ("ipv4_subnet", "10.0.0.0/33"),
    ("ipv4_subnet", "fd00::/64"),
    ("ipv4_subnet", "10.0.0.256/24"),
    ("ipv4_subnet", "10.0.0.0"),
])
def test_bad_cidr_is_code_7_naming_the_key(key: str, value: str) -> None:
    err = code_of(ipam_conf, **{key: value})
    assert err.code == INVALID_CONFIG
    assert f"ipam.{key}" in err.msg


def test_subnet_with_host_bits_is_masked_like_go() -> None:
    (pool,) = ipam_conf(ipv6_subnet="fd00::5/64").pools
    assert pool.subnet == ipaddress.ip_network("fd00::/64")


def test_unknown_key_is_code_7_naming_it() -> None:
    err = code_of(ipam_conf, ipv6_subnet="fd00::/64", subnet="10.0.0.0/24")
    assert err.code == INVALID_CONFIG
    assert err.msg == "unknown config key 'ipam.subnet'"


def test_unknown_key_inside_addresses_is_named_with_its_path() -> None:
    err = code_of(ipam_conf, addresses=[{"address": "fd00::5/64", "mac": "x"}])
    assert err.msg == "unknown config key 'ipam.addresses.0.mac'"


def test_keys_match_case_insensitively_like_go() -> None:
    conf = parse_ipam({"Type": TYPE, "IPv6_Subnet": "fd00::/64", "DataDir": "/x"}, "1.1.0", "n")
    assert conf.data_dir == "/x" and conf.pools[0].family == 6


@pytest.mark.parametrize(("keys", "named"), [
    ({"addresses": [{"address": "fd00::5/64"}], "static_ip": "fd00::6"},
     ("ipam.addresses", "ipam.static_ip")),
    ({"static_ip": "fd00::6", "ipv6_subnet": "fd00::/64"}, ("ipam.static_ip", "ipam.ipv6_subnet")),
    ({"addresses": [{"address": "10.0.0.5/32"}], "ipv4_subnet": "10.0.0.0/24"},
     ("ipam.addresses", "ipam.ipv4_subnet")),
    ({"addresses": [{"address": "10.0.0.5/32"}], "static_ip": "fd00::6",
      "ipv6_subnet": "fd00::/64", "ipv4_subnet": "10.0.0.0/24"},
     ("ipam.addresses", "ipam.static_ip", "ipam.ipv6_subnet", "ipam.ipv4_subnet")),
])
def test_mixing_modes_is_code_7_naming_the_keys(keys: dict[str, Any],
                                                named: tuple[str, ...]) -> None:
    err = code_of(ipam_conf, **keys)
    assert err.code == INVALID_CONFIG
    for key in named:
        assert f"'{key}'" in err.msg


def test_no_mode_is_code_7() -> None:
    err = code_of(ipam_conf)
    assert err.code == INVALID_CONFIG and "ipv6_subnet" in err.msg


def test_empty_strings_and_lists_count_as_absent_like_galactic() -> None:
    conf = ipam_conf(static_ip="", ipv4_subnet="", addresses=[], ipv6_subnet="fd00::/64")
    assert conf.mode == "pools" and [p.family for p in conf.pools] == [6]


@pytest.mark.parametrize(("key", "needs"), [
    ("ipv6_prefix_length", "ipv6_subnet"), ("ipv6_gateway", "ipv6_subnet"),
    ("ipv4_gateway", "ipv4_subnet"),
])
def test_pool_option_without_its_subnet_is_code_7(key: str, needs: str) -> None:
    value: Any = 112 if key == "ipv6_prefix_length" else "fd00::1"
    other = {"ipv4_subnet": "10.0.0.0/24"} if needs == "ipv6_subnet" else {
        "ipv6_subnet": "fd00::/64"}
    err = code_of(ipam_conf, **{key: value}, **other)
    assert err.code == INVALID_CONFIG and f"ipam.{key}" in err.msg


def test_addresses_keep_their_prefix_and_gateway() -> None:
    conf = ipam_conf(addresses=[{"address": "fd00:1::5/80", "gateway": "fd00:1::1"},
                                {"address": "10.2.0.5/32"}])
    assert conf.mode == "addresses"
    assert [str(f.address) for f in conf.fixed] == ["fd00:1::5/80", "10.2.0.5/32"]
    assert [str(f.gateway) if f.gateway else None for f in conf.fixed] == ["fd00:1::1", None]


@pytest.mark.parametrize(("addresses", "key"), [
    ([{"address": "10.2.0.5/24"}], "ipam.addresses.0.address"),
    ([{"address": "fd00::5/64"}, {"address": "fd00::6/64"}], "ipam.addresses"),
    ([{"address": "10.0.0.5/32"}, {"address": "10.0.0.6/32"}], "ipam.addresses"),
    ([{"address": "bogus"}], "ipam.addresses.0.address"),
    ([{"address": "fd00::5/64", "gateway": "10.0.0.1"}], "ipam.addresses.0.gateway"),
    ([{"address": "fd00::5/64", "gateway": "fd00::5"}], "ipam.addresses.0.gateway"),
    ([{"gateway": "fd00::1"}], "ipam.addresses.0.address"),
    ("fd00::5/64", "ipam.addresses"),
])
def test_invalid_addresses_are_code_7_naming_the_key(addresses: Any, key: str) -> None:
    err = code_of(ipam_conf, addresses=addresses)
    assert err.code == INVALID_CONFIG
    assert f"'{key}" in err.msg


def test_static_ip_is_answered_as_64() -> None:
    conf = ipam_conf(static_ip="fd00:5::7")
    assert conf.mode == "static_ip"
    assert [str(f.address) for f in conf.fixed] == ["fd00:5::7/64"]


@pytest.mark.parametrize("value", ["10.0.0.7", "fd00::7/64", "nope"])
def test_static_ip_must_be_one_ipv6_address(value: str) -> None:
    err = code_of(ipam_conf, static_ip=value)
    assert err.code == INVALID_CONFIG and "ipam.static_ip" in err.msg


@pytest.mark.parametrize(("families", "expected"), [
    (["IPv6"], [6]), (["IPv4"], [4]), (["IPv4", "IPv6"], [6, 4]), (["ipv6", "ipv4"], [6, 4]),
    (None, [6, 4]),
])
def test_address_families_narrow_the_pools(families: list[str] | None,
                                           expected: list[int]) -> None:
    keys: dict[str, Any] = {"ipv6_subnet": "fd00::/64", "ipv4_subnet": "10.0.0.0/24"}
    if families is not None:
        keys["address_families"] = families
    assert [p.family for p in ipam_conf(**keys).pools] == expected


@pytest.mark.parametrize(("keys", "why"), [
    ({"ipv6_subnet": "fd00::/64", "address_families": ["IPv4"]}, "ipv4_subnet"),
    ({"ipv6_subnet": "fd00::/64", "address_families": ["IPv5"]}, "IPv5"),
    ({"ipv6_subnet": "fd00::/64", "address_families": []}, "IPv4 and/or IPv6"),
    ({"static_ip": "fd00::5", "address_families": ["IPv4"]}, "static_ip"),
    ({"addresses": [{"address": "10.0.0.5/32"}], "address_families": ["IPv6"]}, "10.0.0.5"),
])
def test_contradicting_address_families_is_code_7(keys: dict[str, Any], why: str) -> None:
    err = code_of(ipam_conf, **keys)
    assert err.code == INVALID_CONFIG
    assert "ipam.address_families" in err.msg and why in err.msg


def test_explicit_gateways_are_answered_and_their_blocks_reserved() -> None:
    conf = ipam_conf(ipv6_subnet="fd00::/64", ipv6_gateway="fd00::3:0:1",
                     ipv4_subnet="10.0.0.0/24", ipv4_gateway="10.0.0.254")
    v6, v4 = conf.pools
    assert str(v6.gateway) == "fd00::3:0:1" and v6.reserved == {0, 3}
    assert str(v4.gateway) == "10.0.0.254" and v4.reserved == {0, 254, 255}


@pytest.mark.parametrize(("key", "value"), [
    ("ipv6_gateway", "fd01::1"), ("ipv6_gateway", "10.0.0.1"), ("ipv6_gateway", "fd00::"),
    ("ipv4_gateway", "10.0.1.1"), ("ipv4_gateway", "10.0.0.0"), ("ipv4_gateway", "10.0.0.255"),
    ("ipv4_gateway", "nope"),
])
def test_gateway_outside_the_subnet_or_on_its_edges_is_code_7(key: str, value: str) -> None:
    err = code_of(ipam_conf, ipv6_subnet="fd00::/64", ipv4_subnet="10.0.0.0/24", **{key: value})
    assert err.code == INVALID_CONFIG and f"ipam.{key}" in err.msg


@pytest.mark.parametrize("value", ["relative/dir", ""])
def test_data_dir_must_be_an_absolute_path(value: str) -> None:
    err = code_of(parse_ipam, {"type": TYPE, "static_ip": "fd00::1", "dataDir": value},
                  "1.1.0", "n")
    assert err.code == INVALID_CONFIG and "ipam.dataDir" in err.msg


def test_routes_are_validated() -> None:
    conf = ipam_conf(static_ip="fd00::5", routes=[{"dst": "fd01::/64", "gw": "fd00::1"}])
    assert [(r.dst, r.gw) for r in conf.routes] == [("fd01::/64", "fd00::1")]
    err = code_of(ipam_conf, static_ip="fd00::5", routes=[{"dst": "fd01::/64", "gw": "10.0.0.1"}])
    assert err.code == INVALID_CONFIG and "ipam.routes.0.gw" in err.msg


@pytest.mark.parametrize("value", ["dhcp", "host-local", ""])
def test_type_must_name_this_plugin(value: str) -> None:
    err = code_of(parse_ipam, {"type": value, "ipv6_subnet": "fd00::/64"}, "1.1.0", "n")
    assert err.code == INVALID_CONFIG and "ipam.type" in err.msg


def test_galactic_ipam_type_is_accepted_for_drop_in_use() -> None:
    conf = parse_ipam({"type": "galactic-ipam", "ipv6_subnet": "fd00::/64"}, "1.1.0", "n")
    assert conf.mode == "pools"


@pytest.mark.parametrize(("data", "code", "needle"), [
    ({"cniVersion": "1.1.0", "name": "n"}, INVALID_CONFIG, "'ipam'"),
    ({"cniVersion": "1.1.0", "name": "n", "ipam": "x"}, INVALID_CONFIG, "'ipam'"),
    ({"cniVersion": "1.1.0", "ipam": {"type": TYPE, "static_ip": "fd00::1"}}, INVALID_CONFIG,
     "'name'"),
    ({"cniVersion": "1.1.0", "name": "../etc", "ipam": {"type": TYPE, "static_ip": "fd00::1"}},
     INVALID_CONFIG, "'name'"),
    ({"cniVersion": "9.9.9", "name": "n", "ipam": {"type": TYPE, "static_ip": "fd00::1"}},
     INCOMPATIBLE_VERSION, "9.9.9"),
    ({"name": "n", "ipam": {"type": TYPE, "static_ip": "fd00::1"}}, INVALID_CONFIG,
     "'cniVersion'"),
])
def test_network_level_errors(data: dict[str, Any], code: int, needle: str) -> None:
    err = code_of(parse_network, data)
    assert err.code == code and needle in err.msg


def test_the_rest_of_the_network_config_is_ignored() -> None:
    conf = parse_network({"cniVersion": "0.4.0", "name": "vpc-net", "type": "vpc-attach",
                          "vpc": "10", "vpcattachment": "10", "mtu": 1400,
                          "ipam": {"type": TYPE, "static_ip": "fd00::1"}})
    assert conf.network == "vpc-net" and conf.cni_version == "0.4.0"


_KEYS = ["type", "addresses", "static_ip", "ipv6_subnet", "ipv6_prefix_length", "ipv6_gateway",
         "ipv4_subnet", "ipv4_gateway", "address_families", "routes", "dataDir",
         "lockTimeoutSeconds", "subnet", "gateway"]
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-300, 300) | st.floats(allow_nan=False)
    | st.sampled_from(["fd00::/64", "10.0.0.0/24", "fd00::5", "10.0.0.5/32", "IPv6", "IPv4",
                       TYPE, "", "x"]) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["address", "gateway", "dst", "gw", "x"]), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_KEYS), _json, max_size=6))
def test_parser_answers_every_ipam_block_with_a_config_or_code_7(block: dict[str, Any]) -> None:
    block.setdefault("type", TYPE)
    try:
        conf = parse_ipam(block, "1.1.0", "net1")
    except CniError as exc:
        assert exc.code == INVALID_CONFIG
        assert "ipam" in exc.msg
        return
    assert conf.mode in ("addresses", "static_ip", "pools")
    assert bool(conf.pools) == (conf.mode == "pools")
    assert bool(conf.fixed) == (conf.mode != "pools")
    assert len({f.address.version for f in conf.fixed}) == len(conf.fixed)


@st.composite
def subnets(draw: st.DrawFn) -> tuple[str, int, int]:
    """(subnet CIDR, family, prefix) of a random pool subnet."""
    family = draw(st.sampled_from([4, 6]))
    if family == 4:
        prefix = draw(st.integers(0, 30))
        address = str(ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1))))
    else:
        prefix = draw(st.integers(0, 127))
        address = str(ipaddress.IPv6Address(draw(st.integers(0, 2**128 - 1))))
    return f"{address}/{prefix}", family, prefix


@given(subnets(), st.data())
def test_parsed_pool_matches_the_subnet_given(subnet: tuple[str, int, int],
                                              data: st.DataObject) -> None:
    cidr, family, prefix = subnet
    keys: dict[str, Any] = {f"ipv{family}_subnet": cidr}
    block = 32
    if family == 6:
        block = data.draw(st.integers(prefix, 128))
        keys["ipv6_prefix_length"] = block
    (pool,) = ipam_conf(**keys).pools
    assert pool.subnet == ipaddress.ip_network(cidr, strict=False)
    assert pool.block_prefix == block
    assert pool.gateway == pool.subnet.network_address + 1


# ---------------------------------------------------------------------------------------------
# Pool arithmetic


@st.composite
def pools(draw: st.DrawFn, max_blocks_bits: int = 24) -> Pool:
    """A random valid pool."""
    cidr, family, prefix = draw(subnets())
    subnet = ipaddress.ip_network(cidr, strict=False)
    if family == 4:
        assume(32 - prefix <= max_blocks_bits)
        block = 32
    else:
        block = draw(st.integers(prefix, min(128, prefix + max_blocks_bits)))
    assume(subnet.num_addresses >= 2)
    gateway = subnet.network_address + draw(st.integers(1, min(subnet.num_addresses - 1, 2**20)))
    if family == 4:
        assume(gateway != subnet.broadcast_address)
    return Pool(subnet, block, gateway)


@given(pools(), st.data())
def test_block_index_and_record_name_round_trip(pool: Pool, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, pool.size - 1))
    block = pool.block(index)
    assert block.prefixlen == pool.block_prefix
    assert block.subnet_of(pool.subnet)  # type: ignore[arg-type]
    assert pool.index_of_name(pool.record_name(index)) == index
    assert ipaddress.ip_interface(pool.answer(index)).network == block


@given(pools())
def test_reserved_blocks_hold_the_network_gateway_and_ipv4_broadcast(pool: Pool) -> None:
    reserved_addresses = [pool.subnet.network_address, pool.gateway]
    if pool.family == 4:
        reserved_addresses.append(pool.subnet.broadcast_address)
    for address in reserved_addresses:
        index = next(i for i in pool.reserved if address in pool.block(i))
        assert index in pool.reserved
    assert len(pool.reserved) <= 3


@given(pools(max_blocks_bits=7), st.integers(-2, 200))
def test_candidates_visit_each_free_block_once_starting_after_the_cursor(pool: Pool,
                                                                         after: int) -> None:
    order = list(pool.candidates(after))
    assert sorted(order) == sorted(set(range(pool.size)) - pool.reserved)
    if order and 0 <= after < pool.size:
        expected_first = next(i for k in range(1, pool.size + 1)
                              if (i := (after + k) % pool.size) not in pool.reserved)
        assert order[0] == expected_first


@given(pools(), st.text(max_size=40))
def test_index_of_name_rejects_what_is_not_a_block_start(pool: Pool, name: str) -> None:
    index = pool.index_of_name(name)
    if index is not None:
        assert pool.record_name(index) == str(ipaddress.ip_address(name))


def test_misaligned_or_foreign_names_are_no_block() -> None:
    pool = Pool.with_default_gateway(ipaddress.ip_network("fd00::/64"), 96)
    assert pool.index_of_name("fd00::1:0:1") is None
    assert pool.index_of_name("fd01::") is None
    assert pool.index_of_name("10.0.0.1") is None
    assert pool.index_of_name("lock") is None


def test_pool_rejects_inconsistent_arguments() -> None:
    subnet = ipaddress.ip_network("fd00::/64")
    with pytest.raises(ValueError):
        Pool(subnet, 63, ipaddress.ip_address("fd00::1"))
    with pytest.raises(ValueError):
        Pool(subnet, 96, ipaddress.ip_address("fd01::1"))
    with pytest.raises(IndexError):
        Pool.with_default_gateway(subnet, 96).block(2**32)


# ---------------------------------------------------------------------------------------------
# On-disk allocator


def pool_dir(conf: IpamConfig, family: int = 0) -> Path:
    pool = conf.pools[family]
    return Path(conf.network_dir) / pool.pool_id


def records_in(directory: Path) -> list[str]:
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir()
                  if p.is_file() and p.name not in ("lock", "last_reserved")
                  and not p.name.startswith("."))


def test_repeated_add_returns_the_same_block(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64")
    first = allocator.allocate_all(conf, att("c1"))
    again = allocator.allocate_all(conf, att("c1"))
    assert [a.address for a in first] == [a.address for a in again] == ["fd00::1:0:0/96"]
    assert first[0].created and not again[0].created
    assert records_in(pool_dir(conf)) == ["fd00::1:0:0"]


def test_record_names_container_and_ifname_and_is_named_by_address(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.9.0.0/24")
    allocator.allocate_all(conf, att("c1", "net1"))
    record = pool_dir(conf) / "10.9.0.2"
    assert json.loads(record.read_text()) == {"formatVersion": 1, "containerID": "c1",
                                              "ifname": "net1"}
    assert (pool_dir(conf) / INDEX_DIR / "c1@net1").read_text() == "10.9.0.2"
    leftovers = [p for p in pool_dir(conf).rglob("*") if p.name.startswith(TMP_PREFIX)]
    assert leftovers == []


def test_each_attachment_gets_its_own_block(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64", ipv4_subnet="10.0.0.0/24")
    seen: set[str] = set()
    for attachment in (att("c1"), att("c2"), att("c1", "net1")):
        for allocation in allocator.allocate_all(conf, attachment):
            assert allocation.address not in seen
            seen.add(allocation.address)
    assert len(seen) == 6


def test_next_allocation_continues_after_the_last_one_like_host_local(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    allocator.allocate_all(conf, att("c1"))
    allocator.allocate_all(conf, att("c2"))
    allocator.release(conf, att("c1"))
    (third,) = allocator.allocate_all(conf, att("c3"))
    assert third.address == "10.0.0.4/32"  # .2 was freed but is not reused at once


def test_allocation_wraps_around_to_freed_blocks(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/29")  # .2 … .6
    for n in range(5):
        allocator.allocate_all(conf, att(f"c{n}"))
    allocator.release(conf, att("c1"))  # frees .3
    (again,) = allocator.allocate_all(conf, att("c9"))
    assert again.address == "10.0.0.3/32"


def test_exhausted_pool_is_code_102_naming_the_pool(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/30")  # only .2
    allocator.allocate_all(conf, att("c1"))
    err = code_of(allocator.allocate_all, conf, att("c2"))
    assert err.code == IPAM_EXHAUSTED
    assert "10.0.0.0/30" in err.msg and "net1" in err.msg


def test_prefix_length_equal_to_subnet_is_exhausted_at_add(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/96")
    assert code_of(allocator.allocate_all, conf, att("c1")).code == IPAM_EXHAUSTED


def test_failing_second_pool_releases_what_this_add_reserved(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64", ipv4_subnet="10.0.0.0/30")
    allocator.allocate_all(conf, att("c1"))
    err = code_of(allocator.allocate_all, conf, att("c2"))
    assert err.code == IPAM_EXHAUSTED
    assert records_in(pool_dir(conf, 0)) == ["fd00::1:0:0"]
    assert allocator.held(conf, conf.pools[0], att("c2")) is None


def test_failing_repeated_add_keeps_the_earlier_allocation(tmp_path: Path) -> None:
    v6_only = ipam_conf(tmp_path, ipv6_subnet="fd00::/64")
    allocator.allocate_all(v6_only, att("c1"))
    dual = ipam_conf(tmp_path, ipv6_subnet="fd00::/64", ipv4_subnet="10.0.0.0/30")
    allocator.allocate_all(dual, att("c2"))
    assert code_of(allocator.allocate_all, dual, att("c1")).code == IPAM_EXHAUSTED
    assert allocator.held(dual, dual.pools[0], att("c1")) is not None


def test_release_removes_only_that_attachments_records(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64", ipv4_subnet="10.0.0.0/24")
    allocator.allocate_all(conf, att("c1"))
    allocator.allocate_all(conf, att("c1", "net1"))
    allocator.allocate_all(conf, att("c2"))
    released = allocator.release(conf, att("c1"))
    assert sorted(released) == ["10.0.0.2", "fd00::1:0:0"]
    assert allocator.held(conf, conf.pools[0], att("c1", "net1")) is not None
    assert allocator.held(conf, conf.pools[1], att("c2")) is not None
    assert not (pool_dir(conf) / INDEX_DIR / "c1@eth0").exists()


def test_release_of_unknown_attachment_or_missing_data_dir_succeeds(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path / "never-created", ipv6_subnet="fd00::/64")
    assert allocator.release(conf, att("ghost")) == []
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64")
    allocator.allocate_all(conf, att("c1"))
    assert allocator.release(conf, att("ghost")) == []
    assert allocator.release(conf, att("c1")) == ["fd00::1:0:0"]
    assert allocator.release(conf, att("c1")) == []


def test_release_reaches_pools_no_longer_configured(tmp_path: Path) -> None:
    old = ipam_conf(tmp_path, ipv6_subnet="fd00::/64")
    allocator.allocate_all(old, att("c1"))
    new = ipam_conf(tmp_path, ipv6_subnet="fd99::/64", ipv6_prefix_length=112)
    assert allocator.release(new, att("c1")) == ["fd00::1:0:0"]


def full_disk_at(monkeypatch: pytest.MonkeyPatch, fails: str) -> None:
    """os.replace onto a path ending in `fails` fails as on a full disk (ENOSPC)."""
    real = os.replace

    def replace(src: str, dst: str) -> None:
        if str(dst).endswith(fails):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_reserve_whose_index_cannot_be_written_leaves_no_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    full_disk_at(monkeypatch, "c1@eth0")
    assert code_of(allocator.allocate_all, conf, att("c1")).code == IO_FAILURE
    assert records_in(pool_dir(conf)) == []
    assert [p for p in pool_dir(conf).rglob("*") if p.name.startswith(TMP_PREFIX)] == []


def test_a_reserve_whose_cursor_cannot_be_written_is_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    full_disk_at(monkeypatch, "last_reserved")
    (first,) = allocator.allocate_all(conf, att("c1"))
    (second,) = allocator.allocate_all(conf, att("c2"))  # no cursor: found free all the same
    assert first.address != second.address
    assert allocator.release(conf, att("c1")) == ["10.0.0.2"]


def test_del_finds_a_record_whose_index_entry_is_gone(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64")
    allocator.allocate_all(conf, att("c1"))
    allocator.allocate_all(conf, att("c2"))
    (pool_dir(conf) / INDEX_DIR / "c1@eth0").unlink()
    assert allocator.release(conf, att("c1")) == ["fd00::1:0:0"]
    assert records_in(pool_dir(conf)) == ["fd00::2:0:0"]


def test_del_finds_a_record_whose_index_entry_is_damaged(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64")
    allocator.allocate_all(conf, att("c1"))
    allocator.allocate_all(conf, att("c2"))
    (pool_dir(conf) / INDEX_DIR / "c1@eth0").write_text("fd00::2:0:0")  # c2's record
    assert allocator.release(conf, att("c1")) == ["fd00::1:0:0"]
    assert allocator.held(conf, conf.pools[0], att("c2")) is not None


def test_gc_releases_unlisted_attachments_and_keeps_listed_ones(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64", ipv4_subnet="10.0.0.0/24")
    for attachment in (att("keep"), att("stale"), att("keep", "net1")):
        allocator.allocate_all(conf, attachment)
    released = allocator.collect_garbage(conf, {att("keep"), att("keep", "net1"),
                                                att("never-added")})
    assert [r.attachment for r in released] == [att("stale")] * 2
    for pool in conf.pools:
        assert allocator.held(conf, pool, att("keep")) is not None
        assert allocator.held(conf, pool, att("keep", "net1")) is not None
        assert allocator.held(conf, pool, att("stale")) is None
    assert not (pool_dir(conf) / INDEX_DIR / "stale@eth0").exists()


def test_gc_removes_crash_leftovers(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    allocator.allocate_all(conf, att("c1"))
    directory = pool_dir(conf)
    # A record no index points to (crash between the two writes), though its owner is valid.
    (directory / "10.0.0.9").write_text(json.dumps({"containerID": "c1", "ifname": ETH0}))
    (directory / "10.0.0.10").write_text("")  # truncated by a power loss
    (directory / INDEX_DIR / "gone@eth0").write_text("10.0.0.77")  # dangling index entry
    (directory / f"{TMP_PREFIX}abc").write_text("{}")
    released = allocator.collect_garbage(conf, {att("c1")})
    assert sorted(r.name for r in released) == ["10.0.0.10", "10.0.0.9"]
    assert records_in(directory) == ["10.0.0.2"]
    assert sorted(p.name for p in (directory / INDEX_DIR).iterdir()) == ["c1@eth0"]
    assert not (directory / f"{TMP_PREFIX}abc").exists()


def test_unreadable_record_is_never_handed_out(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    pool_dir(conf).mkdir(parents=True)
    (pool_dir(conf) / "10.0.0.2").write_text("garbage")
    (first,) = allocator.allocate_all(conf, att("c1"))
    assert first.address == "10.0.0.3/32"


def test_index_pointing_at_another_attachments_record_is_not_trusted(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    allocator.allocate_all(conf, att("c1"))
    index = pool_dir(conf) / INDEX_DIR / "c2@eth0"
    index.write_text("10.0.0.2")  # stale: c1 holds that record
    (mine,) = allocator.allocate_all(conf, att("c2"))
    assert mine.address == "10.0.0.3/32"
    assert allocator.release(conf, att("c2")) == ["10.0.0.3"]
    assert allocator.held(conf, conf.pools[0], att("c1")) is not None


def test_add_after_its_index_entry_is_lost_keeps_the_block(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    allocator.allocate_all(conf, att("c1"))
    index = pool_dir(conf) / INDEX_DIR / "c1@eth0"
    for damage in (index.unlink, lambda: index.write_bytes(b"\x00garbage" * 40)):
        damage()
        (again,) = allocator.allocate_all(conf, att("c1"))
        assert (again.address, again.created) == ("10.0.0.2/32", False)
        assert index.read_text() == "10.0.0.2"  # the entry is written again
    assert records_in(pool_dir(conf)) == ["10.0.0.2"]


def test_retried_add_after_a_crash_between_record_and_index_takes_that_record(
        tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    pool_dir(conf).mkdir(parents=True)
    (pool_dir(conf) / "10.0.0.7").write_text(json.dumps({"containerID": "c1", "ifname": ETH0}))
    (retried,) = allocator.allocate_all(conf, att("c1"))
    assert retried.address == "10.0.0.7/32"
    assert allocator.release(conf, att("c1")) == ["10.0.0.7"]
    assert records_in(pool_dir(conf)) == []


def test_gc_keeps_a_listed_attachments_record_without_index_entry(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv4_subnet="10.0.0.0/24")
    allocator.allocate_all(conf, att("c1"))
    (pool_dir(conf) / INDEX_DIR / "c1@eth0").unlink()
    assert allocator.collect_garbage(conf, {att("c1")}) == []
    (other,) = allocator.allocate_all(conf, att("c2"))
    assert other.address != "10.0.0.2/32"  # still c1's: never handed out twice


def test_long_container_ids_get_a_hashed_index_name(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64")
    long_id = "c" * 300
    allocator.allocate_all(conf, att(long_id))
    assert att(long_id).index_name.startswith("h-")
    again = allocator.allocate_all(conf, att(long_id))
    assert not again[0].created
    assert allocator.release(conf, att(long_id)) == ["fd00::1:0:0"]


def test_held_lock_times_out_with_code_11(tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path, ipv6_subnet="fd00::/64", lockTimeoutSeconds=0.1)
    with file_lock(str(pool_dir(conf) / "lock"), 1.0):
        err = code_of(allocator.allocate_all, conf, att("c1"))
    assert err.code == TRY_AGAIN_LATER
    assert allocator.allocate_all(conf, att("c1"))[0].created


def test_data_dir_that_is_a_file_is_code_5(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    conf = ipam_conf(blocker, ipv6_subnet="fd00::/64")
    err = code_of(allocator.allocate_all, conf, att("c1"))
    assert err.code == IO_FAILURE and str(blocker) in err.msg


def test_pool_state_ignores_its_own_files_when_listing_records(tmp_path: Path) -> None:
    state = PoolState(str(tmp_path / "p"), 1.0)
    with state.locked():
        assert state.reserve(att("c1"), ["10.0.0.2"]) == "10.0.0.2"
        assert [r.name for r in state.records()] == ["10.0.0.2"]
        assert state.cursor() == "10.0.0.2"
        assert state.reserve(att("c2"), ["10.0.0.2"]) is None


_ops = st.lists(st.tuples(st.sampled_from(["add", "del", "gc"]),
                          st.sampled_from(["a", "b", "c", "d", "e"]),
                          st.sampled_from(["eth0", "net1"])), max_size=25)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_ops)
def test_allocator_keeps_one_distinct_block_per_live_attachment(
        tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str, str]]) -> None:
    conf = ipam_conf(tmp_path_factory.mktemp("state"), ipv6_subnet="fd00::/93",
                     ipv4_subnet="10.0.0.0/29")  # 7 and 5 allocatable blocks
    live: dict[Attachment, tuple[str, ...]] = {}
    for op, cid, ifname in ops:
        attachment = att(cid, ifname)
        if op == "add":
            try:
                got = tuple(a.address for a in allocator.allocate_all(conf, attachment))
            except CniError as exc:
                assert exc.code == IPAM_EXHAUSTED
                assert attachment not in live and len(live) >= 5
                continue
            if attachment in live:
                assert got == live[attachment]
            live[attachment] = got
        elif op == "del":
            allocator.release(conf, attachment)
            live.pop(attachment, None)
        else:
            keep = {a for a in live if a.container_id != cid}
            allocator.collect_garbage(conf, keep)
            live = {a: v for a, v in live.items() if a in keep}
        addresses = [address for got in live.values() for address in got]
        assert len(addresses) == len(set(addresses))
        for pool in conf.pools:
            assert len(records_in(pool_dir(conf, conf.pools.index(pool)))) == len(live)


# ---------------------------------------------------------------------------------------------
# Verbs through the dispatcher


def request(command: str, conf: dict[str, Any] | bytes, container_id: str = "c1",
            ifname: str = ETH0, **env: str) -> Request:
    environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname,
               "CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin",
               IPAM_DATA_ROOT_ENV: DATA_ROOT, **env}
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    return Request(environ=environ, stdin=stdin)


def network(tmp_path: Path, version: str = "1.1.0", **ipam: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": "net1", "type": "vpc-attach",
            "ipam": {"type": TYPE, "dataDir": str(tmp_path), **ipam}}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_add_answers_ips_without_interfaces_in_the_configs_version(tmp_path: Path,
                                                                   version: str) -> None:
    conf = network(tmp_path, version, ipv6_subnet="fd00::/64", ipv4_subnet="10.0.0.0/24")
    status, answer = run_ipam(request("ADD", conf))
    assert status == 0 and answer is not None
    assert answer["cniVersion"] == version
    assert "interfaces" not in answer
    assert [ip["address"] for ip in answer["ips"]] == ["fd00::1:0:0/96", "10.0.0.2/32"]
    assert [ip["gateway"] for ip in answer["ips"]] == ["fd00::1", "10.0.0.1"]
    assert all("interface" not in ip for ip in answer["ips"])
    assert answer["routes"] == [{"dst": "::/0"}, {"dst": "0.0.0.0/0"}]
    if version in LEGACY_RESULT_VERSIONS:
        assert [ip["version"] for ip in answer["ips"]] == ["6", "4"]
    else:
        assert all("version" not in ip for ip in answer["ips"])


def test_add_of_addresses_and_static_ip_stores_nothing(tmp_path: Path) -> None:
    conf = network(tmp_path, addresses=[{"address": "fd00::5/80", "gateway": "fd00::1"},
                                        {"address": "10.0.0.5/32"}])
    status, answer = run_ipam(request("ADD", conf))
    assert status == 0 and answer is not None
    assert answer["ips"] == [{"address": "fd00::5/80", "gateway": "fd00::1"},
                             {"address": "10.0.0.5/32"}]
    assert "routes" not in answer
    status, answer = run_ipam(request("ADD", network(tmp_path, static_ip="fd00::7")))
    assert status == 0 and answer is not None
    assert answer["ips"] == [{"address": "fd00::7/64"}]
    assert list(tmp_path.iterdir()) == []


def test_configured_default_route_replaces_the_implicit_one(tmp_path: Path) -> None:
    conf = network(tmp_path, ipv6_subnet="fd00::/64", routes=[{"dst": "::/0", "gw": "fd00::9"}])
    status, answer = run_ipam(request("ADD", conf))
    assert status == 0 and answer is not None
    assert answer["routes"] == [{"dst": "::/0", "gw": "fd00::9"}]


def test_check_passes_after_add_and_fails_with_103_after_del(tmp_path: Path) -> None:
    conf = network(tmp_path, ipv6_subnet="fd00::/64")
    status, result = run_ipam(request("ADD", conf))
    assert status == 0
    assert run_ipam(request("CHECK", {**conf, "prevResult": result})) == (0, None)
    assert run_ipam(request("CHECK", conf)) == (0, None)
    assert run_ipam(request("DEL", conf)) == (0, None)
    status, answer = run_ipam(request("CHECK", {**conf, "prevResult": result}))
    assert status == 1 and answer is not None
    assert answer["code"] == CHECK_MISMATCH and "c1" in answer["msg"]


def test_check_names_an_address_missing_from_prev_result(tmp_path: Path) -> None:
    conf = network(tmp_path, "0.4.0", static_ip="fd00::7")
    prev = {"cniVersion": "0.4.0", "ips": [{"version": "6", "address": "fd00::8/64"}]}
    status, answer = run_ipam(request("CHECK", {**conf, "prevResult": prev}))
    assert status == 1 and answer is not None
    assert answer["code"] == CHECK_MISMATCH and "fd00::7/64" in answer["msg"]


def test_check_gc_and_status_refuse_versions_before_them(tmp_path: Path) -> None:
    for command, version in (("CHECK", "0.3.1"), ("GC", "1.0.0"), ("STATUS", "1.0.0")):
        conf = network(tmp_path, version, ipv6_subnet="fd00::/64")
        status, answer = run_ipam(request(command, conf))
        assert status == 1 and answer is not None and answer["code"] == INCOMPATIBLE_VERSION


def test_gc_keeps_only_the_valid_attachments(tmp_path: Path) -> None:
    conf = network(tmp_path, ipv4_subnet="10.0.0.0/24")
    for cid in ("c1", "c2", "c3"):
        assert run_ipam(request("ADD", conf, cid))[0] == 0
    gc_conf = {**conf, "cni.dev/valid-attachments": [{"containerID": "c2", "ifname": ETH0}]}
    assert run_ipam(request("GC", gc_conf)) == (0, None)
    parsed = parse_network(conf)
    assert records_in(Path(parsed.network_dir) / parsed.pools[0].pool_id) == ["10.0.0.3"]
    old_key = {**conf, "cni.dev/attachments": []}
    assert run_ipam(request("GC", old_key)) == (0, None)
    assert records_in(Path(parsed.network_dir) / parsed.pools[0].pool_id) == []


@pytest.mark.parametrize("listed", ["nope", [{"ifname": ETH0}], ["c1"]])
def test_gc_with_a_malformed_attachment_list_is_code_6(tmp_path: Path, listed: Any) -> None:
    conf = {**network(tmp_path, ipv4_subnet="10.0.0.0/24"), "cni.dev/valid-attachments": listed}
    status, answer = run_ipam(request("GC", conf))
    assert status == 1 and answer is not None and answer["code"] == DECODE_FAILURE


def test_status_is_0_when_data_dir_is_writable_and_50_otherwise(tmp_path: Path) -> None:
    assert run_ipam(request("STATUS", network(tmp_path, ipv6_subnet="fd00::/64"))) == (0, None)
    blocker = tmp_path / "file"
    blocker.write_text("")
    status, answer = run_ipam(request("STATUS", network(blocker, ipv6_subnet="fd00::/64")))
    assert status == 1 and answer is not None
    assert answer["code"] == STATUS_NOT_AVAILABLE and "dataDir" in answer["msg"]
    assert run_ipam(request("STATUS", network(blocker, static_ip="fd00::1"))) == (0, None)


def test_version_answers_the_supported_versions() -> None:
    status, answer = run_ipam(Request({"CNI_COMMAND": "VERSION"}, b"garbage"))
    assert status == 0
    assert answer == {"cniVersion": "1.1.0", "supportedVersions": list(SUPPORTED_VERSIONS)}


@pytest.mark.parametrize(("environ", "stdin", "code"), [
    ({"CNI_COMMAND": "ADD"}, b"{}", INVALID_ENV),
    ({"CNI_COMMAND": "BOGUS"}, b"{}", INVALID_ENV),
    ({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": ETH0}, b"{not json",
     DECODE_FAILURE),
    ({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": ETH0, "CNI_NETNS": "/x",
      "CNI_PATH": "/x", "CNI_ARGS": "FOO=bar"}, None, UNSUPPORTED_FIELD),
])
def test_errors_are_one_cni_error_object(tmp_path: Path, environ: dict[str, str],
                                         stdin: bytes | None, code: int) -> None:
    body = stdin if stdin is not None else json.dumps(
        network(tmp_path, ipv6_subnet="fd00::/64")).encode()
    status, answer = run_ipam(Request(environ, body))
    assert status == 1 and answer is not None
    assert set(answer) == {"cniVersion", "code", "msg", "details"}
    assert answer["code"] == code


def test_ignore_unknown_cni_args_from_env_or_config(tmp_path: Path) -> None:
    conf = network(tmp_path, ipv6_subnet="fd00::/64")
    assert run_ipam(request("ADD", conf, CNI_ARGS="IgnoreUnknown=1;FOO=bar"))[0] == 0
    with_args = {**conf, "args": {"cni": {"IgnoreUnknown": "true"}}}
    assert run_ipam(request("ADD", with_args, CNI_ARGS="FOO=bar"))[0] == 0


def test_an_unexpected_exception_is_code_199_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> None:
        raise RuntimeError("bug")
    monkeypatch.setattr(allocator, "allocate_all", boom)
    status, answer = run_ipam(request("ADD", network(tmp_path, ipv6_subnet="fd00::/64")))
    assert status == 1 and answer is not None and answer["code"] == INTERNAL_ERROR


@given(st.sampled_from(SUPPORTED_VERSIONS), st.booleans(), st.booleans())
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_add_result_round_trips_through_the_result_model(tmp_path: Path, version: str,
                                                         v6: bool, v4: bool) -> None:
    assume(v6 or v4)
    from netconf.result import Result
    keys: dict[str, Any] = {}
    if v6:
        keys["ipv6_subnet"] = "fd00::/64"
    if v4:
        keys["ipv4_subnet"] = "10.0.0.0/24"
    conf = network(tmp_path, version, **keys)
    status, answer = run_ipam(request("ADD", conf, f"c-{version}-{v6}-{v4}"))
    assert status == 0 and answer is not None
    parsed = Result.from_wire(json.loads(json.dumps(answer)))
    assert [ip.family for ip in parsed.ips] == [f for f, on in ((6, v6), (4, v4)) if on]
    assert parsed.interfaces == []
    assert dispatch.ipam_to_wire(parsed, version) == answer
    assert os.path.isdir(tmp_path / "net1")
