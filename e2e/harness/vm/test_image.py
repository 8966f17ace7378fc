"""The VM image's pure parts: the initramfs archive, the kernel unpacking, module load order."""

from __future__ import annotations

import gzip
import lzma
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.harness.vm.image import Cpio, ImageError, early_module_files, extract_vmlinux

NAMES = st.text(st.sampled_from("abcxyz019_-."), min_size=1, max_size=20).map(
    lambda name: f"d/{name}")


def _read_newc(archive: bytes) -> dict[str, tuple[int, bytes]]:
    """An independent reader of the kernel's "newc" cpio: {name: (mode, data)}."""
    entries: dict[str, tuple[int, bytes]] = {}
    offset = 0
    while True:
        assert archive[offset:offset + 6] == b"070701"
        fields = [int(archive[offset + 6 + 8 * i:offset + 14 + 8 * i], 16) for i in range(13)]
        mode, size, name_size = fields[1], fields[6], fields[11]
        name_at = offset + 110
        name = archive[name_at:name_at + name_size - 1].decode()
        data_at = name_at + name_size + (-(110 + name_size) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = (mode, archive[data_at:data_at + size])
        offset = data_at + size + (-size % 4)


@given(st.dictionaries(NAMES, st.binary(max_size=64), max_size=8))
def test_initramfs_archive_reads_back_file_by_file(files: dict[str, bytes]) -> None:
    archive = Cpio()
    archive.add_dir("d")
    for name, data in files.items():
        archive.add_file(name, data, 0o644)
    entries = _read_newc(archive.finish())
    assert entries.pop("d") == (0o040755, b"")
    assert entries == {name: (0o100644, data) for name, data in files.items()}


@pytest.mark.parametrize("compress", [lzma.compress, gzip.compress], ids=["xz", "gzip"])
def test_the_elf_kernel_is_found_behind_false_magic(
        compress: Callable[[bytes], bytes], tmp_path: Path) -> None:
    elf = b"\x7fELF" + bytes(range(256)) * 4
    # A setup stub, a stray xz/gzip magic that is no stream, then the payload.
    image = tmp_path / "vmlinuz"
    image.write_bytes(b"MZ" + b"\0" * 100 + b"\xfd7zXZ\x00\x1f\x8b\x08junk" + compress(elf)
                      + b"\0" * 9)
    assert extract_vmlinux(image) == elf


def test_a_kernel_without_a_compressed_elf_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "vmlinuz"
    image.write_bytes(b"MZ" + lzma.compress(b"not an ELF"))
    with pytest.raises(ImageError, match="no xz or gzip compressed ELF"):
        extract_vmlinux(image)


def test_modules_load_dependencies_first_and_once(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko\n"
        "kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/virtio/virtio.ko\n"
        "kernel/net/9p/9pnet.ko:\n"
        "kernel/fs/netfs/netfs.ko:\n"
        "kernel/virtio/virtio.ko:\n")
    ordered = [p.relative_to(tmp_path).as_posix()
               for p in early_module_files(tmp_path, ("9pnet_virtio", "9p"))]
    assert ordered == ["kernel/net/9p/9pnet.ko", "kernel/virtio/virtio.ko",
                       "kernel/net/9p/9pnet_virtio.ko", "kernel/fs/netfs/netfs.ko",
                       "kernel/fs/9p/9p.ko"]
    with pytest.raises(ImageError, match="overlay"):
        early_module_files(tmp_path, ("overlay",))
