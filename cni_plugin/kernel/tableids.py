"""The Linux table id each VPC keeps on this node while its BGPVRFInstance exists (SPEC §15).

galactic-router resolves a VPC's table through its VRF once, when it first applies the VPC's
BGPVRFInstance, and keys every route it learns for the VPC by that id until the instance goes
(it never reads the VRF again). So a VRF that DEL removed and a later ADD recreates must get
the same id back, and no other VPC may get that id meanwhile. ADD keeps the id of a VPC that
publishes an instance on this node; GC forgets it once the instance is gone and the VPC has
no VRF. One small file per VPC under the host's lockDir, holding the id alone (the previous
release reads it with int()): the directory's marker says their format; callers hold the host
lock.
"""

from __future__ import annotations

import os

from cni_plugin.core.records import directory_format, mark_directory, write_record
from netconf.errors import IO_FAILURE, CniError

DIRECTORY = "tables"
WHAT = "the table ids VPCs keep"


def _path(lock_dir: str, vrf: str) -> str:
    return os.path.join(lock_dir, DIRECTORY, vrf)


def kept(lock_dir: str) -> dict[str, int]:
    """{VRF name: table id} of every VPC keeping a table id on this node (code 108 when a
    newer release wrote them)."""
    directory = os.path.join(lock_dir, DIRECTORY)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    directory_format(directory, WHAT)
    found: dict[str, int] = {}
    for name in names:
        if "." in name:  # a write under way
            continue
        try:
            with open(os.path.join(directory, name), encoding="ascii") as handle:
                found[name] = int(handle.read().strip())
        except (OSError, ValueError):
            continue  # a half-written file of a killed ADD: rewritten by the next
    return found


def keep(lock_dir: str, vrf: str, table: int) -> None:
    """Record that the VPC of VRF `vrf` keeps `table` (atomically; code 5 when it cannot, 108
    when a newer release wrote the others)."""
    directory = os.path.join(lock_dir, DIRECTORY)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot record {WHAT} in {directory!r}",
                       exc.strerror or str(exc)) from None
    mark_directory(directory, WHAT)
    write_record(_path(lock_dir, vrf), f"{table}\n", f"the table id of {vrf}")


def forget(lock_dir: str, vrf: str) -> bool:
    """The VPC of VRF `vrf` keeps no table id any more; whether it kept one."""
    try:
        os.unlink(_path(lock_dir, vrf))
    except FileNotFoundError:
        return False
    return True
