"""galactic's datapath as pinned on this node: found, its layouts checked, opened.

galactic's node daemon (`galactic-cni run`) pins its maps and the `usid_egress` program in one
directory. Where that directory holds none of them the node has no galactic datapath, and
vpc-attach answers its SIDs in the kernel instead (`kernel.srv6`). Where it holds them, every
map vpc-attach touches must have exactly the layout vpc-attach writes, or nothing is written.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from cni_plugin.galactic.layout import MAPS, USID_EGRESS_PIN, USID_EGRESS_PROGRAM, MapLayout
from cni_plugin.galactic.layout import describe_layout as describe
from cni_plugin.kernel.bpf import (
    BPF_PROG_TYPE_SCHED_CLS,
    BpfError,
    PinnedMap,
    PinnedProg,
    open_map,
    open_prog,
)
from netconf.errors import DATAPATH_MISMATCH, KERNEL_FAILURE, CniError

log = logging.getLogger(__name__)
MISMATCH_HINT = ("galactic's datapath and vpc-attach are of different versions; nothing was "
                 "written (docs/operations.md#galactics-datapath)")


def present(pin_dir: str) -> bool:
    """Whether galactic's datapath is pinned in pin_dir (any of its maps or its program)."""
    names = (USID_EGRESS_PIN, *(layout.name for layout in MAPS))
    return any(os.path.exists(os.path.join(pin_dir, name)) for name in names)


def layout_mismatch(pinned: PinnedMap, layout: MapLayout) -> str | None:
    """What differs between a pinned map and the layout vpc-attach writes, None when nothing."""
    info = pinned.info
    if (info.map_type, info.key_size, info.value_size) == \
            (layout.map_type, layout.key_size, layout.value_size):
        return None
    return (f"galactic's pinned map {layout.name!r} is "
            f"{describe(info.map_type, info.key_size, info.value_size)}; vpc-attach writes "
            f"{layout.describe()}")


def _bpf_failure(doing: str, exc: BpfError) -> CniError:
    return CniError(KERNEL_FAILURE, f"cannot {doing}: {exc.strerror or exc}", str(exc))


@dataclass
class Datapath:
    """galactic's maps on this node, each checked against its layout, open until closed."""

    pin_dir: str
    maps: dict[str, PinnedMap]

    def __getitem__(self, layout: MapLayout) -> PinnedMap:
        return self.maps[layout.name]

    def program(self) -> PinnedProg:
        """galactic's pinned `usid_egress` (a TC classifier); the caller closes it."""
        path = os.path.join(self.pin_dir, USID_EGRESS_PIN)
        try:
            prog = open_prog(path)
        except BpfError as exc:
            raise _bpf_failure(f"open galactic's pinned program {path!r}", exc) from None
        if prog.info.prog_type != BPF_PROG_TYPE_SCHED_CLS or \
                not USID_EGRESS_PROGRAM.startswith(prog.info.name or "\0"):
            prog.close()
            raise CniError(DATAPATH_MISMATCH, f"galactic's pinned program {path!r} is "
                           f"{prog.info.name!r} (type {prog.info.prog_type}); vpc-attach "
                           f"attaches {USID_EGRESS_PROGRAM!r} (a TC classifier)", MISMATCH_HINT)
        return prog


@contextmanager
def opened(pin_dir: str) -> Iterator[Datapath | None]:
    """galactic's datapath in pin_dir, every map checked (code 107 naming the map and both
    layouts, 100 when a map cannot be opened); None when nothing of it is pinned there."""
    if not present(pin_dir):
        yield None
        return
    with ExitStack() as stack:
        maps: dict[str, PinnedMap] = {}
        for layout in MAPS:
            path = os.path.join(pin_dir, layout.name)
            try:
                pinned = stack.enter_context(open_map(path))
            except BpfError as exc:
                if exc.errno == errno.ENOENT:
                    raise CniError(DATAPATH_MISMATCH, f"galactic's datapath in {pin_dir!r} has "
                                   f"no map {layout.name!r}", MISMATCH_HINT) from None
                raise _bpf_failure(f"open galactic's pinned map {path!r}", exc) from None
            mismatch = layout_mismatch(pinned, layout)
            if mismatch is not None:
                raise CniError(DATAPATH_MISMATCH, mismatch, MISMATCH_HINT)
            maps[layout.name] = pinned
        yield Datapath(pin_dir, maps)


@contextmanager
def tolerating_mismatch() -> Iterator[None]:
    """A datapath whose layout differs holds nothing of ours: what reads or cleans our rows
    goes on without it (what would write them fails, code 107)."""
    try:
        yield
    except CniError as exc:
        if exc.code != DATAPATH_MISMATCH:
            raise
        log.warning("galactic's datapath: %s (%s)", exc.msg, exc.details)
