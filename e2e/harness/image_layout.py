"""The project's image archive read from outside, as a registry or a runtime would: the OCI
layout unpacked by GNU tar, its documents read as plain JSON, its one layer unpacked and walked,
and what the layer holds run in a chroot of that layer alone (no host Python, no host library).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

RUN_TIMEOUT = 60


@dataclass(frozen=True)
class Layout:
    """The image archive unpacked: its documents and the blob files."""

    root: Path
    index: dict[str, Any]
    docker: list[dict[str, Any]]
    manifest: dict[str, Any]
    config: dict[str, Any]

    def blob(self, digest: str) -> Path:
        """The file of a blob."""
        algorithm, _, hexdigest = digest.partition(":")
        return self.root / "blobs" / algorithm / hexdigest

    def layer(self) -> Path:
        """The image's one layer."""
        (layer,) = self.manifest["layers"]
        return self.blob(layer["digest"])

    @property
    def path_env(self) -> str:
        """The PATH the runtime gives the container."""
        paths: list[str] = [e for e in self.config["config"]["Env"] if e.startswith("PATH=")]
        assert len(paths) == 1, paths
        return paths[0]


def tar(*args: str) -> None:
    """GNU tar, as a registry's tooling would read the archive."""
    subprocess.run(["tar", *args], check=True, capture_output=True, timeout=RUN_TIMEOUT)


def read_layout(archive: Path, root: Path) -> Layout:
    """The archive unpacked into root by GNU tar; index, manifests and config read as JSON."""
    tar("--extract", "--file", str(archive), "--directory", str(root))
    index = json.loads((root / "index.json").read_text())
    docker = json.loads((root / "manifest.json").read_text())
    (entry,) = index["manifests"]
    manifest = json.loads((root / "blobs/sha256" / entry["digest"][7:]).read_text())
    config = json.loads((root / "blobs/sha256" / manifest["config"]["digest"][7:]).read_text())
    return Layout(root, index, docker, manifest, config)


def unpack_layer(layout: Layout, dest: Path) -> Path:
    """The layer unpacked into dest (owners, modes and mtimes kept)."""
    dest.mkdir(parents=True, exist_ok=True)
    tar("--extract", "--gzip", "--same-permissions", "--numeric-owner",
        "--file", str(layout.layer()), "--directory", str(dest))
    return dest


def chroot(rootfs: Path, layout: Layout, argv: list[str], stdin: str = "",
           **env: str) -> subprocess.CompletedProcess[str]:
    """argv in a chroot of rootfs with only the image's PATH and env: nothing of the host."""
    chroot_bin = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert chroot_bin is not None
    return subprocess.run(
        ["env", "-i", layout.path_env, *(f"{k}={v}" for k, v in env.items()), chroot_bin,
         str(rootfs), *argv],
        input=stdin, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)


def elf_files(directory: Path) -> list[Path]:
    """The ELF files under directory (symlinks left out), in path order."""
    found = []
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def readelf(*args: str) -> str:
    """binutils' readelf output (skips where it is not installed: a failure under CI=true)."""
    readelf_bin = shutil.which("readelf")
    if readelf_bin is None:
        pytest.skip("readelf (binutils) is not installed")
    return subprocess.run([readelf_bin, *args], check=True, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT).stdout


def sha256(path: Path) -> str:
    """The blob digest of a file (`sha256:<hex>`)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def created_epoch(config: dict[str, Any]) -> int:
    """The image config's `created` as seconds since the epoch."""
    return int(datetime.fromisoformat(config["created"].replace("Z", "+00:00")).timestamp())
