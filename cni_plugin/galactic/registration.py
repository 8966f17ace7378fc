"""An attachment registered in galactic's datapath the way galactic-bgp registers one
(`registerEBPFDatapath` at the compatible commit), and taken out again.

Rows, in galactic's order: the VRF's default `egress_route_table` row toward a NAT66 shard
(only where the node names shard SIDs), a pass-through row per advertised prefix (the VRF's own
prefixes stay local), `locator_table` and `function_table` (the node's locator and
End.DT46), `vrf_table` (the SID's Argument → the VPC's Linux table), `ifindex_vrf_table` (the
host link → its VPC), then galactic's pinned `usid_egress` on the host link's TC ingress, then
the node's SRv6 source address and uplink (best effort, as galactic does).

Created-only (SPEC §7): each write keeps the row's bytes from before; a rollback puts back
(or deletes, when there was none) only rows that still hold what this ADD wrote, so a row
another attachment or galactic itself wrote since is never touched. DEL removes the rows of
its attachment that still say what it registered (an on-node record lists them, so DEL and GC
need no prevResult: `record.py`); the VPC's `vrf_table` row goes with the VPC's VRF; the node's
rows stay, as galactic's own chain leaves them (`removal.py`). This module writes them, undoes
them, and tells CHECK what no longer says the attachment is registered.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.galactic import layout, record, underlay
from cni_plugin.galactic.layout import (
    EGRESS_ROUTE_TABLE,
    FUNCTION_TABLE,
    IFINDEX_VRF_TABLE,
    LOCATOR_TABLE,
    NODE_SRC_ADDR_TABLE,
    PUBLIC_UPLINK_TABLE,
    VRF_TABLE,
    MapLayout,
    VrfRow,
)
from cni_plugin.galactic.pins import Datapath, opened
from cni_plugin.kernel import tc
from cni_plugin.kernel.bpf import BPF_EXIST, BPF_MAP_TYPE_LPM_TRIE, BPF_NOEXIST, BpfError
from cni_plugin.kernel.links import kernel_errors
from cni_plugin.kernel.rtnl import Rtnl
from netconf.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Registration:
    """What registering one attachment needs: its identity, host link, the node's SID fields
    and the VPC's Linux table, and the prefixes it advertises."""

    network: str  # the network config's name (GC collects per network)
    container_id: str
    ifname: str
    host_link: str
    host_ifindex: int
    egress_kind: int  # layout.EGRESS_KIND_VETH or EGRESS_KIND_TAP
    locator: str
    node_id: int
    argument: int  # the VPC's VRF ID on this node
    table_id: int  # the VPC's Linux table (its VRF's)
    prefixes: tuple[Network, ...]
    nat66_shard_sids: tuple[str, ...] = ()  # the VRF's default egress: the first reachable
    pod_netns: str = ""  # a veth's: where its Pod end `ifname` is (doctor reads its offloads)
    # usid_egress's TC priority on the host link: galactic's on a veth, after policy on a tap
    filter_priority: int = layout.EGRESS_FILTER_PRIORITY

    @property
    def block(self) -> int:
        """The uSID Block of the node's locator."""
        return layout.block_of(self.locator)

    def attachment_rows(self) -> list[tuple[MapLayout, bytes, bytes]]:
        """(map, key, value) of the rows that are this attachment's alone."""
        rows = [(EGRESS_ROUTE_TABLE, layout.route_key(self.table_id, prefix),
                 layout.PASS_THROUGH) for prefix in self.prefixes]
        rows.append((IFINDEX_VRF_TABLE, layout.ifindex_key(self.host_ifindex),
                     layout.ifindex_value(self.block, self.argument)))
        return rows

    def shared_rows(self) -> list[tuple[MapLayout, bytes]]:
        """(map, key) of the node's and the VPC's rows the attachment relies on."""
        return [(LOCATOR_TABLE, layout.locator_key(self.block, self.node_id)),
                (FUNCTION_TABLE, layout.function_key(self.block)),
                (VRF_TABLE, layout.vrf_key(self.block, self.argument)),
                (NODE_SRC_ADDR_TABLE, layout.ARRAY_ONLY_KEY),
                (PUBLIC_UPLINK_TABLE, layout.ARRAY_ONLY_KEY),
                *([(EGRESS_ROUTE_TABLE, layout.route_key(self.table_id, layout.DEFAULT_PREFIX))]
                  if self.nat66_shard_sids else [])]


@dataclass(frozen=True)
class Written:
    """One row as a write left it: its bytes before (None: it did not exist) and after."""

    layout: MapLayout
    key: bytes
    before: bytes | None
    after: bytes


def _owned(map_layout: MapLayout, value: bytes) -> bytes:
    """The part of a row its writer owns: all of it, but for vrf_table, whose counters the
    datapath keeps moving."""
    if map_layout is VRF_TABLE:
        row = VrfRow.decode(value)
        return VrfRow(row.table_id, row.egress_kind, generation=row.generation).encode()
    return value


def _restored(map_layout: MapLayout, before: bytes, current: bytes) -> bytes:
    if map_layout is VRF_TABLE:  # our fields put back, the datapath's counters kept
        old, now = VrfRow.decode(before), VrfRow.decode(current)
        return VrfRow(old.table_id, old.egress_kind, now.packets, now.octets, now.last_seen_ns,
                      old.generation, now.dropped_packets).encode()
    return before


@dataclass
class RowWriter:
    """Writes rows into galactic's maps, remembering each row's bytes from before."""

    datapath: Datapath
    written: list[Written] = field(default_factory=list)

    def write(self, map_layout: MapLayout, key: bytes, value: bytes) -> None:
        """Put one row, remembering what it held (None: it was created)."""
        pinned = self.datapath[map_layout]
        with kernel_errors("write a row of galactic's map", map_layout.name):
            if map_layout.map_type == BPF_MAP_TYPE_LPM_TRIE:
                # A trie's lookup is longest-prefix: a shorter row may answer for a missing
                # one. Creating only if missing tells which it is.
                try:
                    pinned.update(key, value, BPF_NOEXIST)
                except BpfError as exc:
                    if exc.errno != errno.EEXIST:
                        raise
                else:
                    self.written.append(Written(map_layout, key, None, value))
                    return
            before = pinned.lookup(key)  # exact: the row exists (or it is a hash/array map)
            self.written.append(Written(map_layout, key, before, value))
            pinned.update(key, value)


def undo_rows(datapath: Datapath, written: list[Written],
              kept: frozenset[tuple[str, bytes]] = frozenset()) -> None:
    """Put back, newest first, each row that still holds what was written (created rows are
    deleted); rows someone wrote since, and rows `kept` ((map, key) another registration
    relies on, which this ADD created: a row of constant value cannot tell its writers
    apart), stay as they are."""
    for row in reversed(written):
        if row.before is None and (row.layout.name, row.key) in kept:
            continue
        pinned = datapath[row.layout]
        with kernel_errors("restore a row of galactic's map", row.layout.name):
            current = pinned.lookup(row.key)
            if current is None or _owned(row.layout, current) != _owned(row.layout, row.after):
                continue
            if row.before is None:
                pinned.delete(row.key)  # exact, in a trie too
                continue
            try:  # only where the row still exists (a trie's lookup may have found another)
                pinned.update(row.key, _restored(row.layout, row.before, current), BPF_EXIST)
            except BpfError as exc:
                if exc.errno != errno.ENOENT:
                    raise


HostLock = Callable[[Deadline], AbstractContextManager[None]]


def register(datapath: Datapath, rtnl: Rtnl, registration: Registration, rollback: Rollback,
             lock_dir: str, underlay_interfaces: tuple[str, ...], host_lock: HostLock,
             clock: Callable[[], int] = time.monotonic_ns) -> None:
    """Register the attachment (rows, then `usid_egress` on its host link; call under the
    host lock, which the rollback takes too); everything this ADD wrote is undone by the
    rollback, and the attachment's own rows are listed in the record DEL and GC read."""
    reg = registration
    try:
        layout.check_node_id(reg.node_id)
        layout.check_argument(reg.argument)
    except ValueError as exc:
        raise CniError(INVALID_CONFIG, f"cannot register in galactic's datapath: {exc}",
                       "the node's BGPRouter nodeID and the VPC's vrfID must fit the uSID "
                       "format") from None
    writer = RowWriter(datapath)
    pin_dir = datapath.pin_dir
    rollback.created("record of the rows registered in galactic's datapath",
                     lambda _d: record.forget(lock_dir, reg.container_id, reg.ifname))
    record.write_record(lock_dir, reg.container_id, reg.ifname, network=reg.network,
                        host_link=reg.host_link, rows=reg.attachment_rows(),
                        uses=reg.shared_rows(), pod_netns=reg.pod_netns)
    def undo(deadline: Deadline) -> None:
        with host_lock(deadline), opened(pin_dir) as datapath:
            if datapath is not None:
                undo_rows(datapath, writer.written, record.listed_by_others(
                    lock_dir, record.record_path(lock_dir, reg.container_id, reg.ifname)))

    rollback.created("rows written into galactic's datapath", undo)
    block = reg.block
    _write_nat66_default(writer, rtnl, reg)
    for map_layout, key, value in reg.attachment_rows()[:-1]:  # then the pass-through rows
        writer.write(map_layout, key, value)
    writer.write(LOCATOR_TABLE, layout.locator_key(block, reg.node_id),
                 layout.locator_value(clock()))
    writer.write(FUNCTION_TABLE, layout.function_key(block), layout.function_value())
    _write_vrf_row(writer, reg, clock)
    map_layout, key, value = reg.attachment_rows()[-1]
    writer.write(map_layout, key, value)
    rollback.created(f"usid_egress on {reg.host_link}",
                     lambda d: _detach(reg.host_link, reg.host_ifindex, d,
                                       reg.filter_priority))
    attach_usid_egress(datapath, rtnl, reg.host_link, reg.host_ifindex, reg.filter_priority)
    _write_node_rows(writer, rtnl, underlay_interfaces)


def _write_nat66_default(writer: RowWriter, rtnl: Rtnl, reg: Registration) -> None:
    """The VRF's default egress toward the first NAT66 shard SID the underlay reaches now
    (installNAT66EgressRoute); none configured: no default (traffic leaving the VPC meets the
    VRF's unreachable default). Configured but none reachable fails the ADD, as galactic's."""
    if not reg.nat66_shard_sids:
        return
    for sid in reg.nat66_shard_sids:
        hop = underlay.next_hop(rtnl, sid)
        if hop is not None:
            writer.write(EGRESS_ROUTE_TABLE, layout.route_key(reg.table_id, layout.DEFAULT_PREFIX),
                         layout.EgressRoute(sid, hop.ifindex, hop.dmac, hop.smac).encode())
            return
    raise CniError(TRY_AGAIN_LATER, f"no NAT66 shard SID is reachable yet, out of "
                   f"{len(reg.nat66_shard_sids)} configured (nat66ShardSIDs)",
                   "each needs a route over the underlay and a resolved next hop")


def _write_vrf_row(writer: RowWriter, reg: Registration, clock: Callable[[], int]) -> None:
    """vrf_table's row of the VPC: the counters the datapath keeps are carried over."""
    key = layout.vrf_key(reg.block, reg.argument)
    with kernel_errors("read a row of galactic's map", VRF_TABLE.name):
        existing = writer.datapath[VRF_TABLE].lookup(key)
    old = VrfRow.decode(existing) if existing is not None else VrfRow(0, 0)
    row = VrfRow(reg.table_id, reg.egress_kind, old.packets, old.octets, old.last_seen_ns,
                 clock(), old.dropped_packets)
    writer.write(VRF_TABLE, key, row.encode())


def attach_usid_egress(datapath: Datapath, rtnl: Rtnl, host_link: str, ifindex: int,
                       priority: int = layout.EGRESS_FILTER_PRIORITY) -> None:
    """galactic's pinned `usid_egress` as the host link's TC ingress filter (attach.AttachEgress:
    clsact, priority 1 (a tap's: after policy), handle 1, all protocols, direct action,
    replacing what is there)."""
    with datapath.program() as program, kernel_errors("attach usid_egress to", host_link):
        tc.ensure_clsact(rtnl, ifindex)
        tc.replace_bpf_filter(rtnl, ifindex, program.fd, layout.EGRESS_FILTER_NAME,
                              priority=priority, handle=layout.EGRESS_FILTER_HANDLE)


def _detach(host_link: str, ifindex: int, deadline: Deadline,
            priority: int = layout.EGRESS_FILTER_PRIORITY) -> None:
    from cni_plugin.kernel import netns
    with netns.open_netlink(None, deadline=deadline) as rtnl:
        link = next((link for link in rtnl.links() if link.index == ifindex), None)
        if link is None or link.name != host_link:
            return  # gone with its link (or the index is someone else's now)
        with kernel_errors("detach usid_egress from", host_link):
            tc.delete_filter(rtnl, ifindex, priority, layout.EGRESS_FILTER_HANDLE)


def _write_node_rows(writer: RowWriter, rtnl: Rtnl, configured: tuple[str, ...]) -> None:
    """The node's SRv6 source address and uplink: best effort, as galactic's (a node whose
    underlay has not converged leaves them to a later ADD; usid_egress fails open meanwhile)."""
    try:
        links = underlay.underlay_links(rtnl, configured)
        if not links:
            log.warning("galactic's datapath: no underlay interface (no IPv6 default route); "
                        "this node's SRv6 source address is not registered")
            return
        source = underlay.source_address(rtnl, links[0])
        if source is None:
            log.warning("galactic's datapath: %s has no global IPv6 address; this node's SRv6 "
                        "source address is not registered", links[0].name)
        else:
            writer.write(NODE_SRC_ADDR_TABLE, layout.ARRAY_ONLY_KEY, layout.node_src_value(source))
        found = underlay.uplink(rtnl, links[0])
        if found is None:
            log.warning("galactic's datapath: no resolved IPv6 neighbour on %s; the public "
                        "uplink is not registered", links[0].name)
        else:
            writer.write(PUBLIC_UPLINK_TABLE, layout.ARRAY_ONLY_KEY,
                         layout.uplink_value(found.ifindex, found.dmac, found.smac))
    except CniError as exc:
        log.warning("galactic's datapath: node rows not registered: %s (%s)", exc.msg,
                    exc.details)


def differences(datapath: Datapath, rtnl: Rtnl, reg: Registration) -> list[str]:
    """CHECK: what no longer says the attachment is registered (rows, `usid_egress` on its
    host link)."""
    diffs = []
    expected = [*reg.attachment_rows(),
                (LOCATOR_TABLE, layout.locator_key(reg.block, reg.node_id), None),
                (FUNCTION_TABLE, layout.function_key(reg.block), layout.function_value())]
    with kernel_errors("read galactic's maps in", datapath.pin_dir):
        for map_layout, key, value in expected:
            found = datapath[map_layout].lookup(key)
            if found is None or (value is not None and found != value):
                diffs.append(f"galactic's {map_layout.name} lacks the row of {reg.host_link} "
                             f"(key {key.hex()})")
        vrf_row = datapath[VRF_TABLE].lookup(layout.vrf_key(reg.block, reg.argument))
    if vrf_row is None:
        diffs.append(f"galactic's vrf_table has no row for VRF ID {reg.argument}")
    elif VrfRow.decode(vrf_row).table_id != reg.table_id:
        diffs.append(f"galactic's vrf_table sends VRF ID {reg.argument} to table "
                     f"{VrfRow.decode(vrf_row).table_id}, the VPC's VRF has {reg.table_id}")
    with kernel_errors("list the TC filters of", reg.host_link):
        filters = tc.bpf_filters(rtnl, reg.host_ifindex)
        # By name: after galactic-cni restarts, the filter runs the program it had. A tap an
        # earlier release registered has it at galactic's priority: attached all the same
        # (that it runs before a policy's filters is policy's to report, not CHECK's).
        if not any(f.name == layout.EGRESS_FILTER_NAME and f.priority in
                   (reg.filter_priority, layout.EGRESS_FILTER_PRIORITY) for f in filters):
            diffs.append(f"galactic's usid_egress is not attached to {reg.host_link}")
    return diffs
