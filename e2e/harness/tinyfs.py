"""A tiny tmpfs for state that must meet a full disk: mounted on a temp dir, filled exactly (every
inode, or every page), then given back a chosen number of inodes or pages, so that each write of
the code under test runs out of space in turn. Unmounted on exit, whatever happened."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Resource = Literal["inodes", "pages"]
PAGE = os.sysconf("SC_PAGE_SIZE")
SOURCE = "vpa-tinyfs"  # the mount's source name, so a leftover is recognisable in /proc/mounts


@dataclass
class TinyFs:
    """A mounted tmpfs at `root`; `data` is the directory handed to the code under test."""

    root: Path

    @property
    def data(self) -> Path:
        """Where the code under test writes (created on mount)."""
        return self.root / "data"

    @property
    def _inode_filler(self) -> Path:
        return self.root / "filler-inodes"

    @property
    def _page_filler(self) -> Path:
        return self.root / "filler-pages"

    def prepare(self) -> None:
        """Create the data dir and the fillers (before any filling)."""
        self.data.mkdir()
        self._inode_filler.mkdir()
        self._page_filler.touch()

    def free(self, resource: Resource) -> int:
        """How many inodes or pages are free now."""
        stat = os.statvfs(self.root)
        return stat.f_ffree if resource == "inodes" else stat.f_bavail * stat.f_frsize // PAGE

    def fill(self, resource: Resource) -> None:
        """Use up every free inode (empty files) or every free page (one growing file)."""
        if resource == "inodes":
            count = len(os.listdir(self._inode_filler))
            with contextlib.suppress(OSError):  # ENOSPC ends the loop
                while True:
                    (self._inode_filler / str(count)).touch()
                    count += 1
        else:
            fd = os.open(self._page_filler, os.O_WRONLY | os.O_APPEND)
            try:
                while True:
                    os.write(fd, b"\0" * PAGE)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            finally:
                os.close(fd)
        assert self.free(resource) == 0, f"{resource} left after filling: {self.free(resource)}"

    def give_back(self, resource: Resource, count: int) -> None:
        """Free exactly `count` inodes or pages of the filler."""
        if resource == "inodes":
            for name in sorted(os.listdir(self._inode_filler))[:count]:
                (self._inode_filler / name).unlink()
        else:
            size = self._page_filler.stat().st_size
            os.truncate(self._page_filler, max(0, size - count * PAGE))

    def empty(self) -> None:
        """Remove the whole filler: plenty of room again."""
        for name in os.listdir(self._inode_filler):
            (self._inode_filler / name).unlink()
        os.truncate(self._page_filler, 0)


@contextlib.contextmanager
def tiny_tmpfs(mount_point: Path, size_kib: int = 256, inodes: int = 96) -> Iterator[TinyFs]:
    """A tmpfs of size_kib and `inodes` inodes on mount_point (created), unmounted on exit."""
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,nr_inodes={inodes}",
                    SOURCE, str(mount_point)], check=True, capture_output=True, timeout=30)
    try:
        fs = TinyFs(mount_point)
        fs.prepare()
        yield fs
    finally:
        done = subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30,
                              check=False)
        if done.returncode != 0:  # still busy: detach it, never leave it mounted
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30,
                           check=False)
