"""What the installer wants on the host: files, symbolic links and content-addressed bundles.

Paths are host paths (as the runtime on the host sees them); `Root` maps them to where the
host's filesystem is mounted for the installer (`--root`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cni_plugin.install.files import content_fingerprint, file_fingerprint, link_fingerprint


@dataclass(frozen=True)
class Root:
    """The host's / as the installer sees it (`--root`)."""

    path: Path

    def local(self, host_path: str) -> Path:
        """Where host_path is for the installer."""
        return self.path / host_path.lstrip("/")

    def host(self, local_path: Path) -> str:
        """The host path of a local path below the root."""
        relative = local_path.relative_to(self.path)
        return "/" + relative.as_posix() if relative.parts else "/"


@dataclass(frozen=True)
class FileTarget:
    """A regular file with given content (bytes, or a local file to copy) and mode."""

    path: str
    content: bytes | Path
    mode: int
    fingerprint: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.fingerprint:
            value = content_fingerprint(self.content) if isinstance(self.content, bytes) \
                else file_fingerprint(self.content)
            object.__setattr__(self, "fingerprint", value)


@dataclass(frozen=True)
class LinkTarget:
    """A symbolic link (targets are relative so they resolve the same under any --root)."""

    path: str
    target: str

    @property
    def fingerprint(self) -> str:
        """The link's fingerprint."""
        return link_fingerprint(self.target)


@dataclass(frozen=True)
class BundleTarget:
    """A directory staged whole and renamed into place; its name is a digest of its content.

    Members carry host paths below `path`. A bundle that exists and matches is left alone;
    a new one appears in one rename, so a running plugin never sees half of one.
    """

    path: str
    members: tuple[FileTarget | LinkTarget, ...]


Target = FileTarget | LinkTarget | BundleTarget
