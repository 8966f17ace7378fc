"""galactic's pinned eBPF state as the kernel's own tools print it, as records.

``bpftool -j map dump`` prints each entry's key and value as lists of hex bytes (``"0x0a"``;
a per-CPU map's values per CPU); ``tc -j filter show`` prints a BPF filter with its name and
program. ``egress_route_table`` rows decode per galactic's ``usid.c``: the LPM-trie key is
``prefixlen`` (u32, 40 + the prefix's length), ``table_id`` (u32), ``family`` (u8: 0 IPv6,
1 IPv4) and ``addr[16]``; the value ``sid[16]``, ``link_ifindex`` (u32), ``dmac[6]``, ``smac[6]``;
packed, host byte order for the integers.
"""

from __future__ import annotations

import ipaddress
import json
import struct
from dataclasses import dataclass
from typing import Any

EGRESS_KEY = struct.Struct("<IIB16s")
EGRESS_VALUE = struct.Struct("<16sI6s6s")
EGRESS_KEY_FIXED_BITS = 8 * (4 + 1)  # table_id and family: always matched in full
FAMILY_INET6, FAMILY_INET4 = 0, 1
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class MapEntry:
    """One entry of a map dump: key and value bytes (per CPU for a per-CPU map, else empty)."""

    key: bytes
    value: bytes
    per_cpu: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class EgressRoute:
    """One ``egress_route_table`` row: traffic of table ``table_id`` for ``prefix`` is
    encapsulated to ``sid`` and sent out ``link_ifindex`` from ``smac`` to ``dmac``."""

    table_id: int
    prefix: IPNetwork
    sid: str
    link_ifindex: int
    dmac: str
    smac: str


@dataclass(frozen=True)
class TcFilter:
    """A tc filter on a hook: its priority, kind and, for a BPF filter, its name (what the
    loader called it), its program's name and id, and whether it runs in direct-action mode."""

    pref: int
    kind: str
    name: str
    program: str
    program_id: int
    direct_action: bool


def _bytes(hex_list: list[str]) -> bytes:
    return bytes(int(item, 16) for item in hex_list)


def parse_map_dump(text: str) -> list[MapEntry]:
    """``bpftool -j map dump`` output as entries (a BTF ``formatted`` view is ignored)."""
    entries = []
    for item in json.loads(text or "[]"):
        per_cpu = tuple(_bytes(cpu["value"]) for cpu in item.get("values") or [])
        entries.append(MapEntry(_bytes(item["key"]), _bytes(item.get("value") or []), per_cpu))
    return entries


def _mac(raw: bytes) -> str:
    return ":".join(f"{byte:02x}" for byte in raw)


def decode_egress_route(entry: MapEntry) -> EgressRoute:
    """An ``egress_route_table`` entry as a row; ValueError when it is not one."""
    if len(entry.key) != EGRESS_KEY.size or len(entry.value) != EGRESS_VALUE.size:
        raise ValueError(f"not an egress_route_table entry: key {entry.key.hex()}, "
                         f"value {entry.value.hex()}")
    prefixlen, table_id, family, addr = EGRESS_KEY.unpack(entry.key)
    bits = prefixlen - EGRESS_KEY_FIXED_BITS
    network: IPNetwork
    if family == FAMILY_INET4:
        network = ipaddress.IPv4Network((addr[:4], bits))
    elif family == FAMILY_INET6:
        network = ipaddress.IPv6Network((addr, bits))
    else:
        raise ValueError(f"egress_route_table key {entry.key.hex()}: unknown family {family}")
    sid, ifindex, dmac, smac = EGRESS_VALUE.unpack(entry.value)
    return EgressRoute(table_id, network, str(ipaddress.IPv6Address(sid)), ifindex, _mac(dmac),
                       _mac(smac))


def parse_tc_filters(text: str) -> list[TcFilter]:
    """``tc -j filter show`` output: the filters that carry options (tc also prints a bare
    line per priority and protocol)."""
    filters = []
    shown: list[dict[str, Any]] = json.loads(text or "[]")
    for item in shown:
        options = item.get("options")
        if options is None:
            continue
        program = options.get("prog") or {}
        filters.append(TcFilter(pref=int(item.get("pref", 0)), kind=str(item.get("kind", "")),
                                name=str(options.get("bpf_name", "")),
                                program=str(program.get("name", "")),
                                program_id=int(program.get("id", 0)),
                                direct_action=bool(options.get("direct-action", False))))
    return filters
