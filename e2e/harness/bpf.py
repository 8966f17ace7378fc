"""bpffs and bpftool for tests: a private bpffs instance, maps made and pinned in it, and what
`bpftool` (the independent reader) says a pinned map holds."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cni_plugin.kernel import bpf
from cni_plugin.kernel.bpf import PinnedMap

BPFTOOL = shutil.which("bpftool") or "/usr/sbin/bpftool"
TOOL_TIMEOUT = 20.0


@contextlib.contextmanager
def mounted_bpffs(mount: Path) -> Iterator[Path]:
    """A bpffs instance of its own on the directory `mount` (made if missing), in this
    process's mount namespace; afterwards whatever is pinned in it is removed, it is unmounted
    and the directory removed."""
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "vpa-bpffs", str(mount)], check=True,
                   timeout=TOOL_TIMEOUT)
    try:
        yield mount
    finally:
        # Pins go with the last mount of the instance; a process of a node may still hold one
        # in its mount namespace, so they are removed here. (The kernel's own preloaded
        # entries, e.g. progs.debug, cannot be and need not be.)
        for entry in mount.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                with contextlib.suppress(PermissionError):
                    entry.unlink()
        subprocess.run(["umount", str(mount)], check=True, timeout=TOOL_TIMEOUT)
        mount.rmdir()


def bpftool(*args: str) -> Any:
    """`bpftool -j ARGS`, parsed (None when it printed nothing)."""
    out = subprocess.run([BPFTOOL, "-j", *args], check=True, capture_output=True, text=True,
                         timeout=TOOL_TIMEOUT).stdout
    return json.loads(out) if out.strip() else None


def bpftool_rows(path: Path) -> dict[bytes, bytes]:
    """The rows `bpftool map dump` reads from the map pinned at path."""
    return {bytes(int(b, 16) for b in row["key"]): bytes(int(b, 16) for b in row["value"])
            for row in bpftool("map", "dump", "pinned", str(path)) or []}


def hex_words(data: bytes) -> list[str]:
    """bytes as bpftool's `hex` arguments take them."""
    return ["hex", *(f"{b:02x}" for b in data)]


def pinned_map(mount: Path, name: str, map_type: int, key_size: int, value_size: int,
               max_entries: int) -> PinnedMap:
    """A new map pinned at mount/name, opened again by its path."""
    fd = bpf.create_map(map_type, key_size, value_size, max_entries, name=name[:15])
    try:
        bpf.pin(fd, str(mount / name))
    finally:
        os.close(fd)
    return bpf.open_map(str(mount / name))


def pin_program(path: Path, name: str, verdict: int = bpf.TC_ACT_UNSPEC) -> None:
    """A TC classifier returning `verdict`, named `name`, pinned at path."""
    fd = bpf.load_sched_cls(name, bpf.constant_program(verdict))
    try:
        bpf.pin(fd, str(path))
    finally:
        os.close(fd)


def tc_json(netns: str, *args: str) -> Any:
    """`tc -n NETNS -j ARGS` (NETNS a name under /var/run/netns), parsed."""
    out = subprocess.run(["tc", "-n", netns, "-j", *args], check=True, capture_output=True,
                         text=True, timeout=TOOL_TIMEOUT).stdout
    return json.loads(out) if out.strip() else []


def tc_bpf_filters(netns: str, dev: str, hook: str = "ingress") -> list[dict[str, Any]]:
    """The filters (entries with options) `tc filter show dev DEV HOOK` lists."""
    return [entry for entry in tc_json(netns, "filter", "show", "dev", dev, hook)
            if "options" in entry]
