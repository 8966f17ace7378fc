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


def probe(tree: Path, action: str, directory: Path) -> dict[str, Any]:
    """One step of the probe for every format with `tree` first on sys.path (one process);
    what it wrote or read of each format, under `directory`/<format>."""
    environ = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, str(PROBE), action, str(directory), *FORMATS],
                          cwd=tree, env=environ, capture_output=True, text=True,
                          timeout=PROBE_S, check=False)
    assert done.returncode == 0, f"{action} with {tree}: {done.stderr[-3000:]}"
    answer = json.loads(done.stdout.splitlines()[-1])
    assert Path(answer["tree"]) == tree, answer  # ran that release's code, not this one's
    result: dict[str, Any] = answer["result"]
    return result


Crossing = dict[str, tuple[Any, Any]]  # format -> (what the writer wrote, what the reader read)


def crossing(writer: Path, reader: Path, directory: Path) -> Crossing:
    """Every format written by one tree, then read by the other."""
    written = probe(writer, "write", directory)
    read = probe(reader, "read", directory)
    return {kind: (written[kind], read[kind]) for kind in FORMATS}


@pytest.fixture(scope="module")
def forward(previous_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Crossing:
    return crossing(REPO, previous_tree, tmp_path_factory.mktemp("forward"))


@pytest.fixture(scope="module")
def backward(previous_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Crossing:
    return crossing(previous_tree, REPO, tmp_path_factory.mktemp("backward"))


@pytest.mark.parametrize("kind", FORMATS)
def test_the_previous_release_reads_what_this_one_writes(kind: str, forward: Crossing) -> None:
    written, read = forward[kind]
    assert read == expected(kind, written)


@pytest.mark.parametrize("kind", FORMATS)
def test_this_release_reads_what_the_previous_one_wrote(kind: str, backward: Crossing) -> None:
    written, read = backward[kind]
    assert read == expected(kind, written)


def test_what_this_release_writes_says_its_format(tmp_path: Path) -> None:
    """Positive control of the pair above: this tree's files do carry the version (in the
    file, or the directory's marker where the previous release reads files exactly)."""
    probe(REPO, "write", tmp_path)
    versioned = [path for path in tmp_path.rglob("*") if path.is_file()
                 and '"formatVersion": 1' in path.read_text(errors="replace")]
    names = {str(path.relative_to(tmp_path)).split("/", 1)[0] + ":" + path.name
             for path in versioned}
    for kind in ("choice", "blocks", "registration", "host", "manifest"):
        assert any(name.startswith(f"{kind}:") and name != f"{kind}:.formatVersion"
                   for name in names), (kind, names)
    for kind in ("tables", "claims", "migration", "ipam"):  # marked directories
        assert f"{kind}:.formatVersion" in names, (kind, names)


# Formats that came after the previous release, so with no reader there to cross to:
# docs/architecture.md's rows for them say so ("041aa67 predates policy").
SINCE_PREVIOUS = {"policy": "cni_plugin/policy/records.py"}


@pytest.mark.parametrize("kind", sorted(SINCE_PREVIOUS))
def test_formats_newer_than_the_previous_release_have_no_reader_there(
        kind: str, previous_tree: Path) -> None:
    """Once packaging/upgrade-from names a release that has them, they join FORMATS above."""
    module = SINCE_PREVIOUS[kind]
    assert (REPO / module).is_file()  # the positive control: this tree has the format
    assert not (previous_tree / module.rsplit("/", 1)[0]).exists()  # nor its package


def expected(kind: str, written: Any) -> Any:
    """What the reader gives back for what the writer wrote."""
    if kind == "ipam":  # the same addresses found again, then released to the last record
        return {**written, "del": 0, "records left": []}
    return written
