"""Build-once entries in the shared cache (`${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}`).

An entry is a directory built into a staging sibling and renamed into place under a host-wide
lock, so it appears complete or not at all and two processes never build it at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from cni_plugin.core.locks import acquire
from e2e.harness.tools.gotools import cache_root

LOCK_TIMEOUT = 600.0
COMPLETE_MARK = ".complete"


class BuildError(RuntimeError):
    """A set-up step failed; the message carries the command and its stderr."""


def run(argv: Sequence[str], *, timeout: float, cwd: Path | None = None,
        env: Mapping[str, str] | None = None) -> str:
    """Run a command; return stdout or raise BuildError naming it with its stderr."""
    try:
        proc = subprocess.run(list(argv), cwd=cwd, env=dict(env) if env is not None else None,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{' '.join(argv)}: timed out after {timeout:.0f}s") from None
    except OSError as exc:
        raise BuildError(f"{' '.join(argv)}: cannot run: {exc}") from None
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv)}: exit status {proc.returncode}\n"
                         f"{proc.stderr.rstrip()}")
    return proc.stdout


@contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if not acquire(fd, timeout):
            raise BuildError(f"timed out waiting for build lock {path}")
        yield
    finally:
        os.close(fd)


def cached_entry(name: str, build: Callable[[Path], None]) -> Path:
    """cache_root()/name, running build(staging_dir) first if the entry is missing."""
    root = cache_root()
    entry = root / name
    if (entry / COMPLETE_MARK).exists():
        return entry
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{name}.lock", LOCK_TIMEOUT):
        if (entry / COMPLETE_MARK).exists():
            return entry
        for stale in root.glob(f".{name}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=root))
        try:
            build(staging)
            (staging / COMPLETE_MARK).touch()
            staging.chmod(0o755)  # mkdtemp makes it private
            if entry.exists():  # incomplete leftover (no mark): replace it
                shutil.rmtree(entry)
            os.rename(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry
