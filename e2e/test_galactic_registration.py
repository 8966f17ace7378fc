"""Registration in galactic's datapath, row by row, against real eBPF maps and TC filters.

The maps here are STAND-INS made by this test with the layouts of galactic's `usid.c` (and a
program named `usid_egress` that does nothing), in a private bpffs, so every row vpc-attach
writes, restores or removes can be read back with `bpftool` on this machine's kernel. That
galactic's own datapath accepts those rows — `galactic-cni run`'s pins, its programs carrying
packets — is proven in the full-kernel VM by `e2e/test_galactic_datapath.py`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.galactic import layout, pins, record, registration, removal
from cni_plugin.galactic.layout import (
    EGRESS_ROUTE_TABLE,
    FUNCTION_TABLE,
    IFINDEX_VRF_TABLE,
    LOCATOR_TABLE,
    NODE_SRC_ADDR_TABLE,
    PUBLIC_UPLINK_TABLE,
    VRF_TABLE,
    VrfRow,
)
from cni_plugin.galactic.registration import Registration
from cni_plugin.kernel import bpf, tc
from cni_plugin.kernel.netns import entered, open_netlink
from cni_plugin.kernel.rtnl import Rtnl
from e2e.harness.bpf import (
    BPFTOOL,
    bpftool,
    bpftool_rows,
    mounted_bpffs,
    pin_program,
    pinned_map,
    tc_bpf_filters,
)
from e2e.harness.kernel import IS_ROOT, run_ip, temporary_netns
from netconf.errors import DATAPATH_MISMATCH, CniError

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not IS_ROOT, reason="needs root: bpffs, bpf(2) and namespaces"),
    pytest.mark.skipif(not os.access(BPFTOOL, os.X_OK), reason="needs bpftool (setup.sh)"),
]
MAX_ENTRIES = {"locator_table": 64, "function_table": 128, "vrf_table": 8192,
               "ifindex_vrf_table": 16384, "egress_route_table": 32768,
               "node_src_addr_table": 1, "public_uplink_table": 1}
LOCATOR = "2001:db8:a::/48"
UNDERLAY_PEER_MAC = "02:00:00:00:5e:02"
TABLE = 7


@dataclass
class Node:
    """A node netns (entered by the test) with two host links of one VPC and an underlay."""

    netns: str
    pin_dir: Path
    rtnl: Rtnl
    lock_dir: Path

    def registration(self, link: str, container: str, prefixes: list[str],
                     argument: int = 3) -> Registration:
        index = self.rtnl.get_link(name=link).index
        return Registration(
            network="net1", container_id=container, ifname="eth0", host_link=link,
            host_ifindex=index, egress_kind=layout.EGRESS_KIND_VETH, locator=LOCATOR,
            node_id=1, argument=argument, table_id=TABLE,
            prefixes=tuple(ipaddress.ip_network(p) for p in prefixes))

    def register(self, reg: Registration, rollback: Rollback) -> None:
        with pins.opened(str(self.pin_dir)) as datapath:
            assert datapath is not None
            registration.register(datapath, self.rtnl, reg, rollback, str(self.lock_dir), (),
                                  lambda _d: contextlib.nullcontext())  # one thread here

    def rows(self) -> dict[str, dict[bytes, bytes]]:
        """Every map as bpftool reads it."""
        return {m.name: bpftool_rows(self.pin_dir / m.name) for m in layout.MAPS}


def _pin_stand_ins(pin_dir: Path, skip: str = "") -> None:
    pin_dir.mkdir()
    for m in layout.MAPS:
        if m.name != skip:
            pinned_map(pin_dir, m.name, m.map_type, m.key_size, m.value_size,
                       MAX_ENTRIES[m.name]).close()
    pin_program(pin_dir / layout.USID_EGRESS_PIN, layout.USID_EGRESS_PROGRAM)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """Stand-in maps pinned in a private bpffs; a node netns with veth host links G…H of one
    VPC and an underlay with a global IPv6 address, a default route and a resolved neighbour."""
    with mounted_bpffs(tmp_path / "bpffs") as mount, temporary_netns("vpa-gr") as netns:
        name = os.path.basename(netns)
        for link in ("G000000jU001H", "G000000jU002H"):
            run_ip("-n", name, "link", "add", link, "type", "veth", "peer", "name", link + "p")
            run_ip("-n", name, "link", "set", link, "up")
        run_ip("-n", name, "link", "add", "ul0", "type", "veth", "peer", "name", "ul1")
        run_ip("-n", name, "link", "set", "ul0", "up")
        run_ip("-n", name, "addr", "add", "fd00:99::1/64", "dev", "ul0", "nodad")
        run_ip("-n", name, "-6", "route", "add", "default", "via", "fd00:99::2", "dev", "ul0")
        run_ip("-n", name, "-6", "neigh", "replace", "fd00:99::2", "lladdr", UNDERLAY_PEER_MAC,
               "dev", "ul0", "nud", "permanent")
        _pin_stand_ins(mount / "galactic")
        with entered(netns), open_netlink(None) as rtnl:
            yield Node(netns, mount / "galactic", rtnl, tmp_path / "locks")


def test_register_writes_galactics_rows_and_attaches_usid_egress(node: Node) -> None:
    reg = node.registration("G000000jU001H", "c1", ["fd00:7::/96", "10.7.0.5/32"])
    node.register(reg, Rollback(Deadline(10)))
    rows = node.rows()
    block = 0x20010DB8000A
    assert rows[EGRESS_ROUTE_TABLE.name] == {
        layout.route_key(TABLE, ipaddress.ip_network("fd00:7::/96")): bytes(32),
        layout.route_key(TABLE, ipaddress.ip_network("10.7.0.5/32")): bytes(32)}
    assert set(rows[LOCATOR_TABLE.name]) == {(block << 16 | 1).to_bytes(8, "little")}
    assert rows[FUNCTION_TABLE.name] == {(block << 4 | 0xE).to_bytes(8, "little"):
                                         (1).to_bytes(4, "little")}
    [(vrf_key, vrf_value)] = rows[VRF_TABLE.name].items()
    assert vrf_key == (block << 12 | 3).to_bytes(8, "little")
    assert VrfRow.decode(vrf_value).table_id == TABLE
    assert VrfRow.decode(vrf_value).egress_kind == layout.EGRESS_KIND_VETH
    assert VrfRow.decode(vrf_value).generation > 0
    assert rows[IFINDEX_VRF_TABLE.name] == {
        reg.host_ifindex.to_bytes(4, "little"):
            block.to_bytes(8, "little") + (3).to_bytes(2, "little") + bytes(6)}
    assert rows[NODE_SRC_ADDR_TABLE.name] == {
        bytes(4): ipaddress.IPv6Address("fd00:99::1").packed}
    underlay = node.rtnl.get_link(name="ul0")
    assert rows[PUBLIC_UPLINK_TABLE.name] == {
        bytes(4): underlay.index.to_bytes(4, "little") + bytes.fromhex("020000005e02")
        + bytes.fromhex(underlay.mac.replace(":", ""))}
    program = bpftool("prog", "show", "pinned", str(node.pin_dir / layout.USID_EGRESS_PIN))
    [attached] = tc_bpf_filters(os.path.basename(node.netns), "G000000jU001H")
    assert attached["options"]["bpf_name"] == layout.EGRESS_FILTER_NAME
    assert attached["options"]["prog"]["id"] == program["id"]
    assert (attached["pref"], attached["options"]["handle"]) == (1, "0x1")
    assert attached["options"].get("direct-action") is True


def test_a_rolled_back_registration_leaves_every_map_byte_for_byte(node: Node) -> None:
    # What galactic's own chain and galactic-router wrote before: kept as it was.
    block = layout.block_of(LOCATOR)
    with bpf.open_map(str(node.pin_dir / LOCATOR_TABLE.name)) as locators:
        locators.update(layout.locator_key(block, 1), layout.locator_value(42))
    with bpf.open_map(str(node.pin_dir / VRF_TABLE.name)) as vrfs:
        vrfs.update(layout.vrf_key(block, 3), VrfRow(TABLE, layout.EGRESS_KIND_TAP, 5, 500, 9,
                                                     7, 1).encode())
    with bpf.open_map(str(node.pin_dir / EGRESS_ROUTE_TABLE.name)) as routes:
        routes.update(layout.route_key(TABLE, ipaddress.ip_network("fd00:8::/96")),
                      layout.EgressRoute("2001:db8:b:2:e003::", 9, "02:00:00:00:00:09",
                                         "02:00:00:00:00:08").encode())
    before = node.rows()
    rollback = Rollback(Deadline(10))
    node.register(node.registration("G000000jU001H", "c1", ["fd00:7::/96"]), rollback)
    assert node.rows() != before
    assert rollback.run() == []
    assert node.rows() == before
    assert tc_bpf_filters(os.path.basename(node.netns), "G000000jU001H") == []
    assert not os.listdir(node.lock_dir / record.RECORDS_DIR)


def test_a_rollback_keeps_the_vpcs_row_another_attachment_wrote_since(node: Node) -> None:
    first = Rollback(Deadline(10))
    node.register(node.registration("G000000jU001H", "c1", ["fd00:7::/96"]), first)
    node.register(node.registration("G000000jU002H", "c2", ["fd00:7::1:0:0/96"]),
                  Rollback(Deadline(10)))
    after_second = node.rows()
    assert first.run() == []
    rows = node.rows()
    for name in (VRF_TABLE.name, LOCATOR_TABLE.name, FUNCTION_TABLE.name):
        assert rows[name] == after_second[name], name  # c2 wrote them last and lives on
    assert len(rows[IFINDEX_VRF_TABLE.name]) == 1
    assert set(rows[EGRESS_ROUTE_TABLE.name]) == {
        layout.route_key(TABLE, ipaddress.ip_network("fd00:7::1:0:0/96"))}


def test_unregister_removes_the_attachments_own_rows_only(node: Node) -> None:
    shared = ["fd00:7::/64"]  # two Pods given addresses of one /64 advertise the same prefix
    node.register(node.registration("G000000jU001H", "c1", shared), Rollback(Deadline(10)))
    second = node.registration("G000000jU002H", "c2", shared)
    node.register(second, Rollback(Deadline(10)))
    assert removal.unregister(str(node.pin_dir), str(node.lock_dir), "c1", "eth0")
    rows = node.rows()
    assert list(rows[IFINDEX_VRF_TABLE.name]) == [second.host_ifindex.to_bytes(4, "little")]
    assert len(rows[EGRESS_ROUTE_TABLE.name]) == 1  # c2 still advertises it
    assert len(rows[VRF_TABLE.name]) == len(rows[LOCATOR_TABLE.name]) == 1
    assert removal.unregister(str(node.pin_dir), str(node.lock_dir), "c2", "eth0")
    rows = node.rows()
    assert rows[IFINDEX_VRF_TABLE.name] == rows[EGRESS_ROUTE_TABLE.name] == {}
    assert len(rows[VRF_TABLE.name]) == 1  # the VPC's: it goes with the VRF (release_vpc)
    assert not removal.unregister(str(node.pin_dir), str(node.lock_dir), "c2", "eth0")


def test_releasing_the_vpc_removes_its_vrf_row_and_keeps_the_routers_routes(node: Node) -> None:
    node.register(node.registration("G000000jU001H", "c1", ["fd00:7::/96"]),
                  Rollback(Deadline(10)))
    remote = layout.route_key(TABLE, ipaddress.ip_network("fd00:8::/96"))
    with bpf.open_map(str(node.pin_dir / EGRESS_ROUTE_TABLE.name)) as routes:
        routes.update(remote, layout.EgressRoute("2001:db8:b:2:e003::", 9, "02:00:00:00:00:09",
                                                 "02:00:00:00:00:08").encode())
    assert removal.release_vpc(str(node.pin_dir), TABLE) == 2
    rows = node.rows()
    assert rows[VRF_TABLE.name] == {}
    assert list(rows[EGRESS_ROUTE_TABLE.name]) == [remote]
    assert removal.route_table_ids(str(node.pin_dir)) == {TABLE}


def test_a_map_of_another_layout_is_refused_naming_both_and_nothing_is_written(
        tmp_path: Path) -> None:
    with mounted_bpffs(tmp_path / "bpffs") as mount:
        pin_dir = mount / "galactic"
        _pin_stand_ins(pin_dir, skip=VRF_TABLE.name)
        pinned_map(pin_dir, VRF_TABLE.name, bpf.BPF_MAP_TYPE_HASH, 8, 40, 16).close()
        with pytest.raises(CniError) as refused, pins.opened(str(pin_dir)):
            pass
        assert refused.value.code == DATAPATH_MISMATCH
        assert "'vrf_table' is hash, key 8 bytes, value 40 bytes" in refused.value.msg
        assert "vpc-attach writes hash, key 8 bytes, value 48 bytes" in refused.value.msg
        assert all(bpftool_rows(pin_dir / m.name) == {} for m in layout.MAPS
                   if m.map_type != bpf.BPF_MAP_TYPE_ARRAY)


def test_a_missing_map_is_refused_by_name(tmp_path: Path) -> None:
    with mounted_bpffs(tmp_path / "bpffs") as mount:
        _pin_stand_ins(mount / "galactic", skip=IFINDEX_VRF_TABLE.name)
        with pytest.raises(CniError, match="no map 'ifindex_vrf_table'"), \
                pins.opened(str(mount / "galactic")):
            pass


def test_no_pins_is_no_galactic_datapath(tmp_path: Path) -> None:
    with pins.opened(str(tmp_path)) as datapath:
        assert datapath is None
    assert not pins.present(str(tmp_path))


def test_a_vpc_with_a_tap_gets_the_plain_redirect(node: Node) -> None:
    tap = replace(node.registration("G000000jU001H", "c1", []),
                  egress_kind=layout.EGRESS_KIND_TAP)
    node.register(tap, Rollback(Deadline(10)))
    [value] = node.rows()[VRF_TABLE.name].values()
    assert VrfRow.decode(value).egress_kind == layout.EGRESS_KIND_TAP


def test_gc_removes_rows_of_links_that_are_gone(node: Node) -> None:
    reg = node.registration("G000000jU001H", "c1", ["fd00:7::/96"])
    node.register(reg, Rollback(Deadline(10)))
    node.register(node.registration("G000000jU002H", "c2", ["fd00:7::1:0:0/96"]),
                  Rollback(Deadline(10)))
    run_ip("-n", os.path.basename(node.netns), "link", "del", "G000000jU001H")
    live = {link.index for link in node.rtnl.links()}
    assert removal.collect_orphans(str(node.pin_dir), live) == 1
    assert reg.host_ifindex.to_bytes(4, "little") not in node.rows()[IFINDEX_VRF_TABLE.name]
    assert len(node.rows()[IFINDEX_VRF_TABLE.name]) == 1


def test_a_rolled_back_second_attachment_leaves_the_first_ones_rows_as_they_were(
        node: Node) -> None:
    node.register(node.registration("G000000jU001H", "c1", ["fd00:7::/96"]),
                  Rollback(Deadline(10)))
    before = node.rows()
    rollback = Rollback(Deadline(10))
    node.register(node.registration("G000000jU002H", "c2", ["fd00:7::1:0:0/96"]), rollback)
    assert node.rows() != before  # the VPC's and the node's rows were written again
    assert rollback.run() == []
    assert node.rows() == before


def test_check_names_each_row_and_filter_that_is_gone(node: Node) -> None:
    reg = node.registration("G000000jU001H", "c1", ["fd00:7::/96"])
    node.register(reg, Rollback(Deadline(10)))
    with pins.opened(str(node.pin_dir)) as datapath:
        assert datapath is not None
        assert registration.differences(datapath, node.rtnl, reg) == []
        datapath[IFINDEX_VRF_TABLE].delete(layout.ifindex_key(reg.host_ifindex))
        with bpf.open_map(str(node.pin_dir / VRF_TABLE.name)) as vrfs:
            key = layout.vrf_key(reg.block, reg.argument)
            moved = VrfRow.decode(vrfs.lookup(key) or b"")
            vrfs.update(key, replace(moved, table_id=TABLE + 1).encode())
        tc.delete_filter(node.rtnl, reg.host_ifindex, layout.EGRESS_FILTER_PRIORITY)
        diffs = registration.differences(datapath, node.rtnl, reg)
    assert any("ifindex_vrf_table lacks the row of G000000jU001H" in d for d in diffs), diffs
    assert f"galactic's vrf_table sends VRF ID 3 to table {TABLE + 1}, the VPC's VRF has " \
        f"{TABLE}" in diffs
    assert "galactic's usid_egress is not attached to G000000jU001H" in diffs


def test_a_vrfs_default_goes_to_the_first_reachable_nat66_shard(node: Node) -> None:
    unreachable, reachable = "fd00:dead::1", "2001:db8:ff::1"  # no route / via the default
    run_ip("-n", os.path.basename(node.netns), "-6", "route", "add", "unreachable",
           "fd00:dead::/32")
    reg = replace(node.registration("G000000jU001H", "c1", ["fd00:7::/96"]),
                  nat66_shard_sids=(unreachable, reachable))
    rollback = Rollback(Deadline(10))
    node.register(reg, rollback)
    default = layout.route_key(TABLE, ipaddress.ip_network("::/0"))
    route = layout.EgressRoute.decode(bytes.fromhex(
        node.rows()[EGRESS_ROUTE_TABLE.name][default].hex()))
    underlay = node.rtnl.get_link(name="ul0")
    assert route == layout.EgressRoute(reachable, underlay.index, UNDERLAY_PEER_MAC,
                                       underlay.mac)
    assert rollback.run() == []
    assert default not in node.rows()[EGRESS_ROUTE_TABLE.name]
    node.register(reg, Rollback(Deadline(10)))
    assert removal.release_vpc(str(node.pin_dir), TABLE, reg.nat66_shard_sids) == 3


def test_no_reachable_nat66_shard_fails_the_registration_and_writes_nothing(
        node: Node) -> None:
    run_ip("-n", os.path.basename(node.netns), "-6", "route", "add", "unreachable",
           "fd00:dead::/32")
    before = node.rows()
    rollback = Rollback(Deadline(10))
    with pytest.raises(CniError, match="no NAT66 shard SID is reachable yet") as refused:
        node.register(replace(node.registration("G000000jU001H", "c1", ["fd00:7::/96"]),
                              nat66_shard_sids=("fd00:dead::1",)), rollback)
    assert refused.value.code == 11
    assert rollback.run() == []
    assert node.rows() == before
