"""The project's OCI image (packaging/image) for tests: built by its own build.sh, or found in
its cache (keyed by a hash of the inputs), and re-assembled from a given bundle to compare; a
`Release` is that image with the `packaging/` it is deployed by (the previous release's:
`e2e.harness.previous`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
BUILD_SCRIPT = REPO / "packaging/image/build.sh"
ASSEMBLE_SCRIPT = REPO / "packaging/image/assemble.py"
BUILD_TIMEOUT_SECONDS = 1800  # a cold standalone build included
ASSEMBLE_TIMEOUT_SECONDS = 300


class ImageError(RuntimeError):
    """The image could not be built; the message carries the build's output."""


class ProjectImage(NamedTuple):
    """The archive to import (`ctr -n k8s.io images import`) and the name it is imported as."""

    archive: Path
    ref: str  # docker.io/library/vpc-attach:<version>: a Pod's `image: vpc-attach:<version>`


class Release(NamedTuple):
    """A release as a node runs it: its image and its kustomize base (CRDs, RBAC, DaemonSet)."""

    image: ProjectImage
    packaging: Path
    commit: str  # what it was built from ("" when unknown)


def current_release() -> Release:
    """This tree: its image (built first if needed) and its packaging/."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    return Release(build_image(), PACKAGING, head.stdout.strip() if head.returncode == 0 else "")


def build_image() -> ProjectImage:
    """The project's image archive and reference, built first if its inputs changed
    (`bash packaging/image/build.sh --cache-only`; the archive stays in the cache)."""
    described = _run(["bash", str(BUILD_SCRIPT), "--cache-only"], BUILD_TIMEOUT_SECONDS)
    return ProjectImage(Path(described["archive"]), str(described["image"]))


def assemble(bundle: Path, out: Path, *, version: str, revision: str = "",
             source_url: str = "", epoch: int = 0) -> dict[str, Any]:
    """Assemble an image archive from a standalone bundle into out, bypassing the cache (to
    compare two builds); what assemble.py printed (manifest_digest, sizes, ...)."""
    return _run([sys.executable, str(ASSEMBLE_SCRIPT), "--bundle", str(bundle),
                 "--version", version, "--revision", revision, "--source-url", source_url,
                 "--epoch", str(epoch), "--out", str(out)], ASSEMBLE_TIMEOUT_SECONDS)


def _run(argv: list[str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{' '.join(argv)}: timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(argv)}: exit status {proc.returncode}\n{proc.stderr}")
    described: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return described
