"""Which executables to stage, and how they land in the CNI bin dir.

A standalone build (packaging/standalone) is one executable plus its `vpc-attach.lib`
directory; it is staged whole as `<bin>/vpc-attach.bundle/<digest>/` and both `vpc-attach` and
`vpc-attach-ipam` become relative links into it (the executable dispatches on the name it runs
as) — except that `vpc-attach` is a launcher running the bundle's own interpreter when the build
carries one (`launcher.bundle_launcher`). Any other source must hold the two executables as
files, and they are copied. Without a source, an installer running from a Python environment
stages launchers for it (`launcher`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

from cni_plugin.install.errors import InstallError
from cni_plugin.install.launcher import BUNDLE_INTERPRETER, bundle_launcher, environment_launchers
from cni_plugin.install.targets import BundleTarget, FileTarget, LinkTarget, Target

EXECUTABLES = ("vpc-attach", "vpc-attach-ipam")
BUNDLE_CONTENTS = "vpc-attach.lib"  # the standalone build's contents directory
BUNDLES_DIR = "vpc-attach.bundle"  # in the CNI bin dir: one subdirectory per staged build
DIGEST_LENGTH = 16


def default_source() -> Path | None:
    """The running standalone build's own directory, if this is one."""
    if getattr(sys, "frozen", False):
        return Path(sys.executable).resolve().parent
    return None


def launcher_targets(bin_dir: str) -> list[Target]:
    """Targets staging launchers of this Python environment's executables into bin_dir."""
    return [FileTarget(f"{bin_dir}/{name}", content, 0o755)
            for name, content in environment_launchers().items()]


def binary_targets(source: Path, bin_dir: str) -> list[Target]:
    """Targets staging the executables found in source into bin_dir."""
    if not source.is_dir():
        raise InstallError(f"executables source {source} is not a directory")
    if (source / BUNDLE_CONTENTS).is_dir():
        return _bundle_targets(source, bin_dir)
    targets: list[Target] = []
    for name in EXECUTABLES:
        path = source / name
        if not path.is_file() or not os.access(path, os.X_OK):
            raise InstallError(f"no executable {name} in {source}",
                               "--source must name a standalone build (dist/standalone) or a "
                               "directory holding vpc-attach and vpc-attach-ipam")
        targets.append(FileTarget(f"{bin_dir}/{name}", path.resolve(), 0o755))
    return targets


def _bundle_targets(source: Path, bin_dir: str) -> list[Target]:
    if not (source / EXECUTABLES[0]).is_file():
        raise InstallError(f"standalone build {source} has no {EXECUTABLES[0]} executable")
    members = sorted(_bundle_members(source), key=lambda item: item[0])
    # Each file is hashed once: the targets' fingerprints make the bundle's digest too.
    staged = [(relative, mode, LinkTarget(relative, content) if isinstance(content, str)
               else FileTarget(relative, content, mode)) for relative, content, mode in members]
    digest = hashlib.sha256()
    for relative, mode, target in staged:
        digest.update(f"{relative}\0{mode:o}\0{target.fingerprint}\n".encode())
    bundle_path = f"{bin_dir}/{BUNDLES_DIR}/{digest.hexdigest()[:DIGEST_LENGTH]}"
    bundle = BundleTarget(bundle_path, tuple(
        replace(target, path=f"{bundle_path}/{relative}") for relative, _, target in staged))
    entry = f"{BUNDLES_DIR}/{Path(bundle_path).name}/{EXECUTABLES[0]}"
    links: list[Target] = [LinkTarget(f"{bin_dir}/{name}", entry) for name in EXECUTABLES]
    if (source / BUNDLE_CONTENTS / BUNDLE_INTERPRETER).is_file():
        # The bundle carries an interpreter: vpc-attach forwards without the bootloader.
        links[0] = FileTarget(f"{bin_dir}/{EXECUTABLES[0]}", bundle_launcher(
            bundle_path, BUNDLE_CONTENTS, EXECUTABLES[0]), 0o755)
    return [bundle, *links]


def _bundle_members(source: Path) -> list[tuple[str, Path | str, int]]:
    """(relative path, local file or link target, mode) of the executable and its contents."""
    members: list[tuple[str, Path | str, int]] = [
        (EXECUTABLES[0], source / EXECUTABLES[0], 0o755)]
    contents = source / BUNDLE_CONTENTS
    for dirpath, dirnames, filenames in os.walk(contents):
        for name in sorted(filenames + [d for d in dirnames if Path(dirpath, d).is_symlink()]):
            path = Path(dirpath, name)
            relative = path.relative_to(source).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(path)
                if os.path.isabs(target):
                    raise InstallError(f"standalone build {source}: {relative} is an absolute "
                                       f"link ({target}); it would not resolve on the host")
                members.append((relative, target, 0))
            elif stat.S_ISREG(info.st_mode):
                members.append((relative, path, 0o755 if info.st_mode & 0o111 else 0o644))
    return members
