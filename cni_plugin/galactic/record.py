"""The on-node record of what each attachment registered in galactic's datapath:
`<lockDir>/galactic/<container>@<ifname>.json`, the rows it wrote and the shared rows it relies
on, written before the rows are (so DEL and GC need no prevResult, and a row two attachments
share stays while either lists it)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator

from cni_plugin.core import records
from cni_plugin.galactic import layout
from cni_plugin.galactic.layout import (
    MapLayout,
)
from netconf.formats import check_format, versioned

RECORDS_DIR = "galactic"  # under the host's lockDir: one record per registered attachment


def listed_by_others(lock_dir: str, own: str) -> frozenset[tuple[str, bytes]]:
    """(map, key) of every row a registration other than the record `own` lists or relies
    on."""
    return frozenset((m.name, k) for other in record_paths(lock_dir) if other != own
                     for m, k in listed(other))


def record_paths(lock_dir: str) -> list[str]:
    """Every registration record on this node."""
    directory = os.path.join(lock_dir, RECORDS_DIR)
    try:
        return [os.path.join(directory, name) for name in sorted(os.listdir(directory))
                if name.endswith(".json")]
    except FileNotFoundError:
        return []


def record_path(lock_dir: str, container_id: str, ifname: str) -> str:
    """Where a (container, ifname)'s registration is recorded (container IDs hold no '@')."""
    return os.path.join(lock_dir, RECORDS_DIR, f"{container_id}@{ifname}.json")


def write_record(lock_dir: str, container_id: str, ifname: str, *, network: str,
                 host_link: str, rows: Iterable[tuple[MapLayout, bytes, bytes]],
                 uses: Iterable[tuple[MapLayout, bytes]], pod_netns: str = "") -> None:
    """Record an attachment's rows (and the shared rows it relies on) before they are written
    (atomically); a veth's Pod netns too (an optional key: older records have none)."""
    body = versioned({"network": network, "hostLink": host_link,
                      "rows": [[m.name, k.hex(), v.hex()] for m, k, v in rows],
                      "uses": [[m.name, k.hex()] for m, k in uses],
                      **({"podNetns": pod_netns} if pod_netns else {})})
    records.write_record(record_path(lock_dir, container_id, ifname), json.dumps(body),
                         "the galactic registration")


_BY_NAME = {m.name: m for m in layout.MAPS}
RECORD = "the record of an attachment's rows in galactic's datapath"


def read_record(path: str) -> list[tuple[MapLayout, bytes, bytes]] | None:
    """The rows a record lists, or None when it is absent or unreadable (code 108 when a newer
    release wrote it)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        check_format(data, path, RECORD)
        return [(_BY_NAME[name], bytes.fromhex(key), bytes.fromhex(value))
                for name, key, value in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pod_end(path: str) -> tuple[str, str] | None:
    """A veth registration's Pod end: (its netns, its name); None for a tap, or a record
    written before vpc-attach kept it."""
    try:
        with open(path, encoding="utf-8") as handle:
            pod_netns = json.load(handle).get("podNetns")
    except (OSError, ValueError, AttributeError):
        return None
    ifname = os.path.basename(path).rpartition(".")[0].partition("@")[2]
    return (pod_netns, ifname) if isinstance(pod_netns, str) and pod_netns and ifname else None


def listed(path: str) -> list[tuple[MapLayout, bytes]]:
    """(map, key) of the rows a record lists as its own or relies on (code 108 when a newer
    release wrote it: its rows are never taken for unused)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        check_format(data, path, RECORD)
        return [(_BY_NAME[row[0]], bytes.fromhex(row[1]))
                for row in [*data["rows"], *data.get("uses", [])]]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return []


def forget(lock_dir: str, container_id: str, ifname: str) -> None:
    """Drop a record (DEL done, ADD rolled back)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(lock_dir, container_id, ifname))


def records_of(lock_dir: str, network: str) -> Iterator[tuple[str, str]]:
    """(containerID, ifname) of the registrations recorded for network on this node."""
    directory = os.path.join(lock_dir, RECORDS_DIR)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return
    for name in names:
        stem, _, ext = name.rpartition(".")
        container_id, at, ifname = stem.partition("@")
        if ext != "json" or not at:
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            continue
        check_format(data, path, RECORD)
        if isinstance(data, dict) and data.get("network") == network:
            yield container_id, ifname
