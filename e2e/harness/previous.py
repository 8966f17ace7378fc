"""The previous release (SPEC §18): the commit `packaging/upgrade-from` names, its DaemonSet's
image built from the repository's own history, and its `packaging/` (CRDs, RBAC, DaemonSet).

The image is built by that commit's own tools: a `git worktree` of the commit in a temporary
directory runs its `packaging/standalone/build.sh` and its `packaging/image/assemble.py`. Only
the tag differs from what its `build.sh` would give (`vpc-attach:<version>-<commit 12>`
instead of `vpc-attach:<version>`): both releases carry the same version, and the node holds
both images at once. The archive and the commit's `packaging/` are cached by commit under
`${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}/upgrade-from/`, so a machine pays the build once.

A clone without that commit (a shallow one) cannot run the upgrade test: `PreviousRelease`
says so and how to fetch it; the test fails with that message, it never skips.

`python -m e2e.harness.previous` builds (or finds) it and prints one JSON line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

from e2e.harness.image import ProjectImage, Release
from e2e.harness.wait import wait_until

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
UPGRADE_FROM = REPO / "packaging" / "upgrade-from"
CACHE_DIR = "upgrade-from"
ARCHIVE = "vpc-attach.oci.tar"
DESCRIBED = "release.json"  # written last: an entry without it is incomplete
BUILD_TIMEOUT_S = 1800.0  # a cold standalone build (PyInstaller, its venv) included
GIT_TIMEOUT_S = 120.0
LOCK_TIMEOUT_S = BUILD_TIMEOUT_S + 60.0  # another process building the same commit
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class PreviousReleaseError(RuntimeError):
    """The previous release cannot be had: the message says why and what to do."""


def upgrade_from() -> str:
    """The commit `packaging/upgrade-from` names (one line, 40 hex digits)."""
    text = UPGRADE_FROM.read_text(encoding="utf-8").strip()
    if not _COMMIT.match(text):
        raise PreviousReleaseError(f"{UPGRADE_FROM.relative_to(REPO)} must hold one commit "
                                   f"(40 lowercase hex digits), not {text!r}")
    return text


def previous_release() -> Release:
    """The previous release, built from the repository's history and cached by commit."""
    commit = upgrade_from()
    _require_in_history(commit)
    entry = _cache_root() / commit
    with _locked(entry.with_name(f".{commit}.lock")):
        if not (entry / DESCRIBED).exists():
            _build(commit, entry)
        described = json.loads((entry / DESCRIBED).read_text())
    os.utime(entry)
    return Release(ProjectImage(entry / ARCHIVE, str(described["image"])), entry / "packaging",
                   commit)


def _require_in_history(commit: str) -> None:
    probe = _git(["cat-file", "-e", f"{commit}^{{commit}}"], check=False)
    if probe.returncode != 0:
        shallow = _git(["rev-parse", "--is-shallow-repository"], check=False).stdout.strip()
        hint = ("this clone is shallow: `git fetch --unshallow` (CI: clone with full history)"
                if shallow == "true" else "fetch the branch that holds it")
        raise PreviousReleaseError(
            f"the repository's history lacks commit {commit}, which "
            f"{UPGRADE_FROM.relative_to(REPO)} names as the previous release: the upgrade "
            f"test builds that release's image from it; {hint}")


def _build(commit: str, entry: Path) -> None:
    """Build the commit's image into entry (replaced whole: a half-built entry is removed)."""
    shutil.rmtree(entry, ignore_errors=True)
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=entry.parent))
    source = work / "src"
    try:
        _git(["worktree", "add", "--detach", str(source), commit])
        try:
            described = _build_image(source, commit, work)
            shutil.copytree(source / "packaging", work / "entry" / "packaging", symlinks=True)
        finally:
            _git(["worktree", "remove", "--force", str(source)], check=False)
        (work / "entry" / DESCRIBED).write_text(json.dumps(described, indent=2) + "\n")
        os.rename(work / "entry", entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _git(["worktree", "prune"], check=False)


def _build_image(source: Path, commit: str, work: Path) -> dict[str, object]:
    """The commit's standalone build, then its image assembler with a tag naming the commit;
    what assemble.py printed, plus the commit."""
    version = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    bundle = work / "standalone"
    log.info("building the previous release %s (its standalone build and image)", commit[:12])
    _run(["bash", str(source / "packaging/standalone/build.sh"), "--out", str(bundle)],
         cwd=source)
    (work / "entry").mkdir()
    out = _run([sys.executable, str(source / "packaging/image/assemble.py"),
                "--bundle", str(bundle), "--version", f"{version}-{commit[:12]}",
                "--revision", commit, "--epoch", "0", "--out", str(work / "entry" / ARCHIVE)],
               cwd=source)
    described: dict[str, object] = json.loads(out.splitlines()[-1])
    return {**described, "archive": ARCHIVE, "commit": commit}


def _run(argv: list[str], cwd: Path) -> str:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise PreviousReleaseError(f"{' '.join(argv)}: timed out after "
                                   f"{BUILD_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise PreviousReleaseError(f"{' '.join(argv)}: exit status {proc.returncode}\n"
                                   f"{proc.stderr[-4000:]}")
    return proc.stdout


def _git(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    if check and proc.returncode != 0:
        raise PreviousReleaseError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _cache_root() -> Path:
    base = os.environ.get("VPC_ATTACH_CACHE") or str(Path.home() / ".cache" / "vpc-attach")
    return Path(base) / CACHE_DIR


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """flock on path, waited for at most LOCK_TIMEOUT_S (another test run building it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        def taken() -> bool:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        wait_until(f"the build lock {path}", taken, LOCK_TIMEOUT_S, interval=1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    release = previous_release()
    print(json.dumps({"commit": release.commit, "archive": str(release.image.archive),
                      "image": release.image.ref, "packaging": str(release.packaging)}))
