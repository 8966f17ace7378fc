"""Per-VPC routing isolation: a VRF device, or a routing table selected by a packet mark.

The VPC's table id is the lowest id not reserved and not used by any rule or VRF, chosen under
a host-wide lock. In `table` mode a VPC costs two policy rules whatever its number of
attachments (`fwmark` of the VPC -> its table; the host filter copies a host link's device
group into the mark) and one record rule that never matches (`iif G{vpc}V`, after the main
table) saying which table the VPC owns. State of a VPC with no host link left is removed by
`release` (DEL, GC); a table id is emptied before it is given to a VPC.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cni_plugin.core import naming
from cni_plugin.kernel import links
from cni_plugin.kernel.links import kernel_errors
from cni_plugin.kernel.rtnl import RTN_UNREACHABLE, NetlinkError, RouteMsg, Rtnl, RuleMsg
from netconf.errors import KERNEL_FAILURE, CniError

RESERVED_TABLES = frozenset({0, 253, 254, 255})
MAX_TABLE = 2**32 - 1
RULE_PRIORITY = 1000
RECORD_PRIORITY = 40000  # after main and default: lookups that reach it have missed anyway
MARK_SHIFT = 16
MARK_MASK = 0x0FFF0000  # the packet-mark bits vpc-attach owns (docs/architecture.md)
MAX_MARK_TABLE = MARK_MASK >> MARK_SHIFT
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
    group: int | None = None  # the device group of its host links (table mode: the mark)


def vpc_mark(table: int) -> int:
    """The packet mark (and host-link device group) selecting a table-mode VPC's table."""
    return table << MARK_SHIFT


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


def _legacy_rules(rules: Rules, vpc: str) -> list[RuleMsg]:
    """`iif G…H` rules of the VPC's host links that earlier versions added per attachment."""
    return [rule for family in FAMILIES for rule in rules[family]
            if rule.iifname and rule.priority == RULE_PRIORITY
            and naming.is_host_link_of(rule.iifname, vpc)]


def _recorded_table(rules: Rules, vpc: str) -> int | None:
    record = naming.vrf_name(vpc)
    return next((rule.table for rule in rules[socket.AF_INET]
                 if rule.iifname == record and rule.priority == RECORD_PRIORITY), None)


def _has_mark_rule(family_rules: list[RuleMsg], table: int) -> bool:
    return any(rule.fwmark == vpc_mark(table) and rule.table == table
               and rule.priority == RULE_PRIORITY and not rule.iifname for rule in family_rules)


def ensure_vrf(rtnl: Rtnl, vpc: str, kept: Mapping[str, int] | None = None,
               avoid: Callable[[], set[int]] | None = None) -> VpcTable:
    """The VPC's VRF, created if missing (call under the host lock) with the table id the VPC
    keeps (`kept`: {VRF name: table id}, `tableids`), else the lowest id free of rules, VRFs,
    ids other VPCs keep and `avoid()` (ids still named elsewhere, e.g. by galactic's maps)."""
    name = naming.vrf_name(vpc)
    existing = links.find(rtnl, name)
    if existing is not None:
        if existing.kind != "vrf":
            raise CniError(KERNEL_FAILURE, f"link {name!r} exists and is not a VRF",
                           f"kind {existing.kind!r}")
        if not existing.up:
            links.configure(rtnl, existing, up=True)
        return VpcTable(_vrf_table(existing, rtnl), existing.index)
    kept = kept or {}
    used = used_tables(rtnl)
    table = kept.get(name)
    if table is not None and table in used:
        raise CniError(KERNEL_FAILURE, f"table {table}, which VPC {vpc!r} keeps while its "
                       "BGPVRFInstance exists on this node, is used by another rule or VRF",
                       "galactic-router keys the VPC's routes by it; delete what uses it")
    if table is None:
        others = {kept_table for vrf, kept_table in kept.items() if vrf != name}
        table = lowest_free_table(used | others | (avoid() if avoid else set()))
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


def ensure_table(rtnl: Rtnl, vpc: str, avoid: Callable[[], set[int]] | None = None) -> VpcTable:
    """The VPC's table (from its record, else a fresh, emptied id not in `avoid()`) with its
    two mark rules (call under the host lock)."""
    rules = all_rules(rtnl)
    table = _recorded_table(rules, vpc)
    if table is None:
        table = lowest_free_table(used_tables(rtnl, rules) | (avoid() if avoid else set()))
        if table > MAX_MARK_TABLE:
            raise CniError(KERNEL_FAILURE, f"no routing table id up to {MAX_MARK_TABLE} is free",
                           "table mode marks packets with the table id in 12 bits")
        _flush_table(rtnl, table)  # a reused id starts clean
        _add_rule(rtnl, socket.AF_INET, naming.vrf_name(vpc), table, RECORD_PRIORITY)
        _add_unreachable_defaults(rtnl, table)
    for family in FAMILIES:
        if not _has_mark_rule(rules[family], table):
            _add_rule(rtnl, family, None, table, RULE_PRIORITY, vpc_mark(table))
    return VpcTable(table, None, vpc_mark(table))


def _add_rule(rtnl: Rtnl, family: int, iifname: str | None, table: int, priority: int,
              fwmark: int | None = None) -> None:
    with kernel_errors("add policy rule for table", str(table)):
        try:
            rtnl.new_rule(family, iifname, table, priority, fwmark, MARK_MASK if fwmark else None)
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise


def release(rtnl: Rtnl, vpc: str) -> int | None:
    """Remove the VPC's VRF or table record, mark rules, per-attachment rules of earlier
    versions and every route of its table, when no host link of the VPC is left (call under
    the host lock and the VPC's exclusive lock); the table released, if any."""
    if any(naming.is_host_link_of(link.name, vpc) for link in links.all_links(rtnl)):
        return None
    rules = all_rules(rtnl)
    legacy = _legacy_rules(rules, vpc)
    for rule in legacy:
        _delete_rule(rtnl, rule.family, rule.iifname, rule.table, RULE_PRIORITY)
    table = _recorded_table(rules, vpc) or next((rule.table for rule in legacy), None)
    vrf = links.find(rtnl, naming.vrf_name(vpc))
    if vrf is not None and vrf.kind == "vrf":
        table = _vrf_table(vrf, rtnl)
        links.delete(rtnl, vrf)
    elif table is not None:
        for family in FAMILIES:
            if _has_mark_rule(rules[family], table):
                _delete_rule(rtnl, family, None, table, RULE_PRIORITY, vpc_mark(table))
        _delete_rule(rtnl, socket.AF_INET, naming.vrf_name(vpc), table, RECORD_PRIORITY)
    if table is not None:
        _flush_table(rtnl, table)
    return table


def _delete_rule(rtnl: Rtnl, family: int, iifname: str | None, table: int, priority: int,
                 fwmark: int | None = None) -> None:
    with kernel_errors("delete policy rule for table", str(table)):
        links.ignore_missing(lambda: rtnl.del_rule(family, iifname, table, priority, fwmark,
                                                   MARK_MASK if fwmark else None))


def _flush_table(rtnl: Rtnl, table: int) -> None:
    for family in FAMILIES:
        with kernel_errors("empty routing table", str(table)):
            for route in rtnl.routes(family, table=table):
                _delete_route(rtnl, route)


def adopt_legacy(rtnl: Rtnl) -> list[str]:
    """Host links an earlier version attached (an `iif G…H` rule per family, no device group)
    get their VPC's record, mark rules and group, and lose their iif rules; rules of links that
    are gone are deleted. The links adopted (call under the host lock, at node set-up)."""
    rules = all_rules(rtnl)
    live = {link.name: link for link in links.all_links(rtnl)}
    adopted: list[str] = []
    for family in FAMILIES:
        for rule in rules[family]:
            vpc = naming.vpc_of_host_link(rule.iifname or "")
            if vpc is None or rule.priority != RULE_PRIORITY or rule.iifname is None:
                continue
            link = live.get(rule.iifname)
            if link is not None and link.group != vpc_mark(rule.table):
                _adopt(rtnl, rules, vpc, rule.table)
                live[link.name] = links.configure(rtnl, link, group=vpc_mark(rule.table))
                adopted.append(link.name)
            _delete_rule(rtnl, family, rule.iifname, rule.table, RULE_PRIORITY)
    return adopted


def _adopt(rtnl: Rtnl, rules: Rules, vpc: str, table: int) -> None:
    if table > MAX_MARK_TABLE:
        raise CniError(KERNEL_FAILURE, f"VPC {vpc!r} uses table {table}, above {MAX_MARK_TABLE}",
                       "delete and re-add its attachments")
    if _recorded_table(rules, vpc) is None:
        _add_rule(rtnl, socket.AF_INET, naming.vrf_name(vpc), table, RECORD_PRIORITY)
        rules[socket.AF_INET] = [*rules[socket.AF_INET], RuleMsg(
            socket.AF_INET, table, RECORD_PRIORITY, 1, naming.vrf_name(vpc))]
    for family in FAMILIES:
        if not _has_mark_rule(rules[family], table):
            _add_rule(rtnl, family, None, table, RULE_PRIORITY, vpc_mark(table))
            rules[family] = [*rules[family], RuleMsg(family, table, RULE_PRIORITY, 1, None,
                                                     vpc_mark(table), MARK_MASK)]


def _delete_route(rtnl: Rtnl, route: RouteMsg) -> None:
    links.ignore_missing(lambda: rtnl.del_route(route))


def find_vpc_table(rtnl: Rtnl, vpc: str, mode: str, rules: Rules | None = None) -> int | None:
    """The VPC's table if it has one already (read-only; for CHECK)."""
    if mode == "vrf":
        vrf = links.find(rtnl, naming.vrf_name(vpc))
        return _vrf_table(vrf, rtnl) if vrf is not None and vrf.kind == "vrf" else None
    return _recorded_table(rules or all_rules(rtnl), vpc)


def has_mark_rules(rtnl: Rtnl, table: int, rules: Rules | None = None) -> bool:
    """True when both families' `fwmark <mark of table> lookup table` rules exist."""
    rules = rules or all_rules(rtnl)
    return all(_has_mark_rule(rules[family], table) for family in FAMILIES)


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
