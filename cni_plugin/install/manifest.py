"""The installer's record of what it wrote: host path -> fingerprint, created dirs, bundles.

Only what is recorded here, and still has the recorded content, is the installer's to replace
or remove. Before writing, the installer records the new fingerprint and keeps the old one in
`accept`, so a run killed halfway leaves files that the next run still recognises as its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_plugin.install.errors import InstallError
from cni_plugin.install.files import write_atomic
from netconf.formats import FORMAT_KEY, FORMAT_VERSION

# `version` is what the previous release checks (exactly 1): kept, beside formatVersion.
LEGACY_VERSION = 1
WRITER = "vpc-attach install"


@dataclass
class Entry:
    """One path the installer wrote."""

    fingerprint: str
    # Fingerprints also taken as ours while a write is in flight (the content it replaces).
    accept: list[str] = field(default_factory=list)

    def matches(self, current: str) -> bool:
        """Whether what is on disk is still what the installer left there."""
        return current == self.fingerprint or current in self.accept


@dataclass
class Manifest:
    """Everything the installer owns on a host; keys are host paths (without --root)."""

    files: dict[str, Entry] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    # Staged bundle directories, oldest first; the last one is the one installed.
    bundles: list[str] = field(default_factory=list)

    def ownership_problem(self, host_path: str, current: str | None) -> str | None:
        """Why the installer must not replace what is at host_path (None when it may)."""
        if current is None:
            return None
        entry = self.files.get(host_path)
        if entry is None:
            return "exists and was not written by vpc-attach install"
        if not entry.matches(current):
            return "was modified after vpc-attach install wrote it"
        return None

    def record(self, host_path: str, new: str, old: str | None = None) -> None:
        """Record that host_path is about to hold `new` (and may still hold `old`)."""
        self.files[host_path] = Entry(new, [old] if old and old != new else [])

    def record_dirs(self, host_dirs: list[str]) -> None:
        """Record directories the installer created."""
        for directory in host_dirs:
            if directory not in self.dirs:
                self.dirs.append(directory)

    def settle(self) -> None:
        """All writes landed: only the new fingerprints are ours now."""
        for entry in self.files.values():
            entry.accept = []

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Read the manifest (missing is empty; unreadable is an error naming the file)."""
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise InstallError(f"cannot read install manifest {path}: {exc}",
                               "repair or remove it (files it listed are then treated as "
                               "not ours)") from None
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InstallError(f"install manifest {path} is malformed: {exc!r}",
                               "repair or remove it") from None

    @classmethod
    def _from_json(cls, data: Any) -> Manifest:
        version = data.get(FORMAT_KEY, data.get("version"))
        if isinstance(version, int) and not isinstance(version, bool) and \
                version > FORMAT_VERSION:
            raise InstallError(f"install manifest written by a newer vpc-attach install "
                               f"(formatVersion {version}; this one reads up to "
                               f"{FORMAT_VERSION})", "run that release's installer again "
                               "(roll the DaemonSet forward)")
        if version != FORMAT_VERSION or data.get("version") != LEGACY_VERSION:
            raise ValueError(f"unsupported version {data.get('version')!r}")
        files = {str(path): Entry(str(entry["fingerprint"]),
                                  [str(f) for f in entry.get("accept", [])])
                 for path, entry in data["files"].items()}
        return cls(files=files, dirs=[str(d) for d in data.get("dirs", [])],
                   bundles=[str(b) for b in data.get("bundles", [])])

    def serialized(self) -> bytes:
        """The manifest as written to disk (deterministic)."""
        data = {
            FORMAT_KEY: FORMAT_VERSION,
            "version": LEGACY_VERSION,
            "writer": WRITER,
            "files": {p: ({"fingerprint": e.fingerprint, "accept": e.accept} if e.accept
                          else {"fingerprint": e.fingerprint})
                      for p, e in sorted(self.files.items())},
            "dirs": self.dirs,
            "bundles": self.bundles,
        }
        return (json.dumps(data, indent=2) + "\n").encode()

    def save(self, path: Path) -> None:
        """Write the manifest atomically."""
        try:
            write_atomic(path, self.serialized(), 0o644)
        except OSError as exc:
            raise InstallError(f"cannot write install manifest {path}: {exc}") from None
