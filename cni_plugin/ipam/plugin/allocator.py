"""Allocate, find and release blocks of a network's pools, one pool lock at a time.

Only one pool lock is ever held at once (pools are visited in a fixed order), so concurrent
invocations cannot deadlock. DEL and GC visit every pool directory of the network, not only the
configured pools, so records survive no config change unreleased.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from cni_plugin.ipam.plugin.config import IpamConfig
from cni_plugin.ipam.plugin.pool import Pool
from cni_plugin.ipam.plugin.store import Attachment, PoolState, Record, io_error
from netconf.errors import INTERNAL_ERROR, IPAM_EXHAUSTED, CniError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Allocation:
    """A block of a pool held by an attachment; `created` when this call reserved it."""

    pool: Pool
    index: int
    created: bool

    @property
    def address(self) -> str:
        """The address handed out, with prefix."""
        return self.pool.answer(self.index)


def pool_state(conf: IpamConfig, pool: Pool) -> PoolState:
    """The state directory of `pool` in `conf`'s network."""
    return PoolState(os.path.join(conf.network_dir, pool.pool_id), conf.lock_timeout)


def allocate(conf: IpamConfig, pool: Pool, attachment: Attachment) -> Allocation:
    """The block `attachment` holds in `pool`, reserving the next free one if none (code 102)."""
    with pool_state(conf, pool).locked() as state:
        held = state.lookup(attachment)
        if held is None and (held := state.find(attachment)) is not None:
            state.reindex(attachment, held)  # its entry was lost: a crash or damage
        index = pool.index_of_name(held) if held is not None else None
        if index is not None:
            return Allocation(pool, index, created=False)
        after = pool.index_of_name(state.cursor() or "")
        name = state.reserve(attachment, (pool.record_name(i) for i in pool.candidates(after)))
    if name is None:
        raise CniError(IPAM_EXHAUSTED,
                       f"pool {pool.subnet} of network {conf.network!r} is exhausted",
                       f"all {pool.capacity} allocatable /{pool.block_prefix} blocks are in use")
    index = pool.index_of_name(name)
    if index is None:
        raise CniError(INTERNAL_ERROR, f"reserved {name!r}, which is not a block of {pool.subnet}")
    return Allocation(pool, index, created=True)


def allocate_all(conf: IpamConfig, attachment: Attachment) -> list[Allocation]:
    """One block per active pool; what this call reserved is released if a later pool fails."""
    allocations: list[Allocation] = []
    try:
        for pool in conf.pools:
            allocations.append(allocate(conf, pool, attachment))
    except CniError:
        for done in reversed(allocations):
            if done.created:
                _release_quietly(pool_state(conf, done.pool), attachment)
        raise
    return allocations


def held(conf: IpamConfig, pool: Pool, attachment: Attachment) -> Allocation | None:
    """The block `attachment` holds in `pool`, if any (lock-free: records change atomically)."""
    name = pool_state(conf, pool).find(attachment)
    index = pool.index_of_name(name) if name is not None else None
    return Allocation(pool, index, created=False) if index is not None else None


def pool_states(conf: IpamConfig) -> list[PoolState]:
    """Every pool directory of the network, configured now or not."""
    try:
        with os.scandir(conf.network_dir) as entries:
            directories = sorted(e.path for e in entries if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise io_error("list", conf.network_dir, exc) from None
    return [PoolState(path, conf.lock_timeout) for path in directories]


def release(conf: IpamConfig, attachment: Attachment) -> list[str]:
    """Release `attachment`'s records in every pool of the network; the names released.

    Continues past a failing pool and raises its error after visiting the others.
    """
    released: list[str] = []
    failures: list[CniError] = []
    for state in pool_states(conf):
        try:
            with state.locked():
                name = state.release(attachment)
        except CniError as exc:
            failures.append(exc)
            continue
        if name is not None:
            released.append(name)
    if failures:
        raise failures[0]
    return released


def collect_garbage(conf: IpamConfig, valid: set[Attachment]) -> list[Record]:
    """Release records of attachments not in `valid` in every pool, continuing past errors."""
    released: list[Record] = []
    failures: list[CniError] = []
    for state in pool_states(conf):
        try:
            with state.locked():
                released.extend(state.collect_garbage(valid))
        except CniError as exc:
            log.warning("GC of %s: %s", state.directory, exc.msg)
            failures.append(exc)
    if failures:
        raise failures[0]
    return released


def _release_quietly(state: PoolState, attachment: Attachment) -> None:
    try:
        with state.locked():
            state.release(attachment)
    except CniError as exc:
        log.warning("cannot undo allocation in %s: %s", state.directory, exc.msg)
