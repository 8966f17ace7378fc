"""Every on-node format read across releases (SPEC §18): what this release writes, the previous
release (`packaging/upgrade-from`, its `cni_plugin/` and `netconf/` from the repository's
history) reads as it reads its own, so a rollback works; and what the previous release wrote,
this one reads. Each direction runs the format's own writer in one tree and its own reader in
the other (tests/format_probe.py, a process per step with that tree first on sys.path). A
clone without the previous commit fails here, saying so; it never skips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).with_name("format_probe.py")
FORMATS = ("ipam", "choice", "tables", "claims", "blocks", "registration", "migration", "host",
           "manifest")
PROBE_S = 120.0


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The previous release's Python packages, from the repository's history."""
    commit = (REPO / "packaging" / "upgrade-from").read_text().strip()
    tree = tmp_path_factory.mktemp("previous")
    archive = tree / "tree.tar"
    with open(archive, "wb") as out:
        done = subprocess.run(["git", "-C", str(REPO), "archive", commit, "cni_plugin",
                               "netconf"], stdout=out, stderr=subprocess.PIPE, timeout=120,
                              check=False)
    if done.returncode != 0:
        pytest.fail(f"the repository's history lacks commit {commit}, the previous release "
                    f"packaging/upgrade-from names (`git fetch --unshallow` in a shallow "
                    f"clone): {done.stderr.decode().strip()}")
    with tarfile.open(archive) as members:
        members.extractall(tree, filter="data")
    archive.unlink()
    yield tree


def probe(tree: Path, action: str, kind: str, directory: Path) -> Any:
    """One step of the probe with `tree` first on sys.path; what it wrote or read."""
    environ = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, str(PROBE), action, kind, str(directory)],
                          cwd=tree, env=environ, capture_output=True, text=True,
                          timeout=PROBE_S, check=False)
    assert done.returncode == 0, f"{action} {kind} with {tree}: {done.stderr[-3000:]}"
    answer = json.loads(done.stdout.splitlines()[-1])
    assert Path(answer["tree"]) == tree, answer  # ran that release's code, not this one's
    return answer["result"]


@pytest.mark.parametrize("kind", FORMATS)
def test_the_previous_release_reads_what_this_one_writes(kind: str, previous_tree: Path,
                                                          tmp_path: Path) -> None:
    written = probe(REPO, "write", kind, tmp_path)
    assert probe(previous_tree, "read", kind, tmp_path) == expected(kind, written)


@pytest.mark.parametrize("kind", FORMATS)
def test_this_release_reads_what_the_previous_one_wrote(kind: str, previous_tree: Path,
                                                         tmp_path: Path) -> None:
    written = probe(previous_tree, "write", kind, tmp_path)
    assert probe(REPO, "read", kind, tmp_path) == expected(kind, written)


def test_what_this_release_writes_says_its_format(tmp_path: Path) -> None:
    """Positive control of the pair above: this tree's files do carry the version (in the
    file, or the directory's marker where the previous release reads files exactly)."""
    for kind in FORMATS:
        (tmp_path / kind).mkdir()
        probe(REPO, "write", kind, tmp_path / kind)
    versioned = [path for path in tmp_path.rglob("*") if path.is_file()
                 and '"formatVersion": 1' in path.read_text(errors="replace")]
    names = {str(path.relative_to(tmp_path)).split("/", 1)[0] + ":" + path.name
             for path in versioned}
    for kind in ("choice", "blocks", "registration", "host", "manifest"):
        assert any(name.startswith(f"{kind}:") and name != f"{kind}:.formatVersion"
                   for name in names), (kind, names)
    for kind in ("tables", "claims", "migration", "ipam"):  # marked directories
        assert f"{kind}:.formatVersion" in names, (kind, names)


def expected(kind: str, written: Any) -> Any:
    """What the reader gives back for what the writer wrote."""
    if kind == "ipam":  # the same addresses found again, then released to the last record
        return {**written, "del": 0, "records left": []}
    return written
