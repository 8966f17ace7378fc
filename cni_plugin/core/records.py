"""Small on-node records (which attachment a Pod chose, what it registered, which table id a
VPC keeps): written whole or not at all, under the host's lockDir; and the marker that says
the format of a directory's files that cannot say it themselves (netconf/formats.py)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

from netconf.errors import IO_FAILURE, CniError
from netconf.formats import FORMAT_KEY, NewerFormat, check_format, versioned

# A directory's format marker: files the previous release reads exactly (plain text, a record
# its reader refuses any unknown key in) cannot carry formatVersion, so their directory does.
# A dot name: no reader of those directories, this release's or the previous', takes it for
# one of its files.
DIRECTORY_FORMAT = ".formatVersion"


def write_record(path: str, text: str, what: str) -> None:
    """Replace the file at path with text atomically (its directory made, private); code 5
    naming `what` and the path when it cannot be written."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot record {what} in {path!r}",
                       exc.strerror or str(exc)) from None


def directory_format(directory: str, what: str) -> int:
    """The format of the files in `directory` that carry no formatVersion themselves: its
    marker's (DIRECTORY_FORMAT), 1 without one (the previous release wrote none); code 108
    when it is newer than this release reads."""
    path = os.path.join(directory, DIRECTORY_FORMAT)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return 1
    except (OSError, ValueError) as exc:  # half-written: markers are written whole, so never
        raise NewerFormat(what, path, f"unreadable: {exc}") from None
    check_format(data, path, what)
    version: int = data.get(FORMAT_KEY, 1) if isinstance(data, dict) else 1
    return version


def _unmarked(directory: str, what: str, exc: OSError) -> CniError:
    """Code 5 naming the directory, then what it holds, with the system's reason (as the
    IPAM store words its write failures, so a full disk reads the same at every write)."""
    return CniError(IO_FAILURE, f"cannot mark the format of {directory!r} ({what}): "
                                f"{exc.strerror or exc}")


def mark_directory(directory: str, what: str) -> None:
    """Give `directory` this release's marker unless it has one (code 108 when its marker is
    newer); the directory exists. Written whole: a temporary file linked into place."""
    if directory_format(directory, what) and os.path.exists(
            os.path.join(directory, DIRECTORY_FORMAT)):
        return  # marked: by this release (a newer one's raised above)
    try:
        fd, temporary = tempfile.mkstemp(prefix=".tmp-format-", dir=directory)
    except OSError as exc:
        raise _unmarked(directory, what, exc) from None
    try:
        try:
            os.write(fd, (json.dumps(versioned({"covers": what})) + "\n").encode())
        finally:
            os.close(fd)
        os.chmod(temporary, 0o644)
        os.link(temporary, os.path.join(directory, DIRECTORY_FORMAT))
    except FileExistsError:
        pass  # another writer's, of this release or checked above
    except OSError as exc:
        raise _unmarked(directory, what, exc) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
