"""What one ADD wrote into galactic's pinned maps and onto its host link, read by the kernel's
own tools (`bpftool`, `tc`), normalised only where two attachments of the same Pod must differ
(SPEC §15: the rows vpc-attach writes equal the rows galactic-bgp writes).

Layouts from galactic's ``prog/usid.c`` (packed, host byte order). What is normalised, and why
(``EXCEPTIONS``): the VPC's Linux table id (each chain's VRF takes a free one), the host link's
ifindex (each ADD makes its own veth), and the monotonic times a write stamps (`generation`).
The traffic counters usid_ingress keeps in `vrf_table` are zero on a fresh row and compared.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.galactic.maps import parse_map_dump, parse_tc_filters

RUN_TIMEOUT_S = 120.0
TABLE, IFINDEX, TIME = "<table>", "<ifindex>", "<time>"
# (map, "key" or "value", first byte, end byte, token, why): the only bytes not compared.
EXCEPTIONS: tuple[tuple[str, str, int, int, str, str], ...] = (
    ("egress_route_table", "key", 4, 8, TABLE,
     "the VPC's Linux table id: each chain's VRF takes a free table"),
    ("vrf_table", "value", 0, 4, TABLE,
     "the VPC's Linux table id: each chain's VRF takes a free table"),
    ("vrf_table", "value", 32, 40, TIME, "`generation`: the monotonic time of the write"),
    ("ifindex_vrf_table", "key", 0, 4, IFINDEX,
     "the host link's ifindex: each ADD makes its own veth"),
    ("locator_table", "value", 0, 8, TIME, "`generation`: the monotonic time of the write"),
)


@dataclass(frozen=True)
class Row:
    """One row as written: its map, key and value (hex), and the same normalised."""

    map: str
    key: str
    value: str

    def normalised(self) -> tuple[str, str, str]:
        """(map, key, value) with the EXCEPTIONS' bytes replaced by their tokens."""
        return (self.map, _mask(self.map, "key", self.key), _mask(self.map, "value",
                                                                  self.value))


def _mask(map_name: str, part: str, hex_bytes: str) -> str:
    raw = bytes.fromhex(hex_bytes)
    pieces: list[str] = []
    at = 0
    for name, where, start, end, token, _ in sorted(EXCEPTIONS, key=lambda e: e[2]):
        if name == map_name and where == part and len(raw) >= end:
            pieces += [raw[at:start].hex(), token]
            at = end
    return "".join([*pieces, raw[at:].hex()])


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def pinned_maps(pin_dir: Path) -> list[str]:
    """The names of every map pinned in the directory (programs left out)."""
    names = []
    for entry in sorted(pin_dir.iterdir()):
        shown = subprocess.run(["bpftool", "-j", "map", "show", "pinned", str(entry)],
                               capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                               check=False)
        if shown.returncode == 0:
            names.append(entry.name)
    return names


Snapshot = dict[str, dict[str, str]]  # map -> {key hex: value hex}


def snapshot(pin_dir: Path, names: Iterable[str]) -> Snapshot:
    """Every row of the named maps, as `bpftool map dump` reads them (per-CPU values joined)."""
    taken: Snapshot = {}
    for name in names:
        entries = parse_map_dump(_run(["bpftool", "-j", "map", "dump", "pinned",
                                       str(pin_dir / name)]))
        taken[name] = {e.key.hex(): (e.value or b"".join(e.per_cpu)).hex() for e in entries}
    return taken


def written(before: Snapshot, after: Snapshot) -> set[Row]:
    """The rows that appeared or changed between two snapshots."""
    return {Row(name, key, value) for name, rows in after.items()
            for key, value in rows.items() if before.get(name, {}).get(key) != value}


def removed(before: Snapshot, after: Snapshot) -> set[Row]:
    """The rows of `before` that are gone in `after`."""
    return {Row(name, key, value) for name, rows in before.items()
            for key, value in rows.items() if key not in after.get(name, {})}


@dataclass(frozen=True, order=True)
class Filter:
    """A tc filter on one hook of a link, as `tc -j filter show` reads it."""

    hook: str
    pref: int
    kind: str
    name: str
    program: str
    program_id: int
    direct_action: bool


def tc_filters(netns: str, link: str) -> set[Filter]:
    """Every filter on both clsact hooks of the link."""
    found = set()
    for hook in ("ingress", "egress"):
        shown = subprocess.run(["tc", "-n", netns, "-j", "filter", "show", "dev", link, hook],
                               capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                               check=False)
        for item in parse_tc_filters(shown.stdout if shown.returncode == 0 else "[]"):
            found.add(Filter(hook, item.pref, item.kind, item.name, item.program,
                             item.program_id, item.direct_action))
    return found


def exception_lines() -> list[str]:
    """The normalisations as markdown rows (map, part, bytes, why)."""
    return [f"| {name} | {part} bytes {start}-{end - 1} | {why} |"
            for name, part, start, end, _, why in EXCEPTIONS]


def comparison(theirs: set[tuple[str, str, str]], ours: set[tuple[str, str, str]]
               ) -> list[str]:
    """Normalised rows side by side, a markdown table: map, key, galactic-bgp, vpc-attach."""
    keys = sorted({(m, k) for m, k, _ in theirs | ours})

    def value(found: set[tuple[str, str, str]], map_name: str, key: str) -> str:
        return next((v for m, k, v in found if (m, k) == (map_name, key)), "-")
    return ["| map | key | galactic-bgp | vpc-attach |", "|---|---|---|---|",
            *(f"| {m} | {k} | {value(theirs, m, k)} | {value(ours, m, k)} |" for m, k in keys)]


def as_json(rows: Iterable[Row]) -> str:
    """Rows for a failure message."""
    return json.dumps(sorted(r.normalised() for r in rows), indent=1)


# Clearing what each chain writes, so that the next one's writes show --------------------

NODE_ARRAYS = {"node_src_addr_table": 16, "public_uplink_table": 16}  # value sizes


def _bpftool_map(pin_dir: Path, name: str, verb: str, *argv: str, check: bool = True) -> None:
    subprocess.run(["bpftool", "map", verb, "pinned", str(pin_dir / name), *argv],
                   check=check, capture_output=True, timeout=RUN_TIMEOUT_S)


def _hex_args(hex_bytes: str) -> list[str]:
    return ["hex", *(hex_bytes[i:i + 2] for i in range(0, len(hex_bytes), 2))]


def reset_node_rows(pin_dir: Path) -> None:
    """The node's own rows, which every registering ADD writes (locator, End.DT46, source
    address, uplink), cleared: the next ADD's writes then show in its diff."""
    for name in ("locator_table", "function_table"):
        for key in snapshot(pin_dir, [name])[name]:
            _bpftool_map(pin_dir, name, "delete", "key", *_hex_args(key))
    for name, size in NODE_ARRAYS.items():
        _bpftool_map(pin_dir, name, "update", "key", *_hex_args("00000000"), "value",
                     *_hex_args("00" * size))


def forget(pin_dir: Path, rows: Iterable[Row]) -> None:
    """Delete rows an ADD wrote and its DEL left behind (galactic-bgp's: its GC's job);
    the node's array rows stay."""
    for row in rows:
        if row.map not in NODE_ARRAYS:
            _bpftool_map(pin_dir, row.map, "delete", "key", *_hex_args(row.key), check=False)
