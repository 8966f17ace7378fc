"""vpc-attach-ipam's allocator and store as a state machine under crashes, full disks and damaged
files (issue 10): whatever happens, no address is ever held by two attachments.

A crash is the n-th filesystem write of an invocation raising `Crash`, which nothing catches;
every later write of that invocation raises it too (a killed process runs no `finally` either),
and the next rule is a new process with fresh PoolState objects. A full disk is ENOSPC from the
n-th write on. The on-disk state is read here directly (file names and JSON bodies), never
through the store.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cni_plugin.ipam.plugin import allocator
from cni_plugin.ipam.plugin.config import parse_ipam
from cni_plugin.ipam.plugin.store import Attachment
from netconf.errors import IO_FAILURE, IPAM_EXHAUSTED, CniError

NETWORK = "faults"
V6_SUBNET, V4_SUBNET = "fd00::/93", "10.0.0.0/29"  # 7 and 5 allocatable blocks
CAPACITY = {6: 7, 4: 5}
ATTACHMENTS = [Attachment(cid, ifname) for cid in "abcd" for ifname in ("eth0", "net1")]
attachments = st.sampled_from(ATTACHMENTS)
write_numbers = st.integers(min_value=1, max_value=24)  # a dual-stack ADD makes at most ~22

# What every run of the machine saw, for the summary the test prints.
STATS: Counter[str] = Counter()


class Crash(BaseException):
    """The process is killed at this write (a BaseException: no `except` of the code stops it)."""


def _owner(body: bytes) -> Attachment | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("containerID"), str) \
            or not isinstance(data.get("ifname"), str):
        return None
    return Attachment(data["containerID"], data["ifname"])


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Disk:
    """The network's state as files: records by (pool dir, address), index entries, temps."""

    records: dict[tuple[str, str], Attachment | None]
    index: dict[tuple[str, str], str]
    temps: frozenset[str]

    @classmethod
    def read(cls, network_dir: Path) -> Disk:
        """Read every pool directory under network_dir."""
        records: dict[tuple[str, str], Attachment | None] = {}
        index: dict[tuple[str, str], str] = {}
        temps: set[str] = set()
        for pool in sorted(network_dir.iterdir()) if network_dir.exists() else []:
            for path in pool.iterdir():
                if path.name.startswith(".tmp-"):
                    temps.add(str(path))
                elif path.is_file() and _is_address(path.name):
                    records[(pool.name, path.name)] = _owner(path.read_bytes())
            entries = pool / "attachments"
            for path in entries.iterdir() if entries.exists() else []:
                if path.name.startswith(".tmp-"):
                    temps.add(str(path))
                else:
                    index[(pool.name, path.name)] = path.read_text(errors="replace").strip()
        return cls(records, index, frozenset(temps))

    def held_by(self, attachment: Attachment) -> list[tuple[str, str]]:
        """(pool dir, address) of every readable record naming attachment."""
        return sorted(key for key, owner in self.records.items() if owner == attachment)


@dataclass
class FaultyDisk:
    """Counts the filesystem writes under `root` while active; crashes or fills the disk at one.

    Writes: creating open(2) (temp and lock files), write(2) to such a file, link, replace and
    unlink. `crash_at`: that write kills the process. `full_from`: from that write on, every
    write that needs space fails with ENOSPC (unlink still works, as on a real full disk).
    """

    root: str
    crash_at: int | None = None
    full_from: int | None = None
    count: int = 0
    hit: str | None = None  # the write the fault struck, e.g. "link:record"
    dead: bool = False
    _fds: dict[int, str] = field(default_factory=dict)  # open fds under root: their paths

    def _kind(self, path: str) -> str:
        name = os.path.basename(path)
        if name.startswith(".tmp-"):
            return "tmp"
        if os.path.basename(os.path.dirname(path)) == "attachments":
            return "index"
        return {"last_reserved": "cursor", "lock": "lock"}.get(name, "record")

    def _write(self, call: str, path: str, needs_space: bool) -> None:
        if self.dead:
            raise Crash(path)
        self.count += 1
        label = f"{call}:{self._kind(path)}"
        if self.count == self.crash_at:
            self.dead, self.hit = True, label
            raise Crash(path)
        if needs_space and self.full_from is not None and self.count >= self.full_from:
            self.hit = self.hit or label
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    def _mine(self, path: Any) -> bool:
        return isinstance(path, str) and path.startswith(self.root)

    @contextlib.contextmanager
    def active(self) -> Iterator[FaultyDisk]:
        """Route os.open/write/close/link/replace/unlink through the counter."""
        real_open, real_write, real_close = os.open, os.write, os.close
        real_link, real_replace, real_unlink = os.link, os.replace, os.unlink

        def open_(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
            if self._mine(path) and flags & os.O_CREAT and not os.path.exists(path):
                self._write("open", path, needs_space=True)
            fd = real_open(path, flags, mode, **kw)
            if self._mine(path):
                self._fds[fd] = path
            return fd

        def write(fd: int, data: Any) -> int:
            if fd in self._fds:
                self._write("write", self._fds[fd], needs_space=True)
            return real_write(fd, data)

        def close(fd: int) -> None:
            self._fds.pop(fd, None)
            real_close(fd)

        def link(src: Any, dst: Any, **kw: Any) -> None:
            if self._mine(dst):
                self._write("link", dst, needs_space=True)
            real_link(src, dst, **kw)

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            if self._mine(dst):
                self._write("replace", dst, needs_space=True)
            real_replace(src, dst, **kw)

        def unlink(path: Any, **kw: Any) -> None:
            if self._mine(path):
                self._write("unlink", path, needs_space=False)
            real_unlink(path, **kw)

        patched: dict[str, Callable[..., Any]] = {
            "open": open_, "write": write, "close": close, "link": link, "replace": replace,
            "unlink": unlink}
        originals = {name: getattr(os, name) for name in patched}
        try:
            for name, function in patched.items():
                setattr(os, name, function)
            yield self
        finally:
            for name, function in originals.items():
                setattr(os, name, function)


class IpamFaults(RuleBasedStateMachine):
    """ADD, DEL and GC, each also killed at its n-th write or run on a disk full from it; and
    damage to records, index entries and the cursor. The model: what each attachment holds
    (record names, one per pool), or None once a crash or damage made it unknown."""

    def __init__(self) -> None:
        super().__init__()
        self.data_dir = Path(tempfile.mkdtemp(prefix="ipam-faults-"))
        self.network_dir = self.data_dir / NETWORK
        self.conf = parse_ipam({"type": "vpc-attach-ipam", "dataDir": str(self.data_dir),
                                "ipv6_subnet": V6_SUBNET, "ipv4_subnet": V4_SUBNET,
                                "lockTimeoutSeconds": 1}, "1.1.0", NETWORK)
        self.held: dict[Attachment, tuple[str, ...] | None] = {a: () for a in ATTACHMENTS}
        STATS["examples"] += 1

    def teardown(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def disk(self) -> Disk:
        return Disk.read(self.network_dir)

    def faults(self, crash_at: int | None = None, full_from: int | None = None) -> FaultyDisk:
        STATS["ADD/DEL/GC invocations"] += 1
        return FaultyDisk(str(self.data_dir), crash_at=crash_at, full_from=full_from)

    def _record_crash(self, verb: str, faults: FaultyDisk) -> None:
        STATS[f"crash {verb} at {faults.hit}"] += 1
        event(f"crash {verb} at {faults.hit}")

    # Verbs.

    def _add(self, attachment: Attachment, faults: FaultyDisk) -> None:
        before = self.disk()
        try:
            with faults.active():
                got = allocator.allocate_all(self.conf, attachment)
        except Crash:
            self._record_crash("ADD", faults)
            self.held[attachment] = None
            return
        except CniError as exc:
            self._add_failed(attachment, faults, exc, before)
            return
        if faults.hit is not None:  # a full disk struck only the cursor (a hint)
            STATS[f"disk full from {faults.hit}: ADD succeeded"] += 1
        names = tuple(a.address.split("/")[0] for a in got)
        known = self.held[attachment]
        assert not known or names == known, f"repeated ADD of {attachment} moved {known}→{names}"
        self.held[attachment] = names

    def _add_failed(self, attachment: Attachment, faults: FaultyDisk, exc: CniError,
                    before: Disk) -> None:
        after = self.disk()
        if exc.code == IO_FAILURE:
            assert faults.full_from is not None, exc.msg
            assert exc.msg.startswith("cannot "), exc.msg
            STATS[f"disk full from {faults.hit}: ADD code 5"] += 1
            event(f"disk full from {faults.hit}")
        else:
            assert exc.code == IPAM_EXHAUSTED, (exc.code, exc.msg)
            used = Counter(pool for pool, _ in after.records)
            assert any(used[p] >= CAPACITY[4 if "." in p else 6] for p in used), used
            STATS["ADD exhausted"] += 1
        if self.held[attachment] == ():  # held nothing: a failed ADD leaves nothing
            assert after.held_by(attachment) == [], after.held_by(attachment)
        assert after.temps <= before.temps, after.temps - before.temps

    @rule(attachment=attachments)
    def add(self, attachment: Attachment) -> None:
        self._add(attachment, self.faults())

    @rule(attachment=attachments, n=write_numbers)
    def add_killed(self, attachment: Attachment, n: int) -> None:
        self._add(attachment, self.faults(crash_at=n))

    @rule(attachment=attachments, n=write_numbers)
    def add_on_full_disk(self, attachment: Attachment, n: int) -> None:
        self._add(attachment, self.faults(full_from=n))

    def _delete(self, attachment: Attachment, faults: FaultyDisk) -> None:
        try:
            with faults.active():
                allocator.release(self.conf, attachment)
        except Crash:
            self._record_crash("DEL", faults)
            self.held[attachment] = None
            return
        self.held[attachment] = ()
        after = self.disk()
        assert after.held_by(attachment) == [], after.held_by(attachment)
        entry = f"{attachment.container_id}@{attachment.ifname}"
        assert [key for key in after.index if key[1] == entry] == []

    @rule(attachment=attachments)
    def delete(self, attachment: Attachment) -> None:
        self._delete(attachment, self.faults())

    @rule(attachment=attachments, n=write_numbers)
    def delete_killed(self, attachment: Attachment, n: int) -> None:
        self._delete(attachment, self.faults(crash_at=n))

    def _gc(self, valid: frozenset[Attachment], faults: FaultyDisk) -> None:
        try:
            with faults.active():
                allocator.collect_garbage(self.conf, set(valid))
        except Crash:
            self._record_crash("GC", faults)
            for attachment in ATTACHMENTS:
                if attachment not in valid:
                    self.held[attachment] = None
            return
        for attachment in ATTACHMENTS:
            if attachment not in valid:
                self.held[attachment] = ()
        after = self.disk()
        assert after.temps == frozenset(), after.temps
        for key, owner in after.records.items():
            assert owner is not None and owner in valid, (key, owner)
        for (pool, entry), name in after.index.items():
            owner = after.records.get((pool, name))
            assert owner is not None and f"{owner.container_id}@{owner.ifname}" == entry, \
                (pool, entry, name)

    @rule(valid=st.frozensets(attachments))
    def gc(self, valid: frozenset[Attachment]) -> None:
        self._gc(valid, self.faults())

    @rule(valid=st.frozensets(attachments), n=write_numbers)
    def gc_killed(self, valid: frozenset[Attachment], n: int) -> None:
        self._gc(valid, self.faults(crash_at=n))

    # Damage from outside (power loss, an operator, a bug elsewhere).

    def pools(self) -> list[Path]:
        return sorted(p for p in self.network_dir.iterdir()) if self.network_dir.exists() else []

    @precondition(lambda self: self.disk().records)
    @rule(data=st.data(), body=st.sampled_from([b"", b"{\"containerID\": ", b"[]", b"\xff"]))
    def damage_record(self, data: st.DataObject, body: bytes) -> None:
        pool, name = data.draw(st.sampled_from(sorted(self.disk().records)))
        owner = self.disk().records[(pool, name)]
        (self.network_dir / pool / name).write_bytes(body)
        if owner is not None and name in (self.held[owner] or ()):
            self.held[owner] = None  # its record is unreadable now: it may get another block
        STATS["damaged records"] += 1

    @precondition(lambda self: self.pools())
    @rule(data=st.data(), attachment=attachments,
          damage=st.sampled_from(["delete", "garbage", "other's record", "free address"]))
    def damage_index(self, data: st.DataObject, attachment: Attachment, damage: str) -> None:
        pool = data.draw(st.sampled_from(self.pools()))
        entry = pool / "attachments" / f"{attachment.container_id}@{attachment.ifname}"
        records = sorted(name for p, name in self.disk().records if p == pool.name)
        if damage == "delete":
            entry.unlink(missing_ok=True)
        elif damage == "garbage":
            entry.write_bytes(b"\x00not a record")
        elif damage == "other's record" and records:
            entry.write_text(data.draw(st.sampled_from(records)))
        else:
            family = 4 if "." in pool.name else 6
            entry.write_text("10.0.0.6" if family == 4 else "fd00::6:0:0")
        STATS[f"damaged index ({damage})"] += 1

    @precondition(lambda self: self.pools())
    @rule(data=st.data(), body=st.sampled_from([None, "", "garbage", "10.0.0.0", "fd00::"]))
    def damage_cursor(self, data: st.DataObject, body: str | None) -> None:
        cursor = data.draw(st.sampled_from(self.pools())) / "last_reserved"
        if body is None:
            cursor.unlink(missing_ok=True)
        else:
            cursor.write_text(body)
        STATS["damaged cursors"] += 1

    # What must hold after every step.

    @invariant()
    def no_address_is_held_twice(self) -> None:
        disk = self.disk()
        handed_out = [name for names in self.held.values() for name in names or ()]
        duplicates = len(handed_out) - len(set(handed_out))
        STATS["duplicate addresses"] += duplicates
        assert duplicates == 0, self.held
        for attachment, names in self.held.items():
            if names is None:
                continue
            mine = sorted(name for _, name in disk.held_by(attachment))
            assert mine == sorted(names), f"{attachment} holds {mine} on disk, {names} answered"

    @invariant()
    def an_attachment_holds_at_most_one_block_per_pool(self) -> None:
        per_pool = Counter((pool, owner) for (pool, _), owner in self.disk().records.items()
                           if owner is not None)
        assert all(n == 1 for n in per_pool.values()), per_pool


SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_no_address_is_held_twice_through_crashes_full_disks_and_damage() -> None:
    STATS.clear()
    run_state_machine_as_test(IpamFaults, settings=SETTINGS)
    print("\n" + "\n".join(f"{key}: {n}" for key, n in sorted(STATS.items())))
    assert STATS["duplicate addresses"] == 0
