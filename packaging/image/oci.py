"""Writes OCI image archives with the standard library only: reproducible layer tars, the image
config, and one archive that is both an OCI image layout (index.json, blobs/sha256/...) and a
`docker save` tar (manifest.json), so `ctr images import`, `skopeo copy oci-archive:...` and
`docker load` all take it.

Shared by packaging/image/assemble.py (the DaemonSet's image) and e2e/harness/cri/pause.py
(the tests' pause image), which loads this file by path: `packaging/` is not a Python package.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import stat
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# Read by containerd's importer (the image's full name) and by skopeo's oci-archive: (the tag).
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Member:
    """One tar entry: a regular file (`data`, or the contents of `source`), a directory or a
    symbolic link (`target`). Owner, group and mtime are the tar writer's, never the disk's."""

    name: str
    mode: int
    kind: str = "file"  # "file" | "dir" | "symlink"
    data: bytes | None = None
    source: Path | None = None
    target: str = ""


@dataclass(frozen=True)
class Blob:
    """Content-addressed bytes, in memory (`data`) or in a file (`path`)."""

    digest: str
    size: int
    data: bytes | None = None
    path: Path | None = None

    def open(self) -> IO[bytes]:
        """A reader of the blob's bytes."""
        if self.data is not None:
            return io.BytesIO(self.data)
        if self.path is None:
            raise ValueError(f"blob {self.digest} has neither data nor path")
        return open(self.path, "rb")


@dataclass(frozen=True)
class Layer:
    """A layer as stored (`blob`, maybe compressed) and the digest of its plain tar."""

    blob: Blob
    diff_id: str
    media_type: str


def goarch(machine: str | None = None) -> str:
    """The OCI/Go architecture name of this machine (`x86_64` → `amd64`)."""
    machine = machine or platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
            "s390x": "s390x"}.get(machine, machine)


def canonical(document: dict[str, Any]) -> bytes:
    """JSON with sorted keys and no spaces: the same document always hashes the same."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def blob(data: bytes) -> Blob:
    """An in-memory blob."""
    return Blob("sha256:" + hashlib.sha256(data).hexdigest(), len(data), data=data)


def file_blob(path: Path) -> Blob:
    """A blob whose bytes are the file at path."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return Blob("sha256:" + digest.hexdigest(), path.stat().st_size, path=path)


def tree_members(root: Path, prefix: str) -> list[Member]:
    """The directory tree at root as members named prefix/...: directories 0755, files 0755 if
    executable else 0644, symbolic links as they are; anything else is refused."""
    members = []
    for path in sorted(root.rglob("*")):
        name = f"{prefix}/{path.relative_to(root).as_posix()}"
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            members.append(Member(name, 0o777, "symlink", target=os.readlink(path)))
        elif stat.S_ISDIR(info.st_mode):
            members.append(Member(name, 0o755, "dir"))
        elif stat.S_ISREG(info.st_mode):
            mode = 0o755 if info.st_mode & 0o111 else 0o644
            members.append(Member(name, mode, source=path))
        else:
            raise ValueError(f"{path}: neither a file, a directory nor a symbolic link")
    return members


def with_parents(members: Iterable[Member]) -> list[Member]:
    """members plus a 0755 directory for every parent not listed, in tree order (each
    directory followed by its contents, names compared per component: `a`, `a/b`, `a-b`);
    two members of one name are refused."""
    by_name: dict[str, Member] = {}
    for member in members:
        if member.name in by_name:
            raise ValueError(f"{member.name}: listed twice")
        by_name[member.name] = member
    for name in list(by_name):
        parent = os.path.dirname(name)
        while parent and parent not in by_name:
            by_name[parent] = Member(parent, 0o755, "dir")
            parent = os.path.dirname(parent)
    return [by_name[name] for name in sorted(by_name, key=lambda name: name.split("/"))]


def write_tar(members: Iterable[Member], out: IO[bytes], mtime: int = 0) -> None:
    """A reproducible tar of members, in their order: owner root (0/0), mtime fixed."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            entry = tarfile.TarInfo(member.name)
            entry.mode, entry.mtime = member.mode, mtime
            entry.uid = entry.gid = 0
            entry.uname = entry.gname = "root"
            if member.kind == "dir":
                entry.type = tarfile.DIRTYPE
                archive.addfile(entry)
            elif member.kind == "symlink":
                entry.type, entry.linkname = tarfile.SYMTYPE, member.target
                archive.addfile(entry)
            elif member.data is not None:
                entry.size = len(member.data)
                archive.addfile(entry, io.BytesIO(member.data))
            elif member.source is not None:
                with open(member.source, "rb") as handle:
                    entry.size = os.fstat(handle.fileno()).st_size
                    archive.addfile(entry, handle)
            else:
                raise ValueError(f"{member.name}: a file member needs data or a source")


def tar_bytes(members: Iterable[Member], mtime: int = 0) -> bytes:
    """write_tar into memory (small archives)."""
    buffer = io.BytesIO()
    write_tar(members, buffer, mtime)
    return buffer.getvalue()


def memory_layer(members: Iterable[Member], mtime: int = 0) -> Layer:
    """An uncompressed layer held in memory (small images)."""
    layer = blob(tar_bytes(members, mtime))
    return Layer(layer, layer.digest, OCI_LAYER)


def gzip_layer(plain: Path, packed: Path, level: int = 6) -> Layer:
    """The layer whose plain tar is at plain, gzip-compressed into packed. The gzip header
    carries no name and mtime 0, so the same tar gives the same bytes."""
    with open(plain, "rb") as source, open(packed, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level,
                          mtime=0) as compressed:
        shutil.copyfileobj(source, compressed, CHUNK)
    return Layer(file_blob(packed), file_blob(plain).digest, OCI_LAYER_GZIP)


def config_blob(*, architecture: str, config: dict[str, Any], layers: Sequence[Layer],
                history: list[dict[str, Any]], created: str | None = None) -> Blob:
    """The image configuration (runtime config, rootfs diff ids, history)."""
    document: dict[str, Any] = {
        "architecture": architecture, "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": history}
    if created is not None:
        document["created"] = created
    return blob(canonical(document))


@dataclass(frozen=True)
class Names:
    """What an importer calls the image: containerd's full name, the OCI ref name (tag) and
    docker's RepoTags."""

    image_name: str
    ref_name: str
    repo_tags: tuple[str, ...]


def manifest_blob(config: Blob, layers: Sequence[Layer],
                  annotations: dict[str, str] | None = None) -> Blob:
    """The OCI image manifest."""
    document: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": layer.media_type, "digest": layer.blob.digest,
                    "size": layer.blob.size} for layer in layers]}
    if annotations:
        document["annotations"] = annotations
    return blob(canonical(document))


def _path(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def write_archive(out: IO[bytes], *, architecture: str, config: Blob, layers: Sequence[Layer],
                  manifest: Blob, names: Names) -> None:
    """The image archive: oci-layout, index.json (one manifest, named), manifest.json
    (docker), then the blobs (layers, config, manifest)."""
    index = canonical({
        "schemaVersion": 2, "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": manifest.digest,
                       "size": manifest.size,
                       "platform": {"architecture": architecture, "os": "linux"},
                       "annotations": {CONTAINERD_NAME: names.image_name,
                                       OCI_REF_NAME: names.ref_name}}]})
    docker_manifest = json.dumps([{"Config": _path(config.digest),
                                   "RepoTags": list(names.repo_tags),
                                   "Layers": [_path(layer.blob.digest) for layer in layers]}])
    blobs = [*(layer.blob for layer in layers), config, manifest]
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in (("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
                           ("index.json", index), ("manifest.json", docker_manifest.encode())):
            _add(archive, name, len(data), io.BytesIO(data))
        for item in blobs:
            with item.open() as reader:
                _add(archive, _path(item.digest), item.size, reader)


def _add(archive: tarfile.TarFile, name: str, size: int, reader: IO[bytes]) -> None:
    entry = tarfile.TarInfo(name)
    entry.size, entry.mode, entry.mtime = size, 0o644, 0
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = "root"
    archive.addfile(entry, reader)
