"""The operator log file: appended to by the agent and by in-process invocations at once, and
rotated by size (`logMaxBytes`, `logBackups`) without losing, splitting or mixing a line.

Every line is one write(2) on a descriptor opened with O_APPEND, so writers never overwrite or
split each other's lines. A flock on `<file>.lock` (not the log itself: it is renamed) is held
around the size check, the rotation and the write, and a writer reopens the file when the name
no longer points at its descriptor, so no line goes to a file another process rotated away.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading

from cni_plugin.core.locks import acquire

# A writer waits this long for the lock, then appends without rotating (the line still lands
# whole: O_APPEND): logging never holds up a verb.
LOCK_SECONDS = 1.0
_MODE = 0o640


class LogFile:
    """One log path, shared by every thread of this process that writes to it."""

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes  # 0: never rotated
        self.backups = backups  # rotated files kept: path.1 (newest) ... path.N
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._lock_fd: int | None = None

    def write(self, line: bytes) -> None:
        """Append one line (a newline is added if missing); never raises."""
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._lock:
            try:
                self._write_locked(line)
            except OSError:
                self._close()  # logging must never change an answer; retry fresh next time

    def _write_locked(self, line: bytes) -> None:
        if self._lock_fd is None:
            self._lock_fd = os.open(self.path + ".lock",
                                    os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _MODE)
        locked = acquire(self._lock_fd, LOCK_SECONDS)
        try:
            fd = self._current()
            if locked and self.max_bytes and self._needs_rotation(fd, len(line)):
                self._rotate()
                fd = self._current()
            view = memoryview(line)
            while view:  # one write for a regular file; a short one only when the disk is full
                view = view[os.write(fd, view):]
        finally:
            if locked:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _current(self) -> int:
        """The descriptor of the file the path names now (reopened after a rotation)."""
        if self._fd is not None:
            try:
                named = os.stat(self.path)
                mine = os.fstat(self._fd)
                if (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino):
                    return self._fd
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           _MODE)
        return self._fd

    def _needs_rotation(self, fd: int, adding: int) -> bool:
        size = os.fstat(fd).st_size
        return size > 0 and size + adding > self.max_bytes

    def _rotate(self) -> None:
        """path.N-1 -> path.N ... path -> path.1 (the oldest dropped); with no backups the
        file is just started over."""
        if self.backups == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return
        for number in range(self.backups - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}.{number}", f"{self.path}.{number + 1}")
        os.replace(self.path, f"{self.path}.1")

    def _close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._lock_fd = None


_open_files: dict[str, LogFile] = {}
_open_files_lock = threading.Lock()


def log_file(path: str, max_bytes: int, backups: int) -> LogFile:
    """The writer of path shared by this process (its limits updated to the latest given)."""
    with _open_files_lock:
        found = _open_files.get(path)
        if found is None:
            found = _open_files[path] = LogFile(path, max_bytes, backups)
        found.max_bytes, found.backups = max_bytes, backups
        return found
