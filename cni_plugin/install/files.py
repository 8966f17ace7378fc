"""Filesystem primitives of the installer: content fingerprints and atomic writes.

A fingerprint names what is at a path: `sha256:<hex>` for a regular file, `symlink:<target>`
for a symbolic link. Every write lands through a temp file in the destination's directory,
fsync and rename, so a reader (the container runtime) sees the old file or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

FILE_PREFIX = "sha256:"
LINK_PREFIX = "symlink:"
DIRECTORY = "directory"
SPECIAL = "special file"
# Temp files end in .tmp: runtimes load only *.conf, *.conflist and *.json from the conf dir.
TEMP_SUFFIX = ".tmp"


def content_fingerprint(data: bytes) -> str:
    """The fingerprint a file with these bytes has."""
    return FILE_PREFIX + hashlib.sha256(data).hexdigest()


def file_fingerprint(path: Path) -> str:
    """The fingerprint of a regular file's content (read in chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return FILE_PREFIX + digest.hexdigest()


def link_fingerprint(target: str) -> str:
    """The fingerprint of a symbolic link to target."""
    return LINK_PREFIX + target


def fingerprint(path: Path) -> str | None:
    """What is at path now (None when nothing is); links are not followed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return link_fingerprint(os.readlink(path))
    if stat.S_ISREG(info.st_mode):
        return file_fingerprint(path)
    return DIRECTORY if stat.S_ISDIR(info.st_mode) else SPECIAL


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in directory path durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path, created: list[Path]) -> None:
    """mkdir -p path, appending each directory it had to create (outermost first)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o755)
        except FileExistsError:
            continue  # someone else made it meanwhile: not ours to remove later
        fsync_dir(directory.parent)
        created.append(directory)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")


def write_atomic(path: Path, content: bytes | Path, mode: int) -> None:
    """Replace path with content (bytes, or a local file to copy): temp file, fsync, rename."""
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                     suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as out:
            copy_into(out.fileno(), content)
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    fsync_dir(path.parent)


def copy_into(fd: int, content: bytes | Path) -> None:
    """Write content (bytes, or a local file's bytes) to an open file descriptor."""
    if isinstance(content, bytes):
        _write_all(fd, content)
        return
    with open(content, "rb") as source:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            _write_all(fd, chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def symlink_atomic(path: Path, target: str) -> None:
    """Point the symbolic link path at target, replacing whatever link or file was there."""
    temp = path.parent / f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    os.symlink(target, temp)
    try:
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    fsync_dir(path.parent)


def remove(path: Path) -> None:
    """Unlink a file or link and make that durable (missing is fine)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        fsync_dir(path.parent)
