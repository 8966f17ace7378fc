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
need no prevResult); the VPC's `vrf_table` row goes with the VPC's VRF (`release_vpc`); the
node's rows stay, as galactic's own chain leaves them.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from cni_plugin.core import records
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.galactic import layout, underlay
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
from netconf.errors import DATAPATH_MISMATCH, INVALID_CONFIG, TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)
RECORDS_DIR = "galactic"  # under the host's lockDir: one record per registered attachment

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_PREFIX = ipaddress.IPv6Network("::/0")  # egressroutemap.DefaultPrefix


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
                *([(EGRESS_ROUTE_TABLE, layout.route_key(self.table_id, DEFAULT_PREFIX))]
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
                     lambda _d: forget(lock_dir, reg.container_id, reg.ifname))
    write_record(lock_dir, reg)
    def undo(deadline: Deadline) -> None:
        with host_lock(deadline), opened(pin_dir) as datapath:
            if datapath is not None:
                undo_rows(datapath, writer.written, listed_by_others(
                    lock_dir, record_path(lock_dir, reg.container_id, reg.ifname)))

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
                     lambda d: _detach(reg.host_link, reg.host_ifindex, d))
    attach_usid_egress(datapath, rtnl, reg.host_link, reg.host_ifindex)
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
            writer.write(EGRESS_ROUTE_TABLE, layout.route_key(reg.table_id, DEFAULT_PREFIX),
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


def attach_usid_egress(datapath: Datapath, rtnl: Rtnl, host_link: str, ifindex: int) -> None:
    """galactic's pinned `usid_egress` as the host link's TC ingress filter (attach.AttachEgress:
    clsact, priority 1, handle 1, all protocols, direct action, replacing what is there)."""
    with datapath.program() as program, kernel_errors("attach usid_egress to", host_link):
        tc.ensure_clsact(rtnl, ifindex)
        tc.replace_bpf_filter(rtnl, ifindex, program.fd, layout.EGRESS_FILTER_NAME,
                              priority=layout.EGRESS_FILTER_PRIORITY,
                              handle=layout.EGRESS_FILTER_HANDLE)


def _detach(host_link: str, ifindex: int, deadline: Deadline) -> None:
    from cni_plugin.kernel import netns
    with netns.open_netlink(None, deadline=deadline) as rtnl:
        link = next((link for link in rtnl.links() if link.index == ifindex), None)
        if link is None or link.name != host_link:
            return  # gone with its link (or the index is someone else's now)
        with kernel_errors("detach usid_egress from", host_link):
            tc.delete_filter(rtnl, ifindex, layout.EGRESS_FILTER_PRIORITY,
                             layout.EGRESS_FILTER_HANDLE)


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


def unregister(pin_dir: str, lock_dir: str, container_id: str, ifname: str) -> bool:
    """DEL, GC (under the host lock): remove the attachment's own rows that still say what it
    registered and that no other record lists (a pass-through row two attachments' prefixes
    share stays), then its record; whether there was a record. A datapath whose layout
    differs holds no row of ours (vpc-attach never writes one): only the record goes."""
    path = record_path(lock_dir, container_id, ifname)
    record = read_record(path)
    if record is None:
        return False
    others = listed_by_others(lock_dir, path)
    with _tolerating_mismatch(), opened(pin_dir) as datapath:
        if datapath is not None:
            remove_rows(datapath, [row for row in record if (row[0].name, row[1]) not in others])
    forget(lock_dir, container_id, ifname)
    return True


def listed_by_others(lock_dir: str, own: str) -> frozenset[tuple[str, bytes]]:
    """(map, key) of every row a registration other than the record `own` lists or relies
    on."""
    return frozenset((m.name, k) for other in record_paths(lock_dir) if other != own
                     for m, k in _listed(other))


def record_paths(lock_dir: str) -> list[str]:
    """Every registration record on this node."""
    directory = os.path.join(lock_dir, RECORDS_DIR)
    try:
        return [os.path.join(directory, name) for name in sorted(os.listdir(directory))
                if name.endswith(".json")]
    except FileNotFoundError:
        return []


def remove_rows(datapath: Datapath, rows: list[tuple[MapLayout, bytes, bytes]]) -> None:
    """Delete each row that still holds the value given."""
    for map_layout, key, value in rows:
        pinned = datapath[map_layout]
        with kernel_errors("remove a row of galactic's map", map_layout.name):
            if pinned.lookup(key) == value:
                pinned.delete(key)


def collect_orphans(pin_dir: str, live_ifindexes: set[int]) -> int:
    """GC: ifindex_vrf_table rows of links that no longer exist (whoever registered them): a
    new link given that index would have its packets taken for another VPC's; how many."""
    removed = 0
    with _tolerating_mismatch(), opened(pin_dir) as datapath:
        if datapath is None:
            return 0
        rows = datapath[IFINDEX_VRF_TABLE]
        with kernel_errors("remove stale rows of galactic's map", IFINDEX_VRF_TABLE.name):
            for key in list(rows.keys()):
                if layout.decode_ifindex_key(key) not in live_ifindexes and rows.delete(key):
                    removed += 1
    return removed


def release_vpc(pin_dir: str, table_id: int, nat66_shard_sids: tuple[str, ...] = ()) -> int:
    """The VPC's VRF went (its table released): its vrf_table row, any pass-through row of its
    table and its default toward a NAT66 shard go too; the number of rows removed. Routes
    galactic-router wrote stay: the table id stays the VPC's while its BGPVRFInstance exists."""
    removed = 0
    with _tolerating_mismatch(), opened(pin_dir) as datapath:
        if datapath is None:
            return 0
        vrfs = datapath[VRF_TABLE]
        routes = datapath[EGRESS_ROUTE_TABLE]
        with kernel_errors("remove the VPC's rows of galactic's map", VRF_TABLE.name):
            for key, value in list(vrfs.items()):
                if VrfRow.decode(value).table_id == table_id and vrfs.delete(key):
                    removed += 1
        with kernel_errors("remove the VPC's rows of galactic's map", EGRESS_ROUTE_TABLE.name):
            for key, value in list(routes.items()):
                table, prefix = layout.decode_route_key(key)
                ours = value == layout.PASS_THROUGH or (
                    prefix == DEFAULT_PREFIX
                    and layout.EgressRoute.decode(value).sid in nat66_shard_sids)
                if table == table_id and ours and routes.delete(key):
                    removed += 1
    return removed


@contextlib.contextmanager
def _tolerating_mismatch() -> Iterator[None]:
    """A datapath whose layout differs holds nothing of ours: what reads or cleans our rows
    goes on without it (what would write them fails, code 107)."""
    try:
        yield
    except CniError as exc:
        if exc.code != DATAPATH_MISMATCH:
            raise
        log.warning("galactic's datapath: %s (%s)", exc.msg, exc.details)


def route_table_ids(pin_dir: str) -> set[int]:
    """Linux table ids that rows of galactic's egress_route_table name (galactic-router's
    routes outlive a VRF: such an id is not given to another VPC)."""
    with _tolerating_mismatch(), opened(pin_dir) as datapath:
        if datapath is None:
            return set()
        routes = datapath[EGRESS_ROUTE_TABLE]
        with kernel_errors("read galactic's map", EGRESS_ROUTE_TABLE.name):
            return {layout.decode_route_key(key)[0] for key in routes.keys()}  # noqa: SIM118


# The on-node record: which attachment rows a (container, ifname) registered.

def record_path(lock_dir: str, container_id: str, ifname: str) -> str:
    """Where a (container, ifname)'s registration is recorded (container IDs hold no '@')."""
    return os.path.join(lock_dir, RECORDS_DIR, f"{container_id}@{ifname}.json")


def write_record(lock_dir: str, reg: Registration) -> None:
    """Record the attachment's rows before writing them (atomically)."""
    body = {"network": reg.network, "hostLink": reg.host_link,
            "rows": [[m.name, k.hex(), v.hex()] for m, k, v in reg.attachment_rows()],
            "uses": [[m.name, k.hex()] for m, k in reg.shared_rows()]}
    records.write_record(record_path(lock_dir, reg.container_id, reg.ifname), json.dumps(body),
                         "the galactic registration")


_BY_NAME = {m.name: m for m in layout.MAPS}


def read_record(path: str) -> list[tuple[MapLayout, bytes, bytes]] | None:
    """The rows a record lists, or None when it is absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return [(_BY_NAME[name], bytes.fromhex(key), bytes.fromhex(value))
                for name, key, value in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _listed(path: str) -> list[tuple[MapLayout, bytes]]:
    """(map, key) of the rows a record lists as its own or relies on."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
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
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                if json.load(handle).get("network") == network:
                    yield container_id, ifname
        except (OSError, ValueError, AttributeError):
            continue


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
        # By name: after galactic-cni restarts, the filter runs the program it had.
        if not any(f.name == layout.EGRESS_FILTER_NAME
                   and f.priority == layout.EGRESS_FILTER_PRIORITY for f in filters):
            diffs.append(f"galactic's usid_egress is not attached to {reg.host_link}")
    return diffs
