"""Per-VPC routing isolation: a VRF device, or a routing table with `iif` policy rules.

The VPC's table id is the lowest id not reserved and not used by any rule or VRF, chosen under
a host-wide lock. In `table` mode the rules themselves record which table a VPC owns, so nothing
else needs to be stored. Shared per-VPC state is never deleted by DEL or rollback.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni_plugin import naming
from cni_plugin.kernel import links
from cni_plugin.kernel.links import kernel_errors
from netconf.errors import KERNEL_FAILURE, CniError

RESERVED_TABLES = frozenset({0, 253, 254, 255})
MAX_TABLE = 2**32 - 1
RULE_PRIORITY = 1000
# Keeps lookups that miss the VPC table from falling through to the main table.
UNREACHABLE_METRIC = 4278198272
FAMILIES = (socket.AF_INET, socket.AF_INET6)


@dataclass(frozen=True)
class VpcTable:
    """Where a VPC's routes live."""

    table: int
    vrf_index: int | None  # the VRF device to enslave host links to (vrf mode)


def _rule_table(msg: Any) -> int:
    table = msg.get("FRA_TABLE")
    return int(table if table is not None else msg["table"])


def used_tables(ipr: IPRoute) -> set[int]:
    """Table ids referenced by any policy rule or VRF device."""
    used = set(RESERVED_TABLES)
    for family in FAMILIES:
        used.update(_rule_table(msg) for msg in ipr.get_rules(family=family))
    for msg in ipr.get_links():
        info = msg.get("IFLA_LINKINFO")
        if info is not None and info.get("IFLA_INFO_KIND") == "vrf":
            used.add(int(info.get("IFLA_INFO_DATA").get("IFLA_VRF_TABLE")))
    return used


def lowest_free_table(used: set[int]) -> int:
    """The lowest table id not in used (reserved ids are in used)."""
    table = 1
    while table in used:
        table += 1
    if table > MAX_TABLE:
        raise CniError(KERNEL_FAILURE, "no free routing table id left")
    return table


def _vrf_table(link: links.Link, ipr: IPRoute) -> int:
    msg = ipr.get_links(link.index)[0]
    return int(msg.get("IFLA_LINKINFO").get("IFLA_INFO_DATA").get("IFLA_VRF_TABLE"))


def _rules_for_vpc(ipr: IPRoute, vpc: str) -> dict[str, int]:
    """iif name -> table of our rules for the VPC's host links."""
    prefix = "G" + naming.pad_base62(vpc, naming.VPC_WIDTH)
    found: dict[str, int] = {}
    for family in FAMILIES:
        for msg in ipr.get_rules(family=family):
            iif = msg.get("FRA_IIFNAME")
            if iif and iif.startswith(prefix) and iif.endswith("H") \
                    and len(iif) == len(prefix) + naming.ATTACHMENT_WIDTH + 1:
                found[iif] = _rule_table(msg)
    return found


def ensure_vrf(ipr: IPRoute, vpc: str) -> VpcTable:
    """The VPC's VRF, created with a fresh table if missing (call under the host lock)."""
    name = naming.vrf_name(vpc)
    existing = links.find(ipr, name)
    if existing is not None:
        if existing.kind != "vrf":
            raise CniError(KERNEL_FAILURE, f"link {name!r} exists and is not a VRF",
                           f"kind {existing.kind!r}")
        if not existing.up:
            links.configure(ipr, existing, up=True)
        return VpcTable(_vrf_table(existing, ipr), existing.index)
    table = lowest_free_table(used_tables(ipr))
    try:
        ipr.link("add", ifname=name, kind="vrf", vrf_table=table)
    except NetlinkError as exc:
        if exc.code == errno.EOPNOTSUPP or "Unknown device type" in str(exc):
            raise CniError(KERNEL_FAILURE, "this kernel has no VRF support (isolation 'vrf')",
                           "load the vrf module or configure \"isolation\": \"table\"") from None
        with kernel_errors("create VRF", name):
            raise
    created = links.find(ipr, name)
    if created is None:
        raise CniError(KERNEL_FAILURE, f"VRF {name!r} vanished after creation")
    links.configure(ipr, created, up=True)
    _add_unreachable_defaults(ipr, table)
    return VpcTable(table, created.index)


def ensure_table_rules(ipr: IPRoute, vpc: str, host_link: str) -> VpcTable:
    """The VPC's table (reused from its rules, else allocated) and `iif host_link` rules."""
    rules = _rules_for_vpc(ipr, vpc)
    table = next(iter(rules.values()), None)
    if table is None:
        table = lowest_free_table(used_tables(ipr))
        _add_unreachable_defaults(ipr, table)
    for family in FAMILIES:
        if not _has_rule(ipr, family, host_link, table):
            with kernel_errors("add policy rule for", host_link):
                ipr.rule("add", family=family, iifname=host_link, table=table,
                         priority=RULE_PRIORITY)
    return VpcTable(table, None)


def _has_rule(ipr: IPRoute, family: int, iif: str, table: int) -> bool:
    return any(msg.get("FRA_IIFNAME") == iif and _rule_table(msg) == table
               for msg in ipr.get_rules(family=family))


def find_vpc_table(ipr: IPRoute, vpc: str, mode: str) -> int | None:
    """The VPC's table if it has one already (read-only; for CHECK)."""
    if mode == "vrf":
        vrf = links.find(ipr, naming.vrf_name(vpc))
        return _vrf_table(vrf, ipr) if vrf is not None and vrf.kind == "vrf" else None
    rules = _rules_for_vpc(ipr, vpc)
    return next(iter(rules.values()), None)


def has_table_rules(ipr: IPRoute, host_link: str, table: int) -> bool:
    """True when both families' `iif host_link lookup table` rules exist."""
    return all(_has_rule(ipr, family, host_link, table) for family in FAMILIES)


def _add_unreachable_defaults(ipr: IPRoute, table: int) -> None:
    for family, dst in ((socket.AF_INET, "0.0.0.0/0"), (socket.AF_INET6, "::/0")):
        with kernel_errors("add unreachable default to table", str(table)):
            ipr.route("replace", family=family, dst=dst, table=table, type="unreachable",
                      priority=UNREACHABLE_METRIC)


def vrf_supported(ipr: IPRoute) -> bool:
    """True when the kernel can create VRF devices (probed with a throwaway device)."""
    probe = f"vpaprobe{os.getpid() % 10**7}"
    try:
        ipr.link("add", ifname=probe, kind="vrf", vrf_table=MAX_TABLE - 1)
    except NetlinkError as exc:
        return bool(exc.code == errno.EEXIST)
    links.ignore_missing(lambda: ipr.link("del", ifname=probe))
    return True
