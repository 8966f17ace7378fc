"""The bpf(2) and TC wire formats: attr and info layouts against linux/bpf.h, instruction bytes,
the refusals made before any syscall, EINTR; the clsact and bpf filter messages against what
galactic's Go attach sends, and filter dumps decoded. No root; no bpf object or qdisc is made."""

from __future__ import annotations

import ctypes
import errno
import platform
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.kernel import bpf, tc
from cni_plugin.kernel.bpf import BpfError, MapInfo, PinnedMap
from cni_plugin.kernel.rtnl import (
    Message,
    NetlinkError,
    Rtnl,
    attr,
    attr_str,
    attr_u32,
    nested,
    parse_attrs,
)

BPF_HEADER = Path("/usr/include/linux/bpf.h")
U32 = st.integers(0, 0xFFFFFFFF)
NAMES = st.text(st.characters(min_codepoint=ord("0"), max_codepoint=ord("z")), max_size=15)


def field_offsets(layout: struct.Struct) -> list[int]:
    """The offset of each field of a '='-prefixed (unaligned) struct format; pads skipped."""
    offsets, prefix = [], "="
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", layout.format.lstrip("=")):
        if code != "x":
            offsets.append(struct.calcsize(prefix))
        prefix += count + code
    return offsets


# The offsets linux/bpf.h gives each field we pack, in the order of our formats.
C_OFFSETS: dict[str, tuple[struct.Struct, list[str]]] = {
    "MAP_CREATE_ATTR": (bpf.MAP_CREATE_ATTR, [
        "union bpf_attr, map_type", "union bpf_attr, key_size", "union bpf_attr, value_size",
        "union bpf_attr, max_entries", "union bpf_attr, map_flags",
        "union bpf_attr, inner_map_fd", "union bpf_attr, numa_node",
        "union bpf_attr, map_name"]),
    "ELEM_ATTR": (bpf.ELEM_ATTR, [
        "union bpf_attr, map_fd", "union bpf_attr, key", "union bpf_attr, next_key",
        "union bpf_attr, flags"]),
    "PROG_LOAD_ATTR": (bpf.PROG_LOAD_ATTR, [
        "union bpf_attr, prog_type", "union bpf_attr, insn_cnt", "union bpf_attr, insns",
        "union bpf_attr, license", "union bpf_attr, log_level", "union bpf_attr, log_size",
        "union bpf_attr, log_buf", "union bpf_attr, kern_version",
        "union bpf_attr, prog_flags", "union bpf_attr, prog_name"]),
    "OBJ_ATTR": (bpf.OBJ_ATTR, [
        "union bpf_attr, pathname", "union bpf_attr, bpf_fd", "union bpf_attr, file_flags"]),
    "INFO_ATTR": (bpf.INFO_ATTR, [
        "union bpf_attr, info.bpf_fd", "union bpf_attr, info.info_len",
        "union bpf_attr, info.info"]),
    "MAP_INFO": (bpf.MAP_INFO, [
        "struct bpf_map_info, type", "struct bpf_map_info, id",
        "struct bpf_map_info, key_size", "struct bpf_map_info, value_size",
        "struct bpf_map_info, max_entries", "struct bpf_map_info, map_flags",
        "struct bpf_map_info, name"]),
    "PROG_INFO": (bpf.PROG_INFO, [
        "struct bpf_prog_info, type", "struct bpf_prog_info, id", "struct bpf_prog_info, tag",
        "struct bpf_prog_info, name"]),
}
# Where each field sits per the uapi header (checked against the compiler below).
EXPECTED_OFFSETS = {
    "MAP_CREATE_ATTR": [0, 4, 8, 12, 16, 20, 24, 28],
    "ELEM_ATTR": [0, 8, 16, 24],
    "PROG_LOAD_ATTR": [0, 4, 8, 16, 24, 28, 32, 40, 44, 48],
    "OBJ_ATTR": [0, 8, 12],
    "INFO_ATTR": [0, 4, 8],
    "MAP_INFO": [0, 4, 8, 12, 16, 20, 24],
    "PROG_INFO": [0, 4, 8, 64],
}


def test_attr_and_info_layouts_put_each_field_where_the_uapi_header_does() -> None:
    assert {name: field_offsets(layout) for name, (layout, _) in C_OFFSETS.items()} == \
        EXPECTED_OFFSETS


@pytest.mark.skipif(shutil.which("clang-14") is None or not BPF_HEADER.exists(),
                    reason="needs clang-14 and linux/bpf.h to ask the compiler")
def test_the_compiler_agrees_with_the_layouts(tmp_path: Path) -> None:
    fields = [field for _, (_, names) in C_OFFSETS.items() for field in names]
    source = tmp_path / "offsets.c"
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n#include <linux/bpf.h>\n"
                      "int main(void) {\n" + "".join(
                          f'    printf("%zu\\n", offsetof({field}));\n' for field in fields)
                      + "    return 0;\n}\n")
    subprocess.run(["clang-14", "-o", str(tmp_path / "offsets"), str(source)], check=True,
                   capture_output=True, timeout=60)
    printed = subprocess.run([str(tmp_path / "offsets")], check=True, capture_output=True,
                             text=True, timeout=10).stdout.split()
    assert [int(offset) for offset in printed] == \
        [offset for name in C_OFFSETS for offset in EXPECTED_OFFSETS[name]]


@given(map_type=U32, map_id=U32, key_size=U32, value_size=U32, max_entries=U32, flags=U32,
       name=NAMES)
def test_map_info_decodes_what_the_kernel_writes(map_type: int, map_id: int, key_size: int,
                                                 value_size: int, max_entries: int, flags: int,
                                                 name: str) -> None:
    raw = bpf.MAP_INFO.pack(map_type, map_id, key_size, value_size, max_entries, flags,
                            bpf.object_name(name))
    assert bpf.decode_map_info(raw) == MapInfo(
        map_type=map_type, key_size=key_size, value_size=value_size, max_entries=max_entries,
        flags=flags, name=name, map_id=map_id)


@given(prog_type=U32, prog_id=U32, tag=st.binary(min_size=8, max_size=8), name=NAMES,
       skipped=st.binary(min_size=48, max_size=48))
def test_prog_info_decodes_type_id_name_and_the_tag_as_16_hex_digits(
        prog_type: int, prog_id: int, tag: bytes, name: str, skipped: bytes) -> None:
    raw = struct.pack("=II8s48s16s", prog_type, prog_id, tag, skipped, bpf.object_name(name))
    info = bpf.decode_prog_info(raw)
    assert (info.prog_type, info.prog_id, info.name) == (prog_type, prog_id, name)
    assert info.tag == tag.hex() and len(info.tag) == 16


def test_a_name_of_16_bytes_is_refused_before_the_kernel_sees_it() -> None:
    assert bpf.object_name("a" * 15) == b"a" * 15
    with pytest.raises(ValueError, match="longer than 15"):
        bpf.object_name("a" * 16)


def test_default_program_is_r0_minus_one_then_exit() -> None:
    # What `llvm-objdump -d` shows for `return -1;` built for bpfel: b7 00 … ff ff ff ff; 95 …
    assert bpf.constant_program(bpf.TC_ACT_UNSPEC) == bytes.fromhex(
        "b7000000ffffffff" "9500000000000000")
    assert bpf.constant_program(bpf.TC_ACT_SHOT) == bytes.fromhex(
        "b700000002000000" "9500000000000000")


def test_instructions_that_are_not_whole_are_refused_before_loading() -> None:
    with pytest.raises(ValueError, match="not a whole number"):
        bpf.load_sched_cls("short", b"\x95" * 7)


def closed_map(map_type: int = bpf.BPF_MAP_TYPE_HASH) -> PinnedMap:
    """A PinnedMap with no fd: any check made before the syscall shows, nothing else runs."""
    info = MapInfo(map_type=map_type, key_size=4, value_size=8, max_entries=16, flags=0,
                   name="vrf_table", map_id=1)
    return PinnedMap("/sys/fs/bpf/galactic/vrf_table", -1, info)


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.lookup(b"abc"), "key for map 'vrf_table' at .*vrf_table is 3 bytes; "
                                 "its key_size is 4"),
    (lambda m: m.update(b"abcd", b"v"), "value for map 'vrf_table' at .* is 1 bytes; "
                                        "its value_size is 8"),
    (lambda m: m.delete(b"abcde"), "key for .* is 5 bytes; its key_size is 4"),
])
def test_wrong_key_or_value_length_names_the_map_and_both_sizes(call: Any, message: str
                                                                 ) -> None:
    with pytest.raises(ValueError, match=message):
        call(closed_map())


def test_per_cpu_maps_are_refused_rather_than_overrun() -> None:
    with pytest.raises(BpfError, match="per-CPU") as raised:
        closed_map(map_type=5).lookup(b"abcd")
    assert raised.value.errno == errno.EOPNOTSUPP


def test_a_closed_map_says_so_without_a_syscall() -> None:
    with pytest.raises(BpfError, match="closed") as raised:
        closed_map().lookup(b"abcd")
    assert raised.value.errno == errno.EBADF


def test_an_unknown_machine_fails_at_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(OSError, match="riscv64") as raised:
        bpf.map_info(0)
    assert raised.value.errno == errno.ENOSYS


def test_eintr_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([(-1, errno.EINTR), (-1, errno.EINTR), (7, 0)])
    calls: list[int] = []

    def interrupted(number: Any, cmd: Any, attr: Any, size: Any) -> int:
        result, code = next(answers)
        calls.append(cmd.value)
        ctypes.set_errno(code)
        return result

    monkeypatch.setattr(bpf, "_syscall", interrupted)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert bpf.create_map(bpf.BPF_MAP_TYPE_HASH, 4, 4, 1) == 7
    assert calls == [bpf.BPF_MAP_CREATE] * 3


def test_other_errors_name_the_operation_and_object(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: Any) -> int:
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(bpf, "_syscall", refused)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(BpfError, match="open map /sys/fs/bpf/x: Operation not permitted"):
        bpf.open_map("/sys/fs/bpf/x")


# TC ----------------------------------------------------------------------------------------

GALACTIC_NAME = "galactic_usid_egress"
PROTOCOLS = st.integers(0, 0xFFFF)
FILTER_NAMES = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"),
                       max_size=40)


def test_filter_replace_is_what_galactic_attach_one_sends() -> None:
    # netlink.FilterReplace(&BpfFilter{LinkIndex: 7, Parent: HANDLE_MIN_INGRESS,
    # Handle: MakeHandle(0, 1), Protocol: ETH_P_ALL, Priority: 1, Fd: 9,
    # Name: "galactic_usid_egress", DirectAction: true}), after its nlmsghdr.
    expected = bytes.fromhex(
        "00000000" "07000000" "01000000" "f2ffffff" "00030100"  # tcmsg; info = 1<<16 | htons(3)
        "0800" "0100" "62706600"  # TCA_KIND "bpf\0"
        "3000" "0200"  # TCA_OPTIONS (not flagged NLA_F_NESTED), 48 bytes:
        "0800" "0600" "09000000"  # TCA_BPF_FD 9
        "1900" "0700" + GALACTIC_NAME.encode().hex() + "00" "000000"  # TCA_BPF_NAME, padded
        "0800" "0800" "01000000")  # TCA_BPF_FLAGS ACT_DIRECT
    assert tc.bpf_filter_request(7, 9, GALACTIC_NAME, hook=tc.TC_H_INGRESS_HOOK, priority=1,
                                 handle=1, protocol=tc.ETH_P_ALL, direct_action=True) == expected


def test_filter_flags_are_sent_even_when_zero_and_no_classid() -> None:
    body = tc.bpf_filter_request(7, 9, "x", hook=tc.TC_H_EGRESS_HOOK, priority=2, handle=1,
                                 protocol=tc.ETH_P_ALL, direct_action=False)
    options = parse_attrs(parse_attrs(body, tc.TCMSG.size)[tc.TCA_OPTIONS])
    assert sorted(options) == [tc.TCA_BPF_FD, tc.TCA_BPF_NAME, tc.TCA_BPF_FLAGS]
    assert options[tc.TCA_BPF_FLAGS] == struct.pack("=I", 0)


def test_clsact_is_what_galactic_ensure_clsact_adds() -> None:
    # netlink.QdiscAdd(&Clsact{LinkIndex: 7, Handle: MakeHandle(0xffff, 0),
    # Parent: HANDLE_CLSACT}): a kind and no TCA_OPTIONS.
    assert tc.clsact_request(7) == bytes.fromhex(
        "00000000" "07000000" "0000ffff" "f1ffffff" "00000000"
        "0b00" "0100" "636c7361637400" "00")


@given(ifindex=st.integers(1, 2**31 - 1), fd=U32, name=FILTER_NAMES,
       hook=st.sampled_from([tc.TC_H_INGRESS_HOOK, tc.TC_H_EGRESS_HOOK]),
       priority=PROTOCOLS, handle=U32, protocol=PROTOCOLS, direct_action=st.booleans())
def test_a_filter_request_decodes_to_the_filter_it_asked_for(
        ifindex: int, fd: int, name: str, hook: int, priority: int, handle: int,
        protocol: int, direct_action: bool) -> None:
    body = tc.bpf_filter_request(ifindex, fd, name, hook=hook, priority=priority,
                                 handle=handle, protocol=protocol, direct_action=direct_action)
    assert tc.decode_bpf_filter(body) == tc.BpfFilter(
        priority=priority, handle=handle, protocol=protocol, name=name, prog_id=None,
        direct_action=direct_action)
    assert struct.unpack_from("=i", body, 4)[0] == ifindex
    assert struct.unpack_from("=I", body, 12)[0] == hook


@given(priority=PROTOCOLS, handle=U32, protocol=PROTOCOLS, name=FILTER_NAMES, prog_id=U32,
       tag=st.binary(min_size=8, max_size=8), flags=st.sampled_from([None, 0, 1, 3]))
def test_a_dumped_bpf_filter_decodes_its_id_name_and_flags(
        priority: int, handle: int, protocol: int, name: str, prog_id: int, tag: bytes,
        flags: int | None) -> None:
    # As cls_bpf_dump writes it: TCA_BPF_FLAGS only when set, the program's id and tag.
    options = attr_str(tc.TCA_BPF_NAME, name) + attr_u32(tc.TCA_BPF_ID, prog_id) + \
        attr(tc.TCA_BPF_TAG, tag) + (b"" if flags is None else attr_u32(tc.TCA_BPF_FLAGS, flags))
    payload = tc.tcmsg(3, handle, tc.TC_H_INGRESS_HOOK, tc.filter_info(priority, protocol)) + \
        attr_str(tc.TCA_KIND, "bpf") + nested(tc.TCA_OPTIONS, options)
    assert tc.decode_bpf_filter(payload) == tc.BpfFilter(
        priority=priority, handle=handle, protocol=protocol, name=name, prog_id=prog_id,
        direct_action=bool(flags and flags & 1))


def test_a_dump_entry_without_options_or_of_another_kind_is_no_bpf_filter() -> None:
    header = tc.tcmsg(3, 0, tc.TC_H_INGRESS_HOOK, tc.filter_info(1, tc.ETH_P_ALL))
    assert tc.decode_bpf_filter(header + attr_str(tc.TCA_KIND, "bpf")) is None
    assert tc.decode_bpf_filter(header + attr_str(tc.TCA_KIND, "u32") +
                                nested(tc.TCA_OPTIONS, attr_u32(1, 1))) is None


def test_filter_info_holds_priority_and_the_protocol_in_network_order() -> None:
    assert tc.filter_info(1, tc.ETH_P_ALL) == 0x00010300
    assert tc.filter_info(0xFFFF, 0x86DD) == 0xFFFFDD86


class ScriptedRtnl(Rtnl):
    """An Rtnl without a socket: dumps answer `qdiscs`, requests raise `refusal`."""

    def __init__(self, qdiscs: list[str], refusal: NetlinkError | None = None) -> None:
        self.qdiscs = qdiscs
        self.refusal = refusal
        self.sent: list[int] = []

    def dump(self, msg_type: int, body: bytes, consistent: bool = False) -> list[Message]:
        return [Message(tc.RTM_NEWQDISC, 0, 1, tc.tcmsg(7) + attr_str(tc.TCA_KIND, kind))
                for kind in self.qdiscs]

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[Message]:
        self.sent.append(msg_type)
        if self.refusal is not None:
            raise self.refusal
        return []


def test_ensure_clsact_adds_nothing_when_the_link_has_one() -> None:
    scripted = ScriptedRtnl(["noqueue", "clsact"])
    assert tc.ensure_clsact(scripted, 7) is False
    assert scripted.sent == []


def test_ensure_clsact_takes_a_concurrent_add_as_done() -> None:
    scripted = ScriptedRtnl(["noqueue"], NetlinkError(errno.EEXIST))
    assert tc.ensure_clsact(scripted, 7) is False
    assert scripted.sent == [tc.RTM_NEWQDISC]


def test_tc_errors_name_the_operation_and_interface_index() -> None:
    scripted = ScriptedRtnl(["clsact"], NetlinkError(errno.EBADF))
    with pytest.raises(NetlinkError, match=r"attach bpf filter 'galactic_usid_egress' "
                       r"\(priority 1, handle 0x1\) to ingress on ifindex 7: Bad file") as raised:
        tc.replace_bpf_filter(scripted, 7, 99, GALACTIC_NAME)
    assert raised.value.code == errno.EBADF
