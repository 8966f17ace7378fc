"""Which pool directories hold records of which IPAMClaim, node-wide:
`<ipamDataRoot>/.claims/<claim uid>/<hash of the pool directory>`, each file holding the pool
directory's path. Written when a reserve or adoption gives a claim a record, so that freeing a
deleted claim (the agent, GC) finds its pools under any dataDir without walking the data root,
and an agent that restarts finds every claim the node holds. A network name cannot start with
a dot, so `.claims` is no network's directory. A hint, never the truth: the records are; a
missing or stale entry costs at most a look at a pool without the claim's records. The notes
are plain text (the previous release reads them so): `.claims/.formatVersion` says their
format.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile

from cni_plugin.core.records import directory_format, mark_directory
from netconf.errors import CniError

CLAIMS_DIR = ".claims"
WHAT = "the notes of which pools hold IPAMClaims' records"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")  # Kubernetes uids are UUIDs


def note(root: str, uid: str, pool_dir: str) -> None:
    """Record that pool_dir holds a record of the claim uid (best effort: an I/O failure
    leaves the record protected, only found later, by the agent's restart or GC)."""
    if not _UID.match(uid):
        return
    entry = os.path.join(root, CLAIMS_DIR, uid, _entry_name(pool_dir))
    with contextlib.suppress(OSError):
        if _read(entry) == pool_dir:
            return
        os.makedirs(os.path.dirname(entry), mode=0o755, exist_ok=True)
        try:
            mark_directory(os.path.join(root, CLAIMS_DIR), WHAT)
        except CniError:  # unwritable, or a newer release's notes: none written into them
            return
        fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(entry))
        try:
            os.write(fd, pool_dir.encode())
        finally:
            os.close(fd)
        os.replace(temp, entry)


def pools_of(root: str, uid: str) -> list[str]:
    """The pool directories noted for the claim uid (code 108 when a newer release wrote the
    notes)."""
    if not _UID.match(uid):
        return []
    directory = os.path.join(root, CLAIMS_DIR, uid)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    directory_format(os.path.join(root, CLAIMS_DIR), WHAT)
    found = [_read(os.path.join(directory, name)) for name in names
             if not name.startswith(".tmp-")]
    return [path for path in found if path]


def uids(root: str) -> list[str]:
    """Every claim uid noted under root (code 108 when a newer release wrote the notes)."""
    try:
        names = os.listdir(os.path.join(root, CLAIMS_DIR))
    except OSError:
        return []
    directory_format(os.path.join(root, CLAIMS_DIR), WHAT)
    return sorted(name for name in names if _UID.match(name))


def forget(root: str, uid: str) -> None:
    """Drop the claim's notes (its records are freed)."""
    if not _UID.match(uid):
        return
    directory = os.path.join(root, CLAIMS_DIR, uid)
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def _entry_name(pool_dir: str) -> str:
    return hashlib.sha256(pool_dir.encode()).hexdigest()[:32]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None
