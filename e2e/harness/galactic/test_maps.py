"""The galactic datapath harness's parsers: bpftool's JSON map dumps, egress_route_table rows
(galactic's packed layout), tc's JSON filter listing and the sweep program's output."""

from __future__ import annotations

import ipaddress
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.harness.galactic.maps import (
    EgressRoute,
    MapEntry,
    TcFilter,
    decode_egress_route,
    parse_map_dump,
    parse_tc_filters,
)
from e2e.harness.galactic.sweep import SweepResult, parse_sweep_result

networks = st.one_of(
    st.builds(lambda a, n: ipaddress.ip_network(f"{a}/{n}", strict=False),
              st.ip_addresses(v=4), st.integers(0, 32)),
    st.builds(lambda a, n: ipaddress.ip_network(f"{a}/{n}", strict=False),
              st.ip_addresses(v=6), st.integers(0, 128)))
macs = st.binary(min_size=6, max_size=6).map(lambda raw: ":".join(f"{b:02x}" for b in raw))
rows = st.builds(EgressRoute, table_id=st.integers(0, 2**32 - 1), prefix=networks,
                 sid=st.ip_addresses(v=6).map(str), link_ifindex=st.integers(0, 2**32 - 1),
                 dmac=macs, smac=macs)


def _entry(row: EgressRoute) -> MapEntry:
    """The row as galactic's Go side writes it (usid.c's packed structs, little-endian)."""
    family = 1 if row.prefix.version == 4 else 0
    key = struct.pack("<IIB", 40 + row.prefix.prefixlen, row.table_id, family) + \
        row.prefix.network_address.packed.ljust(16, b"\0")
    value = ipaddress.IPv6Address(row.sid).packed + struct.pack("<I", row.link_ifindex) + \
        bytes.fromhex(row.dmac.replace(":", "")) + bytes.fromhex(row.smac.replace(":", ""))
    return MapEntry(key, value)


def _hex(raw: bytes) -> list[str]:
    return [f"0x{byte:02x}" for byte in raw]


@given(rows)
def test_egress_route_rows_decode_from_galactics_layout(row: EgressRoute) -> None:
    assert decode_egress_route(_entry(row)) == row


@given(st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=40)), max_size=5))
def test_bpftool_dump_parses_to_the_bytes_it_printed(pairs: list[tuple[bytes, bytes]]) -> None:
    text = json.dumps([{"key": _hex(key), "value": _hex(value),
                        "formatted": {"key": 1, "value": {"x": 2}}} for key, value in pairs])
    assert parse_map_dump(text) == [MapEntry(key, value) for key, value in pairs]


def test_bpftool_dump_of_a_per_cpu_map_keeps_each_cpus_value() -> None:
    text = json.dumps([{"key": ["0x01", "0x00", "0x00", "0x00"],
                        "values": [{"cpu": 0, "value": ["0x05"]}, {"cpu": 1, "value": ["0x00"]}]}])
    assert parse_map_dump(text) == [MapEntry(b"\x01\0\0\0", b"", (b"\x05", b"\x00"))]


def test_an_entry_of_another_map_is_not_an_egress_route() -> None:
    with pytest.raises(ValueError, match="not an egress_route_table entry"):
        decode_egress_route(MapEntry(b"\0" * 8, b"\0" * 16))


def test_an_unknown_family_is_refused() -> None:
    key = struct.pack("<IIB", 40, 1, 7) + b"\0" * 16
    with pytest.raises(ValueError, match="unknown family 7"):
        decode_egress_route(MapEntry(key, b"\0" * 32))


def test_tc_listing_yields_the_bpf_filter_with_its_name_and_program() -> None:
    text = json.dumps([
        {"protocol": "all", "pref": 1, "kind": "bpf", "chain": 0},
        {"protocol": "all", "pref": 1, "kind": "bpf", "chain": 0,
         "options": {"handle": "0x1", "bpf_name": "galactic_usid_ingress", "direct-action": True,
                     "not_in_hw": True,
                     "prog": {"id": 42, "name": "usid_ingress", "tag": "00ff", "jited": 1}}}])
    assert parse_tc_filters(text) == [
        TcFilter(1, "bpf", "galactic_usid_ingress", "usid_ingress", 42, True)]


@given(st.lists(st.integers(0, 1000), min_size=5, max_size=5), st.text())
def test_sweep_output_parses_to_its_cleanup_result(counts: list[int], log: str) -> None:
    names = ("OrphanedCRDsRemoved", "OrphanedVRFsRemoved", "EBPFVRFEntriesRemoved",
             "EBPFNPTv6EntriesRemoved", "Errors")
    stdout = json.dumps(dict(zip(names, counts, strict=True))) + "\n"
    crds, vrfs, vrf_entries, nptv6_entries, errors = counts
    assert parse_sweep_result(stdout, log) == SweepResult(crds, vrfs, vrf_entries, nptv6_entries,
                                                          errors, log)
