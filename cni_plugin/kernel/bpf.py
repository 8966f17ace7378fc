"""The bpf(2) syscall on the standard library: galactic's pinned maps and programs, opened by
path, read and written from this process (no `bpftool`).

Each call is one syscall with no wait on the network, so there is no timeout; EINTR is retried.
`create_map`, `pin` and `load_sched_cls` exist for the tests and the harness only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM = 0, 1, 2, 3
BPF_MAP_GET_NEXT_KEY, BPF_PROG_LOAD, BPF_OBJ_PIN, BPF_OBJ_GET = 4, 5, 6, 7
BPF_OBJ_GET_INFO_BY_FD = 15

BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_LPM_TRIE = 11
# A per-CPU map's value is value_size per possible CPU: a lookup would overrun our buffer.
PERCPU_MAP_TYPES = frozenset({5, 6, 10, 21})  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, …
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2
BPF_F_NO_PREALLOC = 1
OBJ_NAME_LEN = 16  # BPF_OBJ_NAME_LEN, with the NUL

InfoT = TypeVar("InfoT")
_SYSCALL_NUMBERS = {"x86_64": 321, "aarch64": 280}

# union bpf_attr, one layout per command (linux/bpf.h); fields past these stay zero.
# BPF_MAP_CREATE: map_type, key_size, value_size, max_entries, map_flags, inner_map_fd,
# numa_node, map_name.
MAP_CREATE_ATTR = struct.Struct("=IIIIIII16s")
# BPF_MAP_*_ELEM and GET_NEXT_KEY: map_fd, (pad), key, value or next_key, flags.
ELEM_ATTR = struct.Struct("=I4xQQQ")
# BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level, log_size, log_buf,
# kern_version, prog_flags, prog_name.
PROG_LOAD_ATTR = struct.Struct("=IIQQIIQII16s")
# BPF_OBJ_PIN / BPF_OBJ_GET: pathname, bpf_fd, file_flags.
OBJ_ATTR = struct.Struct("=QII")
# BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len, info.
INFO_ATTR = struct.Struct("=IIQ")
# The leading fields of struct bpf_map_info: type, id, key_size, value_size, max_entries,
# map_flags, name. The kernel fills no more than the info_len we pass.
MAP_INFO = struct.Struct("=IIIIII16s")
# The leading fields of struct bpf_prog_info: type, id, tag[8], then 48 bytes we skip
# (jited/xlated lengths and pointers, load_time, created_by_uid, nr_map_ids, map_ids), name.
PROG_INFO = struct.Struct("=II8s48x16s")
# struct bpf_insn: code, dst_reg (low nibble) | src_reg (high nibble), off, imm.
INSN = struct.Struct("=BBhi")
BPF_MOV64_IMM, BPF_EXIT = 0xB7, 0x95  # BPF_ALU64|BPF_MOV|BPF_K, BPF_JMP|BPF_EXIT
TC_ACT_UNSPEC, TC_ACT_OK, TC_ACT_SHOT = -1, 0, 2
VERIFIER_LOG_SIZE = 1 << 16

_syscall = ctypes.CDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A bpf(2) call failed: the errno, and a message naming the operation and the object
    (pinned path or map name) it failed on."""

    def __init__(self, code: int, operation: str, target: str, detail: str | None = None
                 ) -> None:
        super().__init__(code, f"{operation} {target}: {detail or os.strerror(code)}")
        self.code = code
        self.operation = operation
        self.target = target


@dataclass(frozen=True)
class MapInfo:
    """What the kernel says about a map (struct bpf_map_info)."""

    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str
    map_id: int


@dataclass(frozen=True)
class ProgInfo:
    """What the kernel says about a program (struct bpf_prog_info); tag as 16 hex digits."""

    prog_type: int
    name: str
    prog_id: int
    tag: str


# Encoding (pure) ----------------------------------------------------------------------------

def object_name(name: str) -> bytes:
    """A map or program name as the kernel takes it: at most 15 bytes, NUL-padded."""
    raw = name.encode()
    if len(raw) >= OBJ_NAME_LEN:
        raise ValueError(f"BPF object name {name!r} is longer than {OBJ_NAME_LEN - 1} bytes")
    return raw


def decode_name(raw: bytes) -> str:
    """A NUL-padded name field."""
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def decode_map_info(raw: bytes) -> MapInfo:
    """MapInfo from the leading bytes of a struct bpf_map_info."""
    map_type, map_id, key_size, value_size, max_entries, flags, name = MAP_INFO.unpack_from(raw)
    return MapInfo(map_type=map_type, key_size=key_size, value_size=value_size,
                   max_entries=max_entries, flags=flags, name=decode_name(name), map_id=map_id)


def decode_prog_info(raw: bytes) -> ProgInfo:
    """ProgInfo from the leading bytes of a struct bpf_prog_info."""
    prog_type, prog_id, tag, name = PROG_INFO.unpack_from(raw)
    return ProgInfo(prog_type=prog_type, name=decode_name(name), prog_id=prog_id, tag=tag.hex())


def constant_program(verdict: int) -> bytes:
    """The instructions of a program that only returns verdict (`r0 = verdict; exit`)."""
    return INSN.pack(BPF_MOV64_IMM, 0, 0, verdict) + INSN.pack(BPF_EXIT, 0, 0, 0)


# The syscall --------------------------------------------------------------------------------

def _syscall_number() -> int:
    machine = platform.machine()
    if machine not in _SYSCALL_NUMBERS:
        raise BpfError(errno.ENOSYS, "bpf(2)", f"on {machine!r}",
                       "no syscall number known for this machine")
    return _SYSCALL_NUMBERS[machine]


def _buffer(data: bytes | int) -> ctypes.Array[ctypes.c_char]:
    """A C buffer holding data exactly (or that many zero bytes); no NUL is appended."""
    if isinstance(data, int):
        return ctypes.create_string_buffer(data)
    return ctypes.create_string_buffer(data, len(data))


def _address(buffer: ctypes.Array[ctypes.c_char] | None) -> int:
    return 0 if buffer is None else ctypes.addressof(buffer)


def _bpf(cmd: int, attr: bytes, operation: str, target: str) -> int:
    """bpf(cmd, attr, len(attr)): its result, or BpfError; EINTR is retried."""
    number = _syscall_number()
    attr_buffer = _buffer(attr)
    while True:
        result = int(_syscall(ctypes.c_long(number), ctypes.c_long(cmd),
                              ctypes.c_void_p(ctypes.addressof(attr_buffer)),
                              ctypes.c_long(len(attr))))
        if result >= 0:
            return result
        code = ctypes.get_errno()
        if code != errno.EINTR:
            raise BpfError(code, operation, target)


def _obj_get(path: str, what: str) -> int:
    name = _buffer(os.fsencode(path) + b"\0")
    return _bpf(BPF_OBJ_GET, OBJ_ATTR.pack(_address(name), 0, 0), f"open {what}", path)


def _info(fd: int, size: int, target: str) -> bytes:
    info = _buffer(size)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, INFO_ATTR.pack(fd, size, _address(info)), "read info of",
         target)
    return info.raw


def map_info(fd: int) -> MapInfo:
    """What the kernel says about the map behind fd."""
    return decode_map_info(_info(fd, MAP_INFO.size, f"map fd {fd}"))


def prog_info(fd: int) -> ProgInfo:
    """What the kernel says about the program behind fd."""
    return decode_prog_info(_info(fd, PROG_INFO.size, f"program fd {fd}"))


def _object_kind(fd: int) -> str:
    """'map', 'program', … : what a bpf fd holds (its anon inode is bpf-map, bpf-prog, …)."""
    try:
        inode = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "object of unknown kind"
    kind = inode.removeprefix("anon_inode:").removeprefix("bpf-")
    return {"prog": "program"}.get(kind, kind)


def _open_pinned(path: str, kind: str, describe: Callable[[int], InfoT]) -> tuple[int, InfoT]:
    """The fd of the pin at path and what describe reads of it; BpfError (EINVAL) when the pin
    holds another kind of object. No fd is left open on failure."""
    fd = _obj_get(path, kind)
    try:
        found = _object_kind(fd)
        if found != kind:
            raise BpfError(errno.EINVAL, f"open {kind}", path,
                           f"the pin holds a BPF {found}, not a {kind}")
        return fd, describe(fd)
    except BaseException:
        os.close(fd)
        raise


# Pinned maps and programs -------------------------------------------------------------------

class _Pinned(Generic[InfoT]):
    """An fd of a pinned object, its path and what the kernel says of it. A context manager:
    the fd is closed after the block."""

    def __init__(self, path: str, fd: int, info: InfoT) -> None:
        self.path = path
        self.fd = fd
        self.info = info

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the fd (again is a no-op)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class PinnedMap(_Pinned[MapInfo]):
    """A pinned map opened by path; keys and values are raw bytes of exactly key_size and
    value_size."""

    @property
    def target(self) -> str:
        """How errors name this map."""
        return f"map {self.info.name!r} at {self.path}" if self.info.name else \
            f"map at {self.path}"

    def _check(self, what: str, data: bytes, size: int) -> ctypes.Array[ctypes.c_char]:
        if len(data) != size:
            raise ValueError(f"{what} for {self.target} is {len(data)} bytes; its {what}_size "
                             f"is {size}")
        return _buffer(data)

    def _elem(self, cmd: int, operation: str, key: ctypes.Array[ctypes.c_char] | None,
              value: ctypes.Array[ctypes.c_char] | None, flags: int = 0) -> None:
        if self.fd < 0:
            raise BpfError(errno.EBADF, operation, self.target, "the map is closed")
        _bpf(cmd, ELEM_ATTR.pack(self.fd, _address(key), _address(value), flags), operation,
             self.target)

    def _refuse_percpu(self, operation: str) -> None:
        if self.info.map_type in PERCPU_MAP_TYPES:
            raise BpfError(errno.EOPNOTSUPP, operation, self.target,
                           "per-CPU maps hold one value per CPU; not supported")

    def lookup(self, key: bytes) -> bytes | None:
        """The value at key; None when there is none."""
        self._refuse_percpu("look up in")
        key_buffer = self._check("key", key, self.info.key_size)
        value = _buffer(self.info.value_size)
        try:
            self._elem(BPF_MAP_LOOKUP_ELEM, "look up in", key_buffer, value)
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return value.raw

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        """Write value at key (BPF_ANY: create or replace; BPF_NOEXIST / BPF_EXIST: EEXIST /
        ENOENT when the key is / is not there)."""
        self._refuse_percpu("update")
        self._elem(BPF_MAP_UPDATE_ELEM, "update", self._check("key", key, self.info.key_size),
                   self._check("value", value, self.info.value_size), flags)

    def delete(self, key: bytes) -> bool:
        """Delete the entry at key; False when there was none (arrays refuse: EINVAL)."""
        try:
            self._elem(BPF_MAP_DELETE_ELEM, "delete from",
                       self._check("key", key, self.info.key_size), None)
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def keys(self) -> Iterator[bytes]:
        """Every key, in the kernel's order (BPF_MAP_GET_NEXT_KEY from no key).

        When the key last yielded is deleted meanwhile, iteration goes on from whatever the
        kernel answers next: hash and LPM trie maps then answer their first key, so keys seen
        before may come again (and deleting each key as it is yielded still visits all once).
        """
        key: ctypes.Array[ctypes.c_char] | None = None
        while True:
            next_key = _buffer(self.info.key_size)
            try:
                self._elem(BPF_MAP_GET_NEXT_KEY, "list keys of", key, next_key)
            except BpfError as exc:
                if exc.errno == errno.ENOENT:
                    return
                raise
            key = next_key
            yield next_key.raw

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every entry; a key deleted between listing and lookup is skipped."""
        for key in self.keys():
            value = self.lookup(key)
            if value is not None:
                yield key, value


class PinnedProg(_Pinned[ProgInfo]):
    """A pinned program opened by path (its fd is what a TC filter attaches)."""


def open_map(path: str) -> PinnedMap:
    """The map pinned at path; BpfError ENOENT when nothing is pinned there, EINVAL when the
    pin is not a map."""
    return PinnedMap(path, *_open_pinned(path, "map", map_info))


def open_prog(path: str) -> PinnedProg:
    """The program pinned at path; BpfError ENOENT when nothing is pinned there, EINVAL when
    the pin is not a program."""
    return PinnedProg(path, *_open_pinned(path, "program", prog_info))


# For the tests and the harness --------------------------------------------------------------

def create_map(map_type: int, key_size: int, value_size: int, max_entries: int,
               flags: int = 0, name: str = "") -> int:
    """A new map's fd (tests and harness). LPM trie maps get BPF_F_NO_PREALLOC, which the
    kernel requires of them."""
    if map_type == BPF_MAP_TYPE_LPM_TRIE:
        flags |= BPF_F_NO_PREALLOC
    attr = MAP_CREATE_ATTR.pack(map_type, key_size, value_size, max_entries, flags, 0, 0,
                                object_name(name))
    return _bpf(BPF_MAP_CREATE, attr, "create", f"map {name!r}")


def pin(fd: int, path: str) -> None:
    """Pin the map or program of fd at path on a bpffs (tests and harness)."""
    name = _buffer(os.fsencode(path) + b"\0")
    _bpf(BPF_OBJ_PIN, OBJ_ATTR.pack(_address(name), fd, 0), f"pin fd {fd} at", path)


def load_sched_cls(name: str, instructions: bytes | None = None) -> int:
    """The fd of a new SCHED_CLS program (tests and harness); by default it returns
    TC_ACT_UNSPEC. A refused program's error carries the verifier's log."""
    code = constant_program(TC_ACT_UNSPEC) if instructions is None else instructions
    if not code or len(code) % INSN.size:
        raise ValueError(f"program {name!r}: {len(code)} bytes is not a whole number of "
                         f"{INSN.size}-byte instructions")
    insns, license_ = _buffer(code), _buffer(b"GPL\0")

    def load(log: ctypes.Array[ctypes.c_char] | None) -> int:
        attr = PROG_LOAD_ATTR.pack(
            BPF_PROG_TYPE_SCHED_CLS, len(code) // INSN.size, _address(insns),
            _address(license_), 0 if log is None else 1, 0 if log is None else len(log),
            _address(log), 0, 0, object_name(name))
        return _bpf(BPF_PROG_LOAD, attr, "load", f"program {name!r}")

    try:
        return load(None)
    except BpfError as exc:
        log = _buffer(VERIFIER_LOG_SIZE)
        with suppress(BpfError):
            return load(log)  # loaded after all: nothing to explain
        verifier = "; ".join(line for line in log.value.decode(errors="replace").splitlines()
                             if line.strip())
        raise BpfError(exc.code, "load", f"program {name!r}",
                       f"{os.strerror(exc.code)}; verifier: {verifier}") from None
