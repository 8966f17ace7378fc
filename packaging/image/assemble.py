"""Assembles the DaemonSet's image from the standalone build: one layer holding the bundle, the
executables on PATH, the shared libraries the bundle's ELF files load from the system (as `ldd`
resolves them on this machine) with the dynamic loader, /tmp, and a minimal /etc. Standard
library only; build.sh runs it after packaging/standalone/build.sh. README.md says why.

  python3 assemble.py --bundle DIR --version V [--revision R] [--source-url URL] [--epoch N]
                      [--cache DIR] [--out FILE]

Prints one JSON line: archive path, image reference, manifest digest, sizes. The same inputs
give the same bytes (sorted entries, owner 0:0, every mtime = --epoch); with --cache the
archive is kept under DIR/<hash of its inputs>/ and an unchanged input is not written again.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oci  # packaging/image/oci.py: this script's directory is first on sys.path

BUNDLE_DIR = "opt/vpc-attach/standalone"  # the installer's --source in the DaemonSet
CONTENTS = "vpc-attach.lib"  # the bundle's contents dir: LD_LIBRARY_PATH of the bootloader
EXECUTABLES = ("vpc-attach", "vpc-attach-ipam")
# Host executables the agent runs, copied with the libraries they load: nft writes the host
# protection table (Debian's nftables).
SYSTEM_EXECUTABLES = {"usr/sbin/nft": ("/usr/sbin/nft", "/sbin/nft")}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REPOSITORY = "vpc-attach"
CACHE_KEEP = 5
GZIP_LEVEL = 6  # level 9: 5x the time for 0.7 % less
ETC = {
    "etc/passwd": "root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
    # Without this file glibc asks DNS before /etc/hosts (which the kubelet mounts).
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
ELF_MAGIC = b"\x7fELF"
PT_INTERP = 3


class AssembleError(RuntimeError):
    """The image cannot be assembled; the message names the file or command."""


@dataclass(frozen=True)
class Identity:
    """What the image says about itself."""

    version: str
    revision: str
    source_url: str
    epoch: int

    @property
    def tag(self) -> str:
        """`vpc-attach:<version>`: a Pod's `image:` and docker's RepoTags."""
        return f"{REPOSITORY}:{self.version}"

    @property
    def reference(self) -> str:
        """The normalised name containerd stores and kubelet resolves `tag` to."""
        return f"docker.io/library/{self.tag}"


# -- the bundle's ELF files and what they load from the system -------------------------------

def elf_files(bundle: Path) -> list[Path]:
    """Every regular ELF file of the bundle (executables, libraries, extension modules)."""
    found = []
    for path in sorted(bundle.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                if handle.read(4) == ELF_MAGIC:
                    found.append(path)
    return found


def elf_interpreter(path: Path) -> str | None:
    """The PT_INTERP path of an ELF file (its dynamic loader), None for libraries."""
    data = path.read_bytes()
    wide, little = data[4] == 2, data[5] == 1
    order = "<" if little else ">"
    if wide:
        phoff, = struct.unpack_from(order + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
    else:
        phoff, = struct.unpack_from(order + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", data, 0x2A)
    for index in range(phnum):
        header = phoff + index * phentsize
        kind, = struct.unpack_from(order + "I", data, header)
        if kind != PT_INTERP:
            continue
        if wide:
            offset, = struct.unpack_from(order + "Q", data, header + 8)
            size, = struct.unpack_from(order + "Q", data, header + 32)
        else:
            offset, = struct.unpack_from(order + "I", data, header + 4)
            size, = struct.unpack_from(order + "I", data, header + 16)
        return data[offset:offset + size].rstrip(b"\0").decode()
    return None


def ldd(path: Path, library_path: Path | None) -> list[str]:
    """The absolute paths `ldd` resolves path's libraries (and loader) to, as the image runs it:
    an empty environment, plus LD_LIBRARY_PATH when the bootloader has set it."""
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    if library_path is not None:
        env["LD_LIBRARY_PATH"] = str(library_path)
    proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    if "not a dynamic executable" in proc.stdout + proc.stderr:
        return []
    if proc.returncode != 0:
        raise AssembleError(f"ldd {path}: exit status {proc.returncode}: {proc.stderr.strip()}")
    paths = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if "=> not found" in line:
            raise AssembleError(f"{path} needs {line.split()[0]}, which ldd cannot find")
        resolved = line.split("=>")[-1].strip().split(" (")[0].strip()
        if resolved.startswith("/"):
            paths.append(resolved)
    return paths


def system_executables() -> dict[str, Path]:
    """Image path → host file of each SYSTEM_EXECUTABLES entry (the first that exists)."""
    found = {}
    for name, candidates in SYSTEM_EXECUTABLES.items():
        real = next((Path(os.path.realpath(c)) for c in candidates if Path(c).is_file()), None)
        if real is None:
            raise AssembleError(f"none of {', '.join(candidates)} exists: install Debian's "
                                "nftables package on the build machine")
        found[name] = real
    return found


def system_libraries(bundle: Path, executables: dict[str, Path] | None = None
                     ) -> dict[str, Path]:
    """Image path → host file of every library the bundle loads from outside itself: what the
    executables need when the runtime starts them (no LD_LIBRARY_PATH), and what every ELF file
    needs once PyInstaller's bootloader has pointed LD_LIBRARY_PATH at the bundle; and what
    the system executables load."""
    bundle = bundle.resolve()
    contents = bundle / CONTENTS
    needed: set[str] = set()
    for path in elf_files(bundle):
        interpreter = elf_interpreter(path)
        if interpreter is not None:
            needed.add(interpreter)
            needed.update(ldd(path, None))
        needed.update(ldd(path, contents))
    for path in (executables or {}).values():
        needed.update(ldd(path, None))
    found = {}
    for name in sorted(needed):
        real = Path(os.path.realpath(name))
        if real.is_relative_to(bundle):
            continue
        if not real.is_file():
            raise AssembleError(f"{name} resolves to {real}, which is not a file")
        found[name.lstrip("/")] = real
    return found


# -- the layer, the config, the archive -------------------------------------------------------

def members(bundle: Path, libraries: dict[str, Path],
            executables: dict[str, Path] | None = None) -> list[oci.Member]:
    """Every entry of the image's one layer, parents included, sorted."""
    entries = oci.tree_members(bundle, BUNDLE_DIR)
    for name, real in (executables or {}).items():
        entries.append(oci.Member(name, 0o755, source=real))
    for name in EXECUTABLES:
        if not (bundle / name).exists():
            raise AssembleError(f"{bundle} has no {name}: not a standalone build")
        entries.append(oci.Member(f"usr/local/bin/{name}", 0o777, "symlink",
                                  target=f"../../../{BUNDLE_DIR}/{name}"))
    for name, real in libraries.items():
        entries.append(oci.Member(name, 0o755, source=real))
    for name, text in ETC.items():
        entries.append(oci.Member(name, 0o644, data=text.encode()))
    entries.append(oci.Member("tmp", 0o1777, "dir"))
    return oci.with_parents(entries)


def image_config(identity: Identity, architecture: str, layers: list[oci.Layer]) -> oci.Blob:
    """The image configuration: PATH, `vpc-attach agent` by default, OCI labels."""
    labels = {"org.opencontainers.image.version": identity.version}
    if identity.revision:
        labels["org.opencontainers.image.revision"] = identity.revision
    if identity.source_url:
        labels["org.opencontainers.image.source"] = identity.source_url
    created = datetime.datetime.fromtimestamp(identity.epoch, datetime.UTC)
    stamp = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    return oci.config_blob(
        architecture=architecture,
        config={"Env": [f"PATH={PATH}"], "Cmd": ["vpc-attach", "agent"], "WorkingDir": "/",
                "Labels": labels},
        layers=layers, created=stamp,
        history=[{"created": stamp,
                  "created_by": "packaging/image/build.sh: the standalone build, the system "
                                "libraries it loads, /tmp and a minimal /etc"}])


def _sources_digest() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in (here / "oci.py", here / "assemble.py"):
        digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class PlainLayer:
    """The layer's uncompressed tar, written first: every output byte follows from it, the
    identity and this code, so its digest keys the cache."""

    path: Path
    diff_id: str
    libraries: tuple[str, ...]
    architecture: str

    def key(self, identity: Identity) -> str:
        """The cache key of the archive built from this layer."""
        config = image_config(identity, self.architecture, [
            oci.Layer(oci.blob(b""), self.diff_id, oci.OCI_LAYER_GZIP)])
        return hashlib.sha256(b"\0".join(part.encode() for part in (
            config.digest, identity.reference, str(GZIP_LEVEL), _sources_digest()))
        ).hexdigest()[:16]


def plain_layer(bundle: Path, identity: Identity, work: Path) -> PlainLayer:
    """Write the layer's plain tar into work."""
    executables = system_executables()
    libraries = system_libraries(bundle, executables)
    plain = work / "layer.tar"
    with open(plain, "wb") as out:
        oci.write_tar(members(bundle, libraries, executables), out, identity.epoch)
    return PlainLayer(plain, oci.file_blob(plain).digest,
                      tuple(sorted(f"/{name}" for name in libraries)), oci.goarch())


def archive_name(identity: Identity) -> str:
    """The archive's file name."""
    return f"{REPOSITORY}-{identity.version}.oci.tar"


def write_image(layer: PlainLayer, identity: Identity, work: Path, dest: Path) -> dict[str, Any]:
    """Compress the layer and write dest/vpc-attach-<version>.oci.tar and dest/image.json (what
    the archive holds); that description."""
    layers = [oci.gzip_layer(layer.path, work / "layer.tar.gz", GZIP_LEVEL)]
    config = image_config(identity, layer.architecture, layers)
    manifest = oci.manifest_blob(config, layers)
    names = oci.Names(image_name=identity.reference, ref_name=identity.version,
                      repo_tags=(identity.tag,))
    archive = dest / archive_name(identity)
    with open(archive, "wb") as out:
        oci.write_archive(out, architecture=layer.architecture, config=config, layers=layers,
                          manifest=manifest, names=names)
    description = {
        "image": identity.reference, "tag": identity.tag,
        "manifest_digest": manifest.digest, "architecture": layer.architecture,
        "layer_bytes": layers[0].blob.size, "layer_uncompressed_bytes": layer.path.stat().st_size,
        "archive_bytes": archive.stat().st_size, "system_libraries": list(layer.libraries)}
    (dest / "image.json").write_text(json.dumps(description, indent=2) + "\n")
    return {**description, "archive": str(archive)}


def cached_image(bundle: Path, identity: Identity, cache: Path) -> dict[str, Any]:
    """The archive in cache/<key>/, written if missing (the caller holds the cache's lock);
    keeps the newest CACHE_KEEP entries."""
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=cache))
    try:
        layer = plain_layer(bundle, identity, work)
        entry = cache / layer.key(identity)
        archive = str(entry / archive_name(identity))
        if (entry / "image.json").exists():
            os.utime(entry)  # recently used: kept by the pruning below
            described: dict[str, Any] = json.loads((entry / "image.json").read_text())
            return {**described, "archive": archive, "cached": True}
        staging = work / "image"
        staging.mkdir()
        write_image(layer, identity, work, staging)
        staging.chmod(0o755)
        os.rename(staging, entry)
        entries = [path for path in cache.iterdir()
                   if path.is_dir() and not path.name.startswith(".")]
        for stale in sorted(entries, key=lambda path: path.stat().st_mtime)[:-CACHE_KEEP]:
            shutil.rmtree(stale, ignore_errors=True)
        described = json.loads((entry / "image.json").read_text())
        return {**described, "archive": archive, "cached": False}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def uncached_image(bundle: Path, identity: Identity, out: Path) -> dict[str, Any]:
    """Write the archive to out, whatever any cache holds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        described = write_image(plain_layer(bundle, identity, work), identity, work, work)
        os.replace(described["archive"], out)
        return {**described, "archive": str(out.resolve()), "cached": False}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def copy_out(archive: Path, out: Path) -> None:
    """archive to out, replaced in one rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_name(f".{out.name}.tmp")
    shutil.copyfile(archive, staged)
    os.replace(staged, out)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="assemble.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="the standalone build")
    parser.add_argument("--version", required=True, help="the image tag")
    parser.add_argument("--revision", default="", help="source revision label (git commit)")
    parser.add_argument("--source-url", default="", help="source repository label")
    parser.add_argument("--epoch", type=int, default=0, help="every mtime (SOURCE_DATE_EPOCH)")
    parser.add_argument("--cache", type=Path, help="keep archives here, keyed by their inputs")
    parser.add_argument("--out", type=Path, help="copy the archive here")
    args = parser.parse_args(argv)
    identity = Identity(args.version, args.revision, args.source_url, args.epoch)
    try:
        if args.cache is None:
            if args.out is None:
                parser.error("give --out, --cache or both")
            result = uncached_image(args.bundle, identity, args.out)
        else:
            result = cached_image(args.bundle, identity, args.cache)
            if args.out is not None:
                copy_out(Path(result["archive"]), args.out)
                result = {**result, "archive": str(args.out.resolve()),
                          "cached_archive": result["archive"]}
    except (AssembleError, OSError, ValueError) as exc:
        print(f"assemble.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
