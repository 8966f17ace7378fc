"""What the full-kernel VM boots: Debian's kernel, unpacked, and a tiny initramfs.

Both are built from files Debian packages put on this machine (`linux-image-amd64`,
`busybox-static`; `scripts/setup.sh` installs them) and cached outside the repository under
``${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}/vm-<kernel release>-<key>/``, keyed by the kernel
release and a hash of what goes in, like the Go builds in `e2e.harness.cluster.build`.
"""

from __future__ import annotations

import fcntl
import hashlib
import lzma
import os
import re
import shutil
import stat
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BOOT_DIR = Path("/boot")
MODULES_DIR = Path("/lib/modules")
BUSYBOX = Path("/bin/busybox")
GUEST_INIT = Path(__file__).with_name("guest_init.sh")
# What the initramfs needs to mount the host's root over 9p and put an overlay on it; the
# rest (vrf, veth, tun, seg6 ...) is loaded from the host's /lib/modules once that is mounted.
EARLY_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")


class ImageError(RuntimeError):
    """The kernel or the initramfs cannot be prepared on this machine."""


@dataclass(frozen=True)
class BootImage:
    """A kernel to boot directly (uncompressed ELF, PVH entry) and its initramfs."""

    release: str
    kernel: Path
    initramfs: Path


def cache_root() -> Path:
    """``$VPC_ATTACH_CACHE`` or ``~/.cache/vpc-attach`` (as e2e.harness.cluster.build, whose
    package would import the Kubernetes client into every pytest start)."""
    configured = os.environ.get("VPC_ATTACH_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "vpc-attach"


def kernel_release() -> str:
    """The newest Debian kernel release whose image and modules are both installed."""
    releases = sorted(
        (p.name.removeprefix("vmlinuz-") for p in BOOT_DIR.glob("vmlinuz-*")
         if (MODULES_DIR / p.name.removeprefix("vmlinuz-") / "modules.dep").is_file()),
        key=_release_key)
    if not releases:
        raise ImageError(f"no kernel with its modules in {BOOT_DIR} and {MODULES_DIR} "
                         "(apt-get install linux-image-amd64; scripts/setup.sh does)")
    return releases[-1]


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release))


def missing_tools() -> str | None:
    """Why no VM can boot here, or None when everything it needs is installed."""
    if not Path("/usr/bin/qemu-system-x86_64").exists():
        return "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
    if not BUSYBOX.exists():
        return f"{BUSYBOX} is missing (apt-get install busybox-static)"
    try:
        kernel_release()
    except ImageError as exc:
        return str(exc)
    return None


def ensure_image() -> BootImage:
    """Return the cached kernel and initramfs, building them first when missing."""
    release = kernel_release()
    modules = early_module_files(MODULES_DIR / release)
    key = _input_key(release, modules)
    target = cache_root() / f"vm-{release}-{key}"
    image = BootImage(release, target / "vmlinux", target / "initramfs.cpio")
    if image.kernel.exists() and image.initramfs.exists():
        return image
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".vm-{release}.lock"):
        if not (image.kernel.exists() and image.initramfs.exists()):
            target.mkdir(exist_ok=True)
            _write_atomically(image.kernel, extract_vmlinux(BOOT_DIR / f"vmlinuz-{release}"))
            _write_atomically(image.initramfs, _initramfs(modules))
            _remove_stale_images(target)
    return image


def _remove_stale_images(current: Path) -> None:
    """Images of earlier kernels or recipes made over a day ago (a checkout of another version
    of this file may still be booting a recent one)."""
    for stale in current.parent.glob("vm-*"):
        if stale != current and stale.is_dir() and time.time() - stale.stat().st_mtime > 86400:
            shutil.rmtree(stale, ignore_errors=True)


def _input_key(release: str, modules: list[Path]) -> str:
    digest = hashlib.sha256(release.encode())
    # This file too: a change in how the image is made makes a new one.
    for path in [BOOT_DIR / f"vmlinuz-{release}", BUSYBOX, GUEST_INIT, Path(__file__), *modules]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def extract_vmlinux(vmlinuz: Path) -> bytes:
    """The ELF kernel inside a bzImage (the kernel's `scripts/extract-vmlinux`, in Python).

    Booting the ELF directly (PVH entry) skips the in-guest decompression, which costs
    seconds under emulation.
    """
    data = vmlinuz.read_bytes()
    for magic, unpack in ((b"\xfd7zXZ\x00", _unxz), (b"\x1f\x8b\x08", _gunzip)):
        start = data.find(magic)
        while start != -1:
            try:
                elf = unpack(data[start:])
            except (lzma.LZMAError, zlib.error, EOFError):
                elf = b""
            if elf.startswith(b"\x7fELF"):
                return elf
            start = data.find(magic, start + 1)
    raise ImageError(f"{vmlinuz}: no xz or gzip compressed ELF kernel inside")


def _unxz(blob: bytes) -> bytes:
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(blob)


def _gunzip(blob: bytes) -> bytes:
    return zlib.decompressobj(wbits=31).decompress(blob)


def early_module_files(base: Path, wanted: tuple[str, ...] = EARLY_MODULES) -> list[Path]:
    """``wanted`` modules of the tree ``base`` and what they depend on, dependencies first
    (the order insmod needs), from its modules.dep."""
    deps: dict[str, list[str]] = {}
    for line in (base / "modules.dep").read_text().splitlines():
        module, _, needs = line.partition(":")
        deps[_module_name(module)] = [module, *needs.split()]
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name not in deps:
            raise ImageError(f"module {name} is not in {base}/modules.dep")
        for needed in deps[name][1:]:
            visit(_module_name(needed))
        if deps[name][0] not in ordered:
            ordered.append(deps[name][0])

    for name in wanted:
        visit(name)
    return [base / path for path in ordered]


def _module_name(path: str) -> str:
    return Path(path).name.split(".ko")[0].replace("-", "_")


def _initramfs(modules: list[Path]) -> bytes:
    """A newc cpio: busybox, the early modules (with their load order) and /init."""
    archive = Cpio()
    for directory in ("bin", "dev", "proc", "sys", "newroot", "modules"):
        archive.add_dir(directory)
    archive.add_file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    archive.add_file("init", GUEST_INIT.read_bytes(), 0o755)
    for module in modules:
        if module.suffix != ".ko":
            raise ImageError(f"{module}: compressed modules are not supported by this initramfs")
        archive.add_file(f"modules/{module.name}", module.read_bytes(), 0o644)
    order = "".join(f"{module.name}\n" for module in modules)
    archive.add_file("modules/order", order.encode(), 0o644)
    return archive.finish()


class Cpio:
    """The kernel's initramfs format ("newc" cpio), uncompressed."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._ino = 1

    def add_dir(self, name: str) -> None:
        self._add(name, stat.S_IFDIR | 0o755, b"")

    def add_file(self, name: str, data: bytes, mode: int) -> None:
        self._add(name, stat.S_IFREG | mode, data)

    def finish(self) -> bytes:
        self._add("TRAILER!!!", 0, b"")
        return b"".join(self._parts)

    def _add(self, name: str, mode: int, data: bytes) -> None:
        encoded = name.encode() + b"\0"
        fields = (self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        header = b"070701" + b"".join(b"%08X" % field for field in fields)
        self._parts += [header, encoded, _pad(len(header) + len(encoded)), data, _pad(len(data))]
        self._ino += 1


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


def _write_atomically(path: Path, data: bytes) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_bytes(data)
    os.replace(staging, path)


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
