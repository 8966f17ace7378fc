"""A pause image built locally: a static binary that waits for SIGTERM/SIGINT, packed as an
OCI image archive (tar of an OCI layout, plus docker's manifest.json) for `ctr images import`,
written by packaging/image/oci.py (the writer of the project's own image).

Nothing is pulled from a registry; the archive is cached by the hash of the source.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from e2e.harness.cri.cache import BuildError, cached_entry, run

PAUSE_SOURCE = r"""
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }
static void on_child(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    /* As PID 1 of the sandbox, signals without a handler are ignored: install them. */
    struct sigaction stop, child;
    memset(&stop, 0, sizeof stop);
    memset(&child, 0, sizeof child);
    stop.sa_handler = on_stop;
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGTERM, &stop, 0) || sigaction(SIGINT, &stop, 0) ||
        sigaction(SIGCHLD, &child, 0))
        return 1;
    for (;;)
        pause();
}
"""

IMAGE_REPOSITORY = "localhost/vpc-attach-e2e/pause"
ARCHIVE_NAME = "pause-image.tar"
# The OCI archive writer shared with the project's image (packaging/ is not a Python package).
OCI_WRITER = Path(__file__).resolve().parents[3] / "packaging/image/oci.py"


def _load_oci() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vpc_attach_image_oci", OCI_WRITER)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load the OCI writer {OCI_WRITER}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


oci = _load_oci()


@dataclass(frozen=True)
class PauseImage:
    """The archive to import and the reference it is imported as."""

    archive: Path
    ref: str


def _source_key() -> str:
    return hashlib.sha256(PAUSE_SOURCE.encode()).hexdigest()[:12]


def image_ref() -> str:
    """The image reference (tag = hash of the source, so a changed pause is a new image)."""
    return f"{IMAGE_REPOSITORY}:{_source_key()}"


def _compile(workdir: Path) -> bytes:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("no C compiler (gcc) to build the pause binary; apt-get install gcc")
    source = workdir / "pause.c"
    source.write_text(PAUSE_SOURCE)
    binary = workdir / "pause"
    run([cc, "-static", "-Os", "-s", "-o", str(binary), str(source)], cwd=workdir, timeout=120)
    return binary.read_bytes()


def image_archive(binary: bytes, ref: str) -> bytes:
    """The OCI image archive (OCI layout + docker manifest.json) of a one-file image."""
    architecture = oci.goarch()
    layers = [oci.memory_layer([oci.Member("pause", 0o755, data=binary)])]
    config = oci.config_blob(
        architecture=architecture,
        config={"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"},
        layers=layers, history=[{"created_by": "vpc-attach e2e: static pause binary"}])
    names = oci.Names(image_name=ref, ref_name=ref.rsplit(":")[-1], repo_tags=(ref,))
    archive = io.BytesIO()
    oci.write_archive(archive, architecture=architecture, config=config, layers=layers,
                      manifest=oci.manifest_blob(config, layers), names=names)
    return archive.getvalue()


def pause_image() -> PauseImage:
    """The cached pause image archive (built if missing)."""
    ref = image_ref()

    def build(staging: Path) -> None:
        (staging / ARCHIVE_NAME).write_bytes(image_archive(_compile(staging), ref))
        for scratch in ("pause.c", "pause"):
            (staging / scratch).unlink()

    entry = cached_entry(f"pause-image-{_source_key()}", build)
    return PauseImage(entry / ARCHIVE_NAME, ref)
