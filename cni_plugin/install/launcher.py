"""Launchers: executables that start an interpreter with `-I -S` and a baked-in import path.

Every CNI call then skips `site`; why, and re-running the installer after changing the
environment: docs/architecture.md ("Why launchers start Python with -I -S").
"""

from __future__ import annotations

import subprocess
import sys

from cni_plugin.install.errors import InstallError

# name -> module whose main() it runs; the same entry points as pyproject's console scripts
ENTRY_POINTS = {"vpc-attach": "cni_plugin.cli", "vpc-attach-ipam": "cni_plugin.ipam_cli"}
# In a standalone build's contents directory (build.sh): the interpreter, whose prefix is that
# directory, so its default import path is the bundle's.
BUNDLE_INTERPRETER = "bin/python3"
# Linux reads at most 255 bytes of a "#!" line (BINPRM_BUF_SIZE - 1) and splits no arguments.
SHEBANG_LIMIT = 255
PATH_QUERY_TIMEOUT = 30.0


def import_path(interpreter: str) -> list[str]:
    """sys.path of interpreter started cleanly (isolated, with site): what a launcher sets."""
    try:
        proc = subprocess.run([interpreter, "-I", "-c", "import sys; print(*sys.path, sep='\\0')"],
                              capture_output=True, timeout=PATH_QUERY_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"cannot ask {interpreter} for its import path: {exc}") from exc
    if proc.returncode != 0:
        raise InstallError(f"cannot ask {interpreter} for its import path: "
                           f"{proc.stderr.decode(errors='replace').strip()}")
    return [entry for entry in proc.stdout.decode().rstrip("\n").split("\0") if entry]


def launcher(name: str, interpreter: str, path: list[str] | None,
             full: str | None = None) -> bytes:
    """The launcher script for executable name, run by interpreter.

    path: the import path to set (None: the interpreter's own). full: an executable running the
    whole program, to hand all but VERSION and forwarded calls to (cni_plugin.cli.main).
    """
    shebang = f"#!{interpreter} -IS"
    if len(shebang.encode()) > SHEBANG_LIMIT or any(c.isspace() for c in interpreter):
        raise InstallError(f"interpreter path {interpreter!r} cannot be a #! line (at most "
                           f"{SHEBANG_LIMIT - 6} bytes, no white space)",
                           "stage it below a shorter path without white space")
    return (f"{shebang}\n"
            f"# {name}: written by `vpc-attach install` (cni_plugin/install/launcher.py).\n"
            + ("" if path is None else f"import sys\nsys.path[:] = {path!r}\n")
            + f"from {ENTRY_POINTS[name]} import main\n"
            + ("main()\n" if full is None else f"main(full={full!r})\n")).encode()


def environment_launchers(interpreter: str | None = None) -> dict[str, bytes]:
    """Both executables' launchers for interpreter's environment (default: this one)."""
    interpreter = interpreter or sys.executable
    path = import_path(interpreter)
    _check_importable(interpreter, path)
    return {name: launcher(name, interpreter, path) for name in ENTRY_POINTS}


def _check_importable(interpreter: str, path: list[str]) -> None:
    """The entry points import as a launcher will import them (-I -S, path as given)."""
    probe = f"import sys; sys.path[:] = {path!r}; " + \
        "; ".join(f"import {module}" for module in ENTRY_POINTS.values())
    try:
        proc = subprocess.run([interpreter, "-IS", "-c", probe], capture_output=True,
                              timeout=PATH_QUERY_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"cannot check the launchers with {interpreter}: {exc}") from exc
    if proc.returncode != 0:
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        raise InstallError(
            f"this Python environment does not import vpc-attach from a path ({last})",
            "an editable install whose .pth file holds an import hook; reinstall with "
            "`pip install .`, or `pip install -e . --config-settings editable_mode=compat`, "
            "or stage a standalone build (--source)")


def bundle_launcher(bundle: str, contents: str, executable: str) -> bytes:
    """`vpc-attach` for the standalone build staged at host path bundle: the bundled interpreter
    answers VERSION and forwards to the agent; everything else goes to the bundle's executable."""
    return launcher("vpc-attach", f"{bundle}/{contents}/{BUNDLE_INTERPRETER}", None,
                    full=f"{bundle}/{executable}")
