"""A CNI bin dir for the tests, the demo and the bench: the Go reference plugins plus our two
executables, by default staged the way `vpc-attach install` stages them from a Python
environment (launchers that start this interpreter with -I -S; cni_plugin/install/launcher.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from cni_plugin.install.launcher import environment_launchers

OURS = ("vpc-attach", "vpc-attach-ipam")


def console_script(executable: str) -> str | None:
    """pip's console script next to this interpreter (not a pyenv shim found on PATH)."""
    beside = Path(sys.executable).parent / executable
    return str(beside) if beside.exists() else shutil.which(executable)


def installed(executable: str) -> str:
    """Our console script next to this interpreter; FileNotFoundError when it is missing."""
    found = console_script(executable)
    if found is None:
        raise FileNotFoundError(f"{executable} is not installed next to {sys.executable} "
                                f"(run scripts/setup.sh)")
    return found


def populate(directory: Path, reference_plugins: Path | None, ours: Path | None = None) -> Path:
    """Fill directory (created if needed) with links to the reference plugins (none for None:
    a conflist of ours alone, as the demo's), and our two executables: launchers for this
    environment, or links to those in ours (a standalone build; nothing to add when ours is
    directory itself, where the installer staged them)."""
    directory.mkdir(parents=True, exist_ok=True)
    for plugin in reference_plugins.iterdir() if reference_plugins is not None else ():
        if not os.path.lexists(directory / plugin.name):
            (directory / plugin.name).symlink_to(plugin)
    if ours is None:
        for name, content in environment_launchers().items():
            (directory / name).write_bytes(content)
            (directory / name).chmod(0o755)
    elif ours != directory:
        for name in OURS:
            if not os.path.lexists(directory / name):
                (directory / name).symlink_to(ours / name)
    return directory
