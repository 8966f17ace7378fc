"""On-disk allocation state of one pool: `dataDir/<network>/<pool id>/`.

Layout (all writes happen under the pool's `lock`):
- `<address>`: one record per allocation, named by the block's first address and holding
  `{"containerID", "ifname"}`, plus `"claim": {"namespace", "name", "uid"}` when an IPAMClaim
  owns it; a claim's record a DEL detached holds the claim alone. Created with link(2), so it
  appears complete and a name that is already taken fails with EEXIST, like O_EXCL;
- `attachments/<containerID>@<ifname>`: the record name an attachment holds, so a repeated ADD
  and DEL find it without scanning the pool (they scan when it is missing or damaged);
- `last_reserved`: the record name handed out last; the next search starts after it (a hint:
  an allocation whose cursor could not be written is still complete);
- `.tmp-*`: files being written (temp + rename); leftovers of a crash are removed by GC;
- `blocks/<IPAMBlock name>` (`scope: cluster` only): a cluster block this node claimed, holding
  `{"name", "cidr", "uid", "state"}`; state `claiming` is written before the claim's create and
  becomes `held` after it, so a crash in between is settled by the next claim or GC
  (block_claims.py);
  state `borrowed`: one address of another node's block lent to this node for an IPAMClaim,
  named like its lend object (lending.py);
- `.formatVersion`: the format of the plain-text files (index entries, cursor), which carry
  none themselves: the previous release reads them as they are (SPEC §18). Records and block
  files carry their own `formatVersion`.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cni_plugin.core.locks import file_lock
from cni_plugin.core.records import mark_directory
from netconf.errors import IO_FAILURE, CniError
from netconf.formats import check_format, versioned

LOCK_FILE = "lock"
CURSOR_FILE = "last_reserved"
INDEX_DIR = "attachments"
BLOCKS_DIR = "blocks"
TMP_PREFIX = ".tmp-"
POOL_STATE = "vpc-attach-ipam's pool state"
_MAX_INDEX_NAME = 200  # longer keys are hashed to stay below NAME_MAX


@dataclass(frozen=True)
class Attachment:
    """What an allocation belongs to: the runtime's (container ID, interface name)."""

    container_id: str
    ifname: str

    @property
    def index_name(self) -> str:
        """File name of this attachment's index entry."""
        name = f"{self.container_id}@{self.ifname}"
        if len(name.encode()) <= _MAX_INDEX_NAME and "/" not in name and name[0] != ".":
            return name
        return "h-" + hashlib.sha256(name.encode()).hexdigest()


@dataclass(frozen=True)
class ClaimOwner:
    """The IPAMClaim (KubeVirt's persistent addresses) an allocation belongs to. Only vpc-attach
    gives it, in-process, from the claim it read: never a network config, which a tenant writes
    and could name someone else's claim in."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_wire(self) -> dict[str, str]:
        """The record's `claim` field."""
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class Record:
    """One allocation record: the attachment holding it and the claim owning it. Both None:
    the file is unreadable or corrupt; only a claim: a claim's record no container holds."""

    name: str
    attachment: Attachment | None
    claim: ClaimOwner | None = None

    @property
    def readable(self) -> bool:
        """Whether the file said whose it is."""
        return self.attachment is not None or self.claim is not None

    def to_json(self) -> bytes:
        """The body of the record file."""
        body: dict[str, object] = {}
        if self.attachment is not None:
            body = {"containerID": self.attachment.container_id,
                    "ifname": self.attachment.ifname}
        if self.claim is not None:
            body["claim"] = self.claim.to_wire()
        return json.dumps(versioned(body)).encode()


@dataclass(frozen=True)
class BlockRecord:
    """A cluster block this node claimed (`held`) or is claiming (`claiming`), or one address of
    another node's block lent to this node for an IPAMClaim (`borrowed`, lending.py)."""

    name: str
    cidr: str
    uid: str | None
    state: str  # "claiming" | "held" | "borrowed"

    def to_json(self) -> bytes:
        """The body of a block file."""
        return json.dumps(versioned({"name": self.name, "cidr": self.cidr, "uid": self.uid,
                                     "state": self.state})).encode()


class AddressTaken(CniError):
    """Code 102 for a requested address another attachment or claim holds (an exhausted pool
    is plain 102): an IPAMClaim's failed condition says IPAddressConflict for it."""


def io_error(action: str, path: str, exc: OSError) -> CniError:
    """Code 5 naming the path."""
    return CniError(IO_FAILURE, f"cannot {action} {path!r}: {exc.strerror or exc}")


class PoolState:
    """The state directory of one pool. Use `locked()`; other methods expect the lock held."""

    def __init__(self, directory: str, lock_timeout: float) -> None:
        self.directory = directory
        self.lock_timeout = lock_timeout

    def _path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    @contextlib.contextmanager
    def locked(self) -> Iterator[PoolState]:
        """Hold the pool's lock (code 11 on timeout, code 5 if the directory is unusable, 108
        when a newer release wrote it)."""
        with contextlib.ExitStack() as stack:
            try:
                os.makedirs(self._path(INDEX_DIR), mode=0o755, exist_ok=True)
                stack.enter_context(file_lock(self._path(LOCK_FILE), self.lock_timeout))
            except OSError as exc:
                raise io_error("lock pool state in", self.directory, exc) from None
            mark_directory(self.directory, POOL_STATE)
            yield self

    # Reading.

    def read_record(self, name: str) -> Record | None:
        """The record called `name`; None if there is none."""
        if not _is_record_name(name):
            return None
        try:
            with open(self._path(name), "rb") as handle:
                body = handle.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise io_error("read record", self._path(name), exc) from None
        return _parse_record(name, body, self._path(name))

    def lookup(self, attachment: Attachment) -> str | None:
        """Name of the record `attachment`'s index entry names, checked against the record."""
        name = self._read_text(self._path(INDEX_DIR, attachment.index_name))
        if name is None:
            return None
        record = self.read_record(name)
        return name if record is not None and record.attachment == attachment else None

    def find(self, attachment: Attachment) -> str | None:
        """Name of the record `attachment` holds: through its index entry, or by scanning the
        pool when the entry is missing or damaged (a crash between a reserve's writes)."""
        name = self.lookup(attachment)
        if name is None:
            name = next((r.name for r in self.records() if r.attachment == attachment), None)
        return name

    def records(self) -> list[Record]:
        """Every allocation record of the pool (O(n): for GC, and for ADD/DEL of an attachment
        without a usable index entry, as host-local's ADD reads every record)."""
        found: list[Record] = []
        for entry in self._scan(self.directory):
            if entry.is_file(follow_symlinks=False) and _is_record_name(entry.name):
                record = self.read_record(entry.name)
                if record is not None:
                    found.append(record)
        return found

    def blocks(self) -> list[BlockRecord]:
        """The cluster blocks this node holds or is claiming in this pool (unreadable block
        files count as `claiming`: the next claim or GC settles them against the API)."""
        found: list[BlockRecord] = []
        for entry in self._scan(self._path(BLOCKS_DIR)):
            if entry.name.startswith(TMP_PREFIX) or not entry.is_file(follow_symlinks=False):
                continue
            body = self._read_text(entry.path) or ""
            found.append(_parse_block(entry.name, body, entry.path))
        return sorted(found, key=lambda b: b.name)

    def write_block(self, block: BlockRecord) -> None:
        """Record (or update) a cluster block, atomically (code 5 on failure)."""
        try:
            os.makedirs(self._path(BLOCKS_DIR), mode=0o755, exist_ok=True)
        except OSError as exc:
            raise io_error("create", self._path(BLOCKS_DIR), exc) from None
        self._replace(self._path(BLOCKS_DIR, block.name), block.to_json())

    def remove_block(self, name: str) -> None:
        """Forget a cluster block (code 5 on failure)."""
        _unlink(self._path(BLOCKS_DIR, name))

    def holds(self, name: str) -> bool:
        """Whether the record `name` exists (lock-free: records change atomically)."""
        return _is_record_name(name) and os.path.isfile(self._path(name))

    def cursor(self) -> str | None:
        """The record name handed out last, if any."""
        return self._read_text(self._path(CURSOR_FILE))

    # Writing.

    def reserve(self, attachment: Attachment, names: Iterable[str],
                claim: ClaimOwner | None = None) -> str | None:
        """Take the first free name of `names` for `attachment` (owned by `claim`, if given);
        None if all are taken.

        All or nothing: a record whose index entry cannot be written is removed again."""
        body = self._write_temp(Record("", attachment, claim).to_json())
        try:
            for name in names:
                try:
                    os.link(body, self._path(name))
                except FileExistsError:
                    continue
                except OSError as exc:
                    raise io_error("create record", self._path(name), exc) from None
                try:
                    self._replace(self._path(INDEX_DIR, attachment.index_name), name.encode())
                except CniError:
                    _unlink(self._path(name))
                    raise
                with contextlib.suppress(CniError):  # only where the next search starts
                    self._replace(self._path(CURSOR_FILE), name.encode())
                return name
            return None
        finally:
            _unlink(body)

    def keep_for_claim(self, name: str, claim: ClaimOwner) -> bool:
        """Write a claim's record no container holds at `name` unless a record is there
        (link(2), as `reserve`); whether it was written."""
        body = self._write_temp(Record(name, None, claim).to_json())
        try:
            os.link(body, self._path(name))
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            raise io_error("create record", self._path(name), exc) from None
        finally:
            _unlink(body)

    def reindex(self, attachment: Attachment, name: str) -> None:
        """Point `attachment`'s index entry at `name` again; best effort, as `find` scans."""
        with contextlib.suppress(CniError):
            self._replace(self._path(INDEX_DIR, attachment.index_name), name.encode())

    def release(self, attachment: Attachment) -> str | None:
        """Remove the record `attachment` holds and its index entry; the released name. A
        claim's record is detached instead (kept, the claim's alone): None then.

        Without a usable index entry the pool is scanned, so no record outlives its DEL."""
        name = self.find(attachment)
        record = self.read_record(name) if name is not None else None
        if record is not None and record.claim is not None:
            detached = Record(record.name, None, record.claim)
            self._replace(self._path(record.name), detached.to_json())
            name = None
        elif name is not None:
            _unlink(self._path(name))
        _unlink(self._path(INDEX_DIR, attachment.index_name))
        return name

    def free(self, attachment: Attachment) -> str | None:
        """Remove the record `attachment` holds, a claim's too, and its index entry (the undo
        of a reserve); the freed name."""
        name = self.find(attachment)
        if name is not None:
            _unlink(self._path(name))
        _unlink(self._path(INDEX_DIR, attachment.index_name))
        return name

    def claimed(self, uid: str) -> list[Record]:
        """The records the claim with this uid owns (O(n): a scan)."""
        return [r for r in self.records() if r.claim is not None and r.claim.uid == uid]

    def adopt(self, record: Record, attachment: Attachment) -> None:
        """Hand a claim's record to `attachment` (a re-created Pod of the claim): the record
        names it, still the claim's, and its index entry points there; the previous holder's
        entry goes (atomic per file, record first: a crash between leaves an entry that names
        another attachment's record, which lookup ignores and GC removes)."""
        self._replace(self._path(record.name),
                      Record(record.name, attachment, record.claim).to_json())
        self._replace(self._path(INDEX_DIR, attachment.index_name), record.name.encode())
        self._drop_index_of(record.attachment, record.name)

    def restore(self, previous: Record, attachment: Attachment) -> None:
        """Undo `adopt`: the record as it was before, `attachment`'s index entry gone and the
        previous holder's back."""
        self._replace(self._path(previous.name), previous.to_json())
        _unlink(self._path(INDEX_DIR, attachment.index_name))
        if previous.attachment is not None:
            self.reindex(previous.attachment, previous.name)

    def free_claim(self, uid: str) -> list[Record]:
        """Remove every record the claim with this uid owns, and their index entries."""
        freed = self.claimed(uid)
        for record in freed:
            _unlink(self._path(record.name))
            self._drop_index_of(record.attachment, record.name)
        return freed

    def free_claim_record(self, name: str) -> None:
        """Remove the claim's record at name that no container holds (a lend moved on)."""
        _unlink(self._path(name))

    def _drop_index_of(self, attachment: Attachment | None, name: str) -> None:
        if attachment is None:
            return
        entry = self._path(INDEX_DIR, attachment.index_name)
        if self._read_text(entry) == name:
            _unlink(entry)

    def collect_garbage(self, valid: set[Attachment]) -> list[Record]:
        """Remove records of attachments not in `valid`, unreadable ones, a second record of an
        attachment whose index entry names another, and crash leftovers."""
        released: list[Record] = []
        for record in self.records():
            if self._stale(record, valid):
                _unlink(self._path(record.name))
                released.append(record)
        for entry in self._scan(self._path(INDEX_DIR)):
            name = self._read_text(entry.path)
            target = self.read_record(name) if name is not None else None
            if target is None or target.attachment is None or \
                    target.attachment.index_name != entry.name:
                _unlink(entry.path)
        for directory in (self.directory, self._path(INDEX_DIR), self._path(BLOCKS_DIR)):
            for entry in self._scan(directory):
                if entry.name.startswith(TMP_PREFIX):  # no writer is alive: we hold the lock
                    _unlink(entry.path)
        return released

    # Helpers.

    def _stale(self, record: Record, valid: set[Attachment]) -> bool:
        if record.claim is not None:  # the claim's while it exists, whatever its containers
            return False
        owner = record.attachment
        if owner is None or owner not in valid:
            return True
        # In use even without an index entry (ADD and DEL find it), unless the entry names
        # another record of the same attachment.
        indexed = self.lookup(owner)
        return indexed is not None and indexed != record.name

    def _scan(self, directory: str) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(directory) as entries:
                return list(entries)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise io_error("list", directory, exc) from None

    def _read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read().strip() or None
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise io_error("read", path, exc) from None

    def _write_temp(self, body: bytes, directory: str | None = None) -> str:
        where = directory or self.directory
        try:
            fd, path = tempfile.mkstemp(prefix=TMP_PREFIX, dir=where)
        except OSError as exc:
            raise io_error("write in", where, exc) from None
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, body)
        except OSError as exc:
            _unlink(path)
            raise io_error("write", path, exc) from None
        finally:
            os.close(fd)
        return path

    def _replace(self, path: str, body: bytes) -> None:
        temp = self._write_temp(body, os.path.dirname(path))
        try:
            os.replace(temp, path)
        except OSError as exc:
            _unlink(temp)
            raise io_error("write", path, exc) from None


def pool_directories(data_dir: str) -> Iterator[tuple[str, str, str]]:
    """(network, pool directory name, path) of every pool under a dataDir, sorted; nothing
    where it cannot be listed."""
    for network in _subdirectories(data_dir):
        for pool in _subdirectories(os.path.join(data_dir, network)):
            yield network, pool, os.path.join(data_dir, network, pool)


def _subdirectories(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _is_record_name(name: str) -> bool:
    """Records are named by addresses: a damaged index entry or cursor names no file."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return "/" not in name


def _parse_record(name: str, body: bytes, path: str) -> Record:
    try:
        data = json.loads(body)
    except ValueError:
        return Record(name, None)
    if not isinstance(data, dict):
        return Record(name, None)
    check_format(data, path, "vpc-attach-ipam's allocation record")
    container_id, ifname = data.get("containerID"), data.get("ifname")
    attachment = Attachment(container_id, ifname) if isinstance(container_id, str) \
        and isinstance(ifname, str) else None
    return Record(name, attachment, _parse_claim(data.get("claim")))


def _parse_claim(value: object) -> ClaimOwner | None:
    if not isinstance(value, dict):
        return None
    fields = [value.get(key) for key in ("namespace", "name", "uid")]
    if not all(isinstance(field, str) and field for field in fields):
        return None
    namespace, name, uid = (str(field) for field in fields)
    return ClaimOwner(namespace, name, uid)


def _parse_block(name: str, body: str, path: str) -> BlockRecord:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    check_format(data, path, "vpc-attach-ipam's block record")
    if not isinstance(data, dict) or not isinstance(data.get("cidr"), str):
        return BlockRecord(name, "", None, "claiming")
    uid = data.get("uid")
    state = data.get("state")
    if state == "borrowed":  # a lend this node made (lending.py): its uid may not be known yet
        return BlockRecord(name, data["cidr"], uid if isinstance(uid, str) else None, state)
    state = "held" if state == "held" and isinstance(uid, str) else "claiming"
    return BlockRecord(name, data["cidr"], uid if isinstance(uid, str) else None, state)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, IsADirectoryError):
        pass
    except OSError as exc:
        raise io_error("remove", path, exc) from None
