"""Per-VPC routing isolation: a VRF device, or a routing table with `iif` policy rules.

The VPC's table id is the lowest id not reserved and not used by any rule or VRF, chosen under
a host-wide lock. In `table` mode the rules themselves record which table a VPC owns, so nothing
else needs to be stored. Shared per-VPC state is never deleted by DEL or rollback.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from dataclasses import dataclass

from cni_plugin.core import naming
from cni_plugin.kernel import links
from cni_plugin.kernel.links import kernel_errors
from cni_plugin.kernel.rtnl import RTN_UNREACHABLE, NetlinkError, Rtnl, RuleMsg
from netconf.errors import KERNEL_FAILURE, CniError

RESERVED_TABLES = frozenset({0, 253, 254, 255})
MAX_TABLE = 2**32 - 1
RULE_PRIORITY = 1000
# Keeps lookups that miss the VPC table from falling through to the main table.
UNREACHABLE_METRIC = 4278198272
FAMILIES = (socket.AF_INET, socket.AF_INET6)
DEFAULT_DSTS = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))

# Policy rules per family, read once per operation.
Rules = dict[int, list[RuleMsg]]


@dataclass(frozen=True)
class VpcTable:
    """Where a VPC's routes live."""

    table: int
    vrf_index: int | None  # the VRF device to enslave host links to (vrf mode)


def all_rules(rtnl: Rtnl) -> Rules:
    """Every policy rule, per family (read once, pass to several lookups below); consistent,
    as they decide which table a VPC gets."""
    with kernel_errors("list", "policy rules"):
        return {family: rtnl.rules(family, consistent=True) for family in FAMILIES}


def used_tables(rtnl: Rtnl, rules: Rules | None = None) -> set[int]:
    """Table ids referenced by any policy rule or VRF device."""
    used = set(RESERVED_TABLES)
    for family_rules in (rules or all_rules(rtnl)).values():
        used.update(rule.table for rule in family_rules)
    with kernel_errors("list", "links"):
        used.update(link.vrf_table for link in rtnl.links(consistent=True)
                    if link.kind == "vrf" and link.vrf_table is not None)
    return used


def lowest_free_table(used: set[int]) -> int:
    """The lowest table id not in used (reserved ids are in used)."""
    table = 1
    while table in used:
        table += 1
    if table > MAX_TABLE:
        raise CniError(KERNEL_FAILURE, "no free routing table id left")
    return table


def _vrf_table(link: links.Link, rtnl: Rtnl) -> int:
    with kernel_errors("read the table of VRF", link.name):
        table = rtnl.get_link(index=link.index).vrf_table
    if table is None:
        raise CniError(KERNEL_FAILURE, f"VRF {link.name!r} reports no routing table")
    return table


def _rules_for_vpc(rules: Rules, vpc: str) -> dict[str, int]:
    """iif name -> table of our rules for the VPC's host links."""
    prefix = "G" + naming.pad_base62(vpc, naming.VPC_WIDTH)
    found: dict[str, int] = {}
    for family in FAMILIES:
        for rule in rules[family]:
            iif = rule.iifname
            if iif and iif.startswith(prefix) and iif.endswith("H") \
                    and len(iif) == len(prefix) + naming.ATTACHMENT_WIDTH + 1:
                found[iif] = rule.table
    return found


def ensure_vrf(rtnl: Rtnl, vpc: str) -> VpcTable:
    """The VPC's VRF, created with a fresh table if missing (call under the host lock)."""
    name = naming.vrf_name(vpc)
    existing = links.find(rtnl, name)
    if existing is not None:
        if existing.kind != "vrf":
            raise CniError(KERNEL_FAILURE, f"link {name!r} exists and is not a VRF",
                           f"kind {existing.kind!r}")
        if not existing.up:
            links.configure(rtnl, existing, up=True)
        return VpcTable(_vrf_table(existing, rtnl), existing.index)
    table = lowest_free_table(used_tables(rtnl))
    try:
        rtnl.new_vrf(name, table)
    except NetlinkError as exc:
        if exc.code == errno.EOPNOTSUPP or "Unknown device type" in str(exc):
            raise CniError(KERNEL_FAILURE, "this kernel has no VRF support (isolation 'vrf')",
                           "load the vrf module or configure \"isolation\": \"table\"") from None
        with kernel_errors("create VRF", name):
            raise
    created = links.find(rtnl, name)
    if created is None:
        raise CniError(KERNEL_FAILURE, f"VRF {name!r} vanished after creation")
    links.configure(rtnl, created, up=True)
    _add_unreachable_defaults(rtnl, table)
    return VpcTable(table, created.index)


def ensure_table_rules(rtnl: Rtnl, vpc: str, host_link: str) -> VpcTable:
    """The VPC's table (reused from its rules, else allocated) and `iif host_link` rules."""
    rules = all_rules(rtnl)
    table = next(iter(_rules_for_vpc(rules, vpc).values()), None)
    if table is None:
        table = lowest_free_table(used_tables(rtnl, rules))
        _add_unreachable_defaults(rtnl, table)
    for family in FAMILIES:
        if not _has_rule(rules[family], host_link, table):
            with kernel_errors("add policy rule for", host_link):
                try:
                    rtnl.new_rule(family, host_link, table, RULE_PRIORITY)
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST:
                        raise
    return VpcTable(table, None)


def _has_rule(family_rules: list[RuleMsg], iif: str, table: int) -> bool:
    return any(rule.iifname == iif and rule.table == table for rule in family_rules)


def find_vpc_table(rtnl: Rtnl, vpc: str, mode: str, rules: Rules | None = None) -> int | None:
    """The VPC's table if it has one already (read-only; for CHECK)."""
    if mode == "vrf":
        vrf = links.find(rtnl, naming.vrf_name(vpc))
        return _vrf_table(vrf, rtnl) if vrf is not None and vrf.kind == "vrf" else None
    found = _rules_for_vpc(rules or all_rules(rtnl), vpc)
    return next(iter(found.values()), None)


def has_table_rules(rtnl: Rtnl, host_link: str, table: int,
                    rules: Rules | None = None) -> bool:
    """True when both families' `iif host_link lookup table` rules exist."""
    rules = rules or all_rules(rtnl)
    return all(_has_rule(rules[family], host_link, table) for family in FAMILIES)



def _add_unreachable_defaults(rtnl: Rtnl, table: int) -> None:
    for dst in DEFAULT_DSTS:
        with kernel_errors("add unreachable default to table", str(table)):
            rtnl.replace_route(dst, table=table, rtype=RTN_UNREACHABLE,
                               priority=UNREACHABLE_METRIC)


def vrf_supported(rtnl: Rtnl) -> bool:
    """True when the kernel can create VRF devices (probed with a throwaway device)."""
    probe = f"vpaprobe{os.getpid() % 10**7}"
    try:
        rtnl.new_vrf(probe, MAX_TABLE - 1)
    except NetlinkError as exc:
        return bool(exc.code == errno.EEXIST)
    links.ignore_missing(lambda: rtnl.del_link(name=probe))
    return True
