"""bpf(2) and TC against the real kernel: what our bpf module writes is what `bpftool` reads (and
the reverse), and the filters our tc module attaches are what `tc -j` shows and do run.

Everything lives in a private bpffs mounted on a temporary directory and in namespaces made
here; both go when the test ends.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_plugin.kernel import bpf, tc
from cni_plugin.kernel.bpf import BpfError
from cni_plugin.kernel.netns import open_netlink
from cni_plugin.kernel.rtnl import Rtnl
from e2e.harness.bpf import (
    BPFTOOL,
    TOOL_TIMEOUT,
    bpftool,
    bpftool_rows,
    hex_words,
    mounted_bpffs,
    pinned_map,
    tc_bpf_filters,
    tc_json,
)
from e2e.harness.kernel import IS_ROOT, run_ip, temporary_netns
from e2e.harness.packets import ping

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not IS_ROOT, reason="needs root: bpffs, bpf(2) and namespaces"),
    pytest.mark.skipif(not os.access(BPFTOOL, os.X_OK), reason="needs bpftool (setup.sh)"),
    pytest.mark.skipif(shutil.which("tc") is None, reason="needs iproute2's tc"),
]
MAP_TYPE_NAMES = {"hash": bpf.BPF_MAP_TYPE_HASH, "array": bpf.BPF_MAP_TYPE_ARRAY,
                  "lpm_trie": bpf.BPF_MAP_TYPE_LPM_TRIE}
GALACTIC_NAME = "galactic_usid_egress"
ROWS = 100


@pytest.fixture
def bpffs(tmp_path: Path) -> Iterator[Path]:
    """A private bpffs instance on a temporary directory, unmounted (pins and all) after."""
    with mounted_bpffs(tmp_path / "bpffs") as mount:
        yield mount


def pinned_program(mount: Path, name: str, verdict: int = bpf.TC_ACT_UNSPEC) -> bpf.PinnedProg:
    """A SCHED_CLS program returning verdict, pinned at mount/name and opened again."""
    fd = bpf.load_sched_cls(name, bpf.constant_program(verdict))
    try:
        bpf.pin(fd, str(mount / name))
    finally:
        os.close(fd)
    return bpf.open_prog(str(mount / name))


def u32(value: int) -> bytes:
    return value.to_bytes(4, "little")


def u64(value: int) -> bytes:
    return value.to_bytes(8, "little")


def lpm_key(prefixlen: int, data: bytes) -> bytes:
    """An LPM trie key of 25 bytes: the prefix length (host order) and 21 bytes of data."""
    return u32(prefixlen) + data.ljust(21, b"\0")


# Maps ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("map_type", "key_size", "value_size", "max_entries"), [
    (bpf.BPF_MAP_TYPE_HASH, 4, 8, 128),
    (bpf.BPF_MAP_TYPE_ARRAY, 4, 16, 32),
    (bpf.BPF_MAP_TYPE_LPM_TRIE, 25, 4, 64),
])
def test_an_opened_pin_describes_its_map_as_bpftool_does(bpffs: Path, map_type: int,
                                                         key_size: int, value_size: int,
                                                         max_entries: int) -> None:
    with pinned_map(bpffs, "described", map_type, key_size, value_size, max_entries) as opened:
        shown = bpftool("map", "show", "pinned", str(bpffs / "described"))
        assert opened.info == bpf.MapInfo(
            map_type=MAP_TYPE_NAMES[shown["type"]], key_size=shown["bytes_key"],
            value_size=shown["bytes_value"], max_entries=shown["max_entries"],
            flags=shown["flags"], name=shown["name"], map_id=shown["id"])
        assert (opened.info.map_type, opened.info.key_size) == (map_type, key_size)
        assert opened.path == str(bpffs / "described")


def test_rows_we_write_are_the_rows_bpftool_dumps(bpffs: Path) -> None:
    written = {u32(i): u64(i * 1_000_003) for i in range(ROWS)}
    with pinned_map(bpffs, "ours", bpf.BPF_MAP_TYPE_HASH, 4, 8, 2 * ROWS) as opened:
        for key, value in written.items():
            opened.update(key, value)
        assert bpftool_rows(bpffs / "ours") == written


def test_rows_bpftool_writes_are_the_rows_we_read(bpffs: Path) -> None:
    written = {u32(i << 8): u64(0xA0A0_0000 + i) for i in range(5)}
    with pinned_map(bpffs, "theirs", bpf.BPF_MAP_TYPE_HASH, 4, 8, 16) as opened:
        for key, value in written.items():
            subprocess.run([BPFTOOL, "map", "update", "pinned", str(bpffs / "theirs"),
                            "key", *hex_words(key), "value", *hex_words(value)],
                           check=True, capture_output=True, timeout=TOOL_TIMEOUT)
        assert {key: opened.lookup(key) for key in written} == written
        assert dict(opened.items()) == written
        assert opened.lookup(u32(7)) is None


def test_keys_and_items_list_every_row_once(bpffs: Path) -> None:
    written = {u32(i): u64(i) for i in range(ROWS)}
    with pinned_map(bpffs, "listed", bpf.BPF_MAP_TYPE_HASH, 4, 8, 2 * ROWS) as opened:
        for key, value in written.items():
            opened.update(key, value)
        keys = list(opened.keys())
        assert len(keys) == ROWS and set(keys) == set(written)
        assert dict(opened.items()) == written and len(list(opened.items())) == ROWS


def test_deleting_each_key_as_it_is_listed_visits_every_key_once(bpffs: Path) -> None:
    # The kernel answers GET_NEXT_KEY of a deleted key with the map's first key; we go on.
    with pinned_map(bpffs, "drained", bpf.BPF_MAP_TYPE_HASH, 4, 8, 2 * ROWS) as opened:
        for i in range(ROWS):
            opened.update(u32(i), u64(i))
        visited, listing = [], opened.keys()
        for key in listing:
            assert opened.delete(key)
            visited.append(key)
        assert sorted(visited) == sorted(u32(i) for i in range(ROWS))
        assert bpftool_rows(bpffs / "drained") == {}


def test_delete_says_whether_the_row_was_there(bpffs: Path) -> None:
    with pinned_map(bpffs, "deleted", bpf.BPF_MAP_TYPE_HASH, 4, 8, 16) as opened:
        opened.update(u32(1), u64(1))
        assert opened.delete(u32(1)) is True
        assert opened.delete(u32(1)) is False
        assert opened.delete(u32(2)) is False
        assert bpftool_rows(bpffs / "deleted") == {}


def test_update_flags_refuse_as_the_kernel_documents(bpffs: Path) -> None:
    with pinned_map(bpffs, "flagged", bpf.BPF_MAP_TYPE_HASH, 4, 8, 16) as opened:
        with pytest.raises(BpfError) as missing:
            opened.update(u32(1), u64(1), bpf.BPF_EXIST)
        assert missing.value.errno == errno.ENOENT
        opened.update(u32(1), u64(1), bpf.BPF_NOEXIST)
        with pytest.raises(BpfError, match="update map 'flagged'") as present:
            opened.update(u32(1), u64(2), bpf.BPF_NOEXIST)
        assert present.value.errno == errno.EEXIST
        opened.update(u32(1), u64(3), bpf.BPF_EXIST)
        assert bpftool_rows(bpffs / "flagged") == {u32(1): u64(3)}


def test_array_rows_are_indexed_and_cannot_be_deleted(bpffs: Path) -> None:
    with pinned_map(bpffs, "indexed", bpf.BPF_MAP_TYPE_ARRAY, 4, 16, 8) as opened:
        opened.update(u32(3), b"x" * 16)
        assert opened.lookup(u32(3)) == b"x" * 16
        assert opened.lookup(u32(0)) == bytes(16)  # array rows always exist, zeroed
        assert opened.lookup(u32(8)) is None  # past max_entries
        assert len(list(opened.keys())) == 8
        with pytest.raises(BpfError) as refused:
            opened.delete(u32(3))
        assert refused.value.errno == errno.EINVAL
        assert bpftool_rows(bpffs / "indexed")[u32(3)] == b"x" * 16


def test_lpm_trie_rows_with_25_byte_keys_match_longest_prefix(bpffs: Path) -> None:
    block = bytes.fromhex("fd00000000000001") + bytes(13)
    rows = {lpm_key(64, block[:8]): u32(64), lpm_key(96, block[:12]): u32(96),
            lpm_key(0, b""): u32(0)}
    with pinned_map(bpffs, "usids", bpf.BPF_MAP_TYPE_LPM_TRIE, 25, 4, 64) as opened:
        for key, value in rows.items():
            opened.update(key, value)
        assert bpftool_rows(bpffs / "usids") == rows
        assert set(opened.keys()) == set(rows)
        assert dict(opened.items()) == rows
        # Lookups are longest-prefix matches: a full-length key inside the /96 finds it.
        assert opened.lookup(lpm_key(168, block[:12] + b"\x42" * 9)) == u32(96)
        assert opened.lookup(lpm_key(168, block[:8] + b"\x42" * 13)) == u32(64)
        assert opened.lookup(lpm_key(168, b"\xfe" + block[1:])) == u32(0)
        assert opened.delete(lpm_key(96, block[:12])) is True
        assert opened.lookup(lpm_key(168, block[:12] + b"\x42" * 9)) == u32(64)


def test_open_map_refuses_a_program_pin(bpffs: Path) -> None:
    with pinned_program(bpffs, "prog"), pytest.raises(BpfError, match="not a map") as refused:
        bpf.open_map(str(bpffs / "prog"))
    assert refused.value.errno == errno.EINVAL
    assert str(bpffs / "prog") in str(refused.value)


def test_open_prog_refuses_a_map_pin(bpffs: Path) -> None:
    with pinned_map(bpffs, "map", bpf.BPF_MAP_TYPE_HASH, 4, 4, 4), \
            pytest.raises(BpfError, match="not a program") as refused:
        bpf.open_prog(str(bpffs / "map"))
    assert refused.value.errno == errno.EINVAL


def test_a_missing_pin_is_enoent_naming_the_path(bpffs: Path) -> None:
    missing = str(bpffs / "galactic" / "vrf_table")
    with pytest.raises(BpfError) as raised:
        bpf.open_map(missing)
    assert raised.value.errno == errno.ENOENT
    assert missing in str(raised.value) and "open map" in str(raised.value)


def test_closing_closes_the_fd_once(bpffs: Path) -> None:
    with pinned_map(bpffs, "closed", bpf.BPF_MAP_TYPE_HASH, 4, 4, 4) as opened:
        fd = opened.fd
        os.fstat(fd)
    with pytest.raises(OSError) as closed:
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF
    opened.close()  # again: nothing happens
    assert opened.fd == -1


def test_an_opened_program_is_what_bpftool_shows(bpffs: Path) -> None:
    with pinned_program(bpffs, "shown") as prog:
        shown = bpftool("prog", "show", "pinned", str(bpffs / "shown"))
        assert prog.info == bpf.ProgInfo(prog_type=bpf.BPF_PROG_TYPE_SCHED_CLS,
                                         name=shown["name"], prog_id=shown["id"],
                                         tag=shown["tag"])
        assert shown["type"] == "sched_cls"


# TC -----------------------------------------------------------------------------------------

@pytest.fixture
def veth(netns: str) -> Iterator[tuple[Rtnl, str, int, int]]:
    """(rtnetlink in netns, netns name, ifindex of va, ifindex of vb): a veth pair va/vb."""
    name = os.path.basename(netns)
    run_ip("-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    with open_netlink(netns) as nl:
        yield nl, name, nl.get_link(name="va").index, nl.get_link(name="vb").index


def test_ensure_clsact_creates_it_once(veth: tuple[Rtnl, str, int, int]) -> None:
    nl, name, va, _ = veth
    assert tc.has_clsact(nl, va) is False
    assert tc.ensure_clsact(nl, va) is True
    assert tc.ensure_clsact(nl, va) is False
    assert tc.has_clsact(nl, va) is True
    clsacts = [q for q in tc_json(name, "qdisc", "show", "dev", "va") if q["kind"] == "clsact"]
    assert [(q["handle"], q["parent"]) for q in clsacts] == [("ffff:", "ffff:fff1")]


def test_an_attached_filter_is_what_tc_shows(veth: tuple[Rtnl, str, int, int],
                                             bpffs: Path) -> None:
    nl, name, va, _ = veth
    tc.ensure_clsact(nl, va)
    with pinned_program(bpffs, "usid_egress") as prog:
        tc.replace_bpf_filter(nl, va, prog.fd, GALACTIC_NAME)
        [shown] = tc_bpf_filters(name, "va")
        assert (shown["protocol"], shown["pref"], shown["kind"]) == ("all", 1, "bpf")
        assert shown["options"]["handle"] == "0x1"
        assert shown["options"]["bpf_name"] == GALACTIC_NAME
        assert shown["options"]["direct-action"] is True
        assert shown["options"]["prog"]["id"] == prog.info.prog_id
        assert tc.bpf_filters(nl, va) == [tc.BpfFilter(
            priority=1, handle=1, protocol=tc.ETH_P_ALL, name=GALACTIC_NAME,
            prog_id=prog.info.prog_id, direct_action=True)]
    assert tc_bpf_filters(name, "va", "egress") == []


def test_replacing_at_the_same_priority_and_handle_swaps_the_program(
        veth: tuple[Rtnl, str, int, int], bpffs: Path) -> None:
    nl, name, va, _ = veth
    tc.ensure_clsact(nl, va)
    with pinned_program(bpffs, "first") as first, pinned_program(bpffs, "second") as second:
        tc.replace_bpf_filter(nl, va, first.fd, GALACTIC_NAME)
        tc.replace_bpf_filter(nl, va, second.fd, GALACTIC_NAME)
        shown = tc_bpf_filters(name, "va")
        assert [entry["options"]["prog"]["id"] for entry in shown] == [second.info.prog_id]
        assert [f.prog_id for f in tc.bpf_filters(nl, va)] == [second.info.prog_id]


def test_a_filter_on_the_egress_hook_is_on_egress_only(veth: tuple[Rtnl, str, int, int],
                                                       bpffs: Path) -> None:
    nl, name, va, _ = veth
    tc.ensure_clsact(nl, va)
    with pinned_program(bpffs, "egress") as prog:
        tc.replace_bpf_filter(nl, va, prog.fd, "out", hook=tc.TC_H_EGRESS_HOOK, priority=7,
                              direct_action=False)
    [shown] = tc_bpf_filters(name, "va", "egress")
    assert (shown["pref"], shown["options"]["bpf_name"]) == (7, "out")
    assert "direct-action" not in shown["options"]
    assert tc.bpf_filters(nl, va) == []
    assert [(f.priority, f.direct_action) for f in tc.bpf_filters(
        nl, va, tc.TC_H_EGRESS_HOOK)] == [(7, False)]


def test_delete_filter_removes_it_and_says_when_it_was_absent(
        veth: tuple[Rtnl, str, int, int], bpffs: Path) -> None:
    nl, name, va, _ = veth
    tc.ensure_clsact(nl, va)
    with pinned_program(bpffs, "deleted") as prog:
        tc.replace_bpf_filter(nl, va, prog.fd, GALACTIC_NAME)
    assert tc.delete_filter(nl, va, priority=2) is False
    assert tc.delete_filter(nl, va, priority=1, handle=2) is False
    assert tc.delete_filter(nl, va, priority=1) is True
    assert tc_bpf_filters(name, "va") == []
    assert tc.delete_filter(nl, va, priority=1) is False


def test_a_link_without_clsact_has_no_filters(veth: tuple[Rtnl, str, int, int]) -> None:
    nl, _, _, vb = veth
    assert tc.bpf_filters(nl, vb) == []
    assert tc.delete_filter(nl, vb, priority=1) is False
    assert tc.has_clsact(nl, vb) is False


@pytest.fixture
def peer_netns() -> Iterator[str]:
    """A second netns, for the far end of a veth."""
    with temporary_netns("vpa-bpf") as path:
        yield path


def test_an_attached_drop_program_stops_traffic_until_deleted(
        netns: str, peer_netns: str, bpffs: Path) -> None:
    near, far = os.path.basename(netns), os.path.basename(peer_netns)
    run_ip("-n", near, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", far)
    run_ip("-n", near, "addr", "add", "10.231.7.1/30", "dev", "va")
    run_ip("-n", far, "addr", "add", "10.231.7.2/30", "dev", "vb")
    run_ip("-n", near, "link", "set", "va", "up")
    run_ip("-n", far, "link", "set", "vb", "up")
    assert ping(near, "10.231.7.2")
    with open_netlink(peer_netns) as nl, pinned_program(bpffs, "drop", bpf.TC_ACT_SHOT) as drop:
        vb = nl.get_link(name="vb").index
        tc.ensure_clsact(nl, vb)
        tc.replace_bpf_filter(nl, vb, drop.fd, GALACTIC_NAME)
        assert not ping(near, "10.231.7.2", count=2, wait=1.0)
        assert tc.delete_filter(nl, vb, priority=1)
        assert ping(near, "10.231.7.2")
