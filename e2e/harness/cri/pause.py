"""A pause image built locally: a static binary that waits for SIGTERM/SIGINT, packed as an
OCI image archive (tar of an OCI layout, plus docker's manifest.json) for `ctr images import`.

Nothing is pulled from a registry; the archive is cached by the hash of the source.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"


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


def _goarch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
            "s390x": "s390x"}.get(machine, machine)


def _compile(workdir: Path) -> bytes:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("no C compiler (gcc) to build the pause binary; apt-get install gcc")
    source = workdir / "pause.c"
    source.write_text(PAUSE_SOURCE)
    binary = workdir / "pause"
    run([cc, "-static", "-Os", "-s", "-o", str(binary), str(source)], cwd=workdir, timeout=120)
    return binary.read_bytes()


def _tar_bytes(members: list[tuple[str, bytes, int]]) -> bytes:
    """A reproducible tar (fixed owner and mtime) of (name, data, mode)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data, mode in members:
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode, entry.mtime = len(data), mode, 0
            entry.uid = entry.gid = 0
            entry.uname = entry.gname = "root"
            archive.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def image_archive(binary: bytes, ref: str) -> bytes:
    """The OCI image archive (OCI layout + docker manifest.json) of a one-file image."""
    layer_digest, layer = _blob(_tar_bytes([("pause", binary, 0o755)]))
    config_digest, config = _blob(_canonical({
        "architecture": _goarch(), "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "vpc-attach e2e: static pause binary"}]}))
    manifest_digest, manifest = _blob(_canonical({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": OCI_LAYER, "digest": layer_digest, "size": len(layer)}]}))
    index = _canonical({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": manifest_digest,
                       "size": len(manifest),
                       "platform": {"architecture": _goarch(), "os": "linux"},
                       "annotations": {"io.containerd.image.name": ref,
                                       "org.opencontainers.image.ref.name": ref.rsplit(":")[-1]}}]})
    docker_manifest = json.dumps([{"Config": f"blobs/sha256/{config_digest[7:]}",
                                   "RepoTags": [ref],
                                   "Layers": [f"blobs/sha256/{layer_digest[7:]}"]}]).encode()
    return _tar_bytes([
        ("oci-layout", _canonical({"imageLayoutVersion": "1.0.0"}), 0o644),
        ("index.json", index, 0o644),
        ("manifest.json", docker_manifest, 0o644),
        *[(f"blobs/sha256/{digest[7:]}", data, 0o644)
          for digest, data in ((layer_digest, layer), (config_digest, config),
                               (manifest_digest, manifest))],
    ])


def pause_image() -> PauseImage:
    """The cached pause image archive (built if missing)."""
    ref = image_ref()

    def build(staging: Path) -> None:
        (staging / ARCHIVE_NAME).write_bytes(image_archive(_compile(staging), ref))
        for scratch in ("pause.c", "pause"):
            (staging / scratch).unlink()

    entry = cached_entry(f"pause-image-{_source_key()}", build)
    return PauseImage(entry / ARCHIVE_NAME, ref)
