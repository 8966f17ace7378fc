"""Rows of galactic's datapath taken out (SPEC §15): an attachment's own rows by DEL and GC (those
that still say what it registered and that no other registration lists), rows of links that
are gone (GC), and the VPC's rows once its VRF goes; and the table ids galactic's routes still
name, which no other VPC gets."""

from __future__ import annotations

import logging

from cni_plugin.galactic import layout, record
from cni_plugin.galactic.layout import (
    EGRESS_ROUTE_TABLE,
    IFINDEX_VRF_TABLE,
    VRF_TABLE,
    MapLayout,
    VrfRow,
)
from cni_plugin.galactic.pins import Datapath, opened, tolerating_mismatch
from cni_plugin.kernel.links import kernel_errors

log = logging.getLogger(__name__)


def unregister(pin_dir: str, lock_dir: str, container_id: str, ifname: str) -> bool:
    """DEL, GC (under the host lock): remove the attachment's own rows that still say what it
    registered and that no other record lists (a pass-through row two attachments' prefixes
    share stays), then its record; whether there was a record. A datapath whose layout
    differs holds no row of ours (vpc-attach never writes one): only the record goes."""
    path = record.record_path(lock_dir, container_id, ifname)
    rows = record.read_record(path)
    if rows is None:
        return False
    others = record.listed_by_others(lock_dir, path)
    with tolerating_mismatch(), opened(pin_dir) as datapath:
        if datapath is not None:
            remove_rows(datapath, [row for row in rows if (row[0].name, row[1]) not in others])
    record.forget(lock_dir, container_id, ifname)
    return True


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
    with tolerating_mismatch(), opened(pin_dir) as datapath:
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
    with tolerating_mismatch(), opened(pin_dir) as datapath:
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
                    prefix == layout.DEFAULT_PREFIX
                    and layout.EgressRoute.decode(value).sid in nat66_shard_sids)
                if table == table_id and ours and routes.delete(key):
                    removed += 1
    return removed


def route_table_ids(pin_dir: str) -> set[int]:
    """Linux table ids that rows of galactic's egress_route_table name (galactic-router's
    routes outlive a VRF: such an id is not given to another VPC)."""
    with tolerating_mismatch(), opened(pin_dir) as datapath:
        if datapath is None:
            return set()
        routes = datapath[EGRESS_ROUTE_TABLE]
        with kernel_errors("read galactic's map", EGRESS_ROUTE_TABLE.name):
            return {layout.decode_route_key(key)[0] for key in routes.keys()}  # noqa: SIM118
