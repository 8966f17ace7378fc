"""Allocate, find and release blocks of a network's pools, one pool lock at a time.

Only one pool lock is ever held at once (pools are visited in a fixed order), so concurrent
invocations cannot deadlock. DEL and GC visit every pool directory of the network, not only the
configured pools, so records survive no config change unreleased.

A pool of `scope: cluster` allocates only inside the cluster blocks this node holds and claims
another block through the API (`block_claims.py`, under the same lock) only when they are full.

A requested address (`requests.py`) is reserved under the same lock, so two containers asking
for it at once cannot both get it; in a cluster pool only inside a block this node holds or
claims for it, never in another node's.

An allocation may be owned by an IPAMClaim (a `ClaimOwner`, given by vpc-attach in-process):
another container of the same claim adopts its record instead of getting a new one, anyone
else is refused it (code 102 naming the claim), DEL detaches it and only `free_claim` frees it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from cni_plugin.ipam.plugin import block_claims, claimed, lending
from cni_plugin.ipam.plugin.block_claims import BlockApi
from cni_plugin.ipam.plugin.blocks import block_of_index, pool_hash
from cni_plugin.ipam.plugin.config import IpamConfig
from cni_plugin.ipam.plugin.pool import Pool
from cni_plugin.ipam.plugin.requests import PoolRequest
from cni_plugin.ipam.plugin.store import (
    AddressTaken,
    Attachment,
    ClaimOwner,
    PoolState,
    Record,
    io_error,
)
from netconf.capabilities import invalid_request
from netconf.errors import INTERNAL_ERROR, IPAM_EXHAUSTED, CniError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Allocation:
    """A block of a pool held by an attachment; `created` when this call reserved it,
    `adopted` the claim's record as it was when this call took it over, `lend` the lend of
    another node's address this call created for the claim (lending.py)."""

    pool: Pool
    index: int
    created: bool
    adopted: Record | None = None
    lend: lending.Lend | None = None

    @property
    def address(self) -> str:
        """The address handed out, with prefix."""
        return self.pool.answer(self.index)


def pool_state(conf: IpamConfig, pool: Pool) -> PoolState:
    """The state directory of `pool` in `conf`'s network."""
    return PoolState(os.path.join(conf.network_dir, pool.pool_id), conf.lock_timeout)


def allocate(conf: IpamConfig, pool: Pool, attachment: Attachment,
             blocks: BlockApi | None = None, requested: PoolRequest | None = None,
             claim: ClaimOwner | None = None) -> Allocation:
    """The block `attachment` holds in `pool`, reserving the requested one, else the next
    free one, if none (code 102). blocks: the cluster's IPAMBlocks, for a pool of `scope:
    cluster`. claim: the IPAMClaim owning the allocation; its record, if it has one here, is
    adopted."""
    with pool_state(conf, pool).locked() as state:
        held = state.lookup(attachment)
        if held is None and (held := state.find(attachment)) is not None:
            state.reindex(attachment, held)  # its entry was lost: a crash or damage
        index = pool.index_of_name(held) if held is not None else None
        if index is not None:
            if requested is not None and requested.index != index:
                raise invalid_request(requested.source, f"{requested.requested.text} was "
                                      f"requested, but container {attachment.container_id!r} "
                                      f"interface {attachment.ifname!r} holds "
                                      f"{pool.answer(index)} in pool {pool.subnet}",
                                      "a repeated ADD keeps the address it has; DEL first")
            return Allocation(pool, index, created=False)
        if claim is not None and (own := _claims_record(state, claim, requested)) is not None:
            index = pool.index_of_name(own.name)
            lend = _place(conf, pool, state, index, blocks, claim) if index is not None \
                and conf.scope == "cluster" else None
            state.adopt(own, attachment)
            _note(conf, claim, state)
            return _allocation(pool, own.name, created=False, adopted=own, lend=lend)
        name: str | None
        lend = None
        if requested is not None:
            name, lend = _reserve_requested(conf, state, attachment, blocks, requested, claim)
        elif conf.scope == "cluster":
            name = _reserve_in_cluster(conf, pool, state, attachment, blocks, claim)
        else:
            after = pool.index_of_name(state.cursor() or "")
            name = state.reserve(attachment,
                                 (pool.record_name(i) for i in pool.candidates(after)), claim)
        if name is not None and claim is not None:
            _note(conf, claim, state)
    if name is None:
        raise CniError(IPAM_EXHAUSTED,
                       f"pool {pool.subnet} of network {conf.network!r} is exhausted",
                       f"all {pool.capacity} allocatable /{pool.block_prefix} blocks are in use")
    return _allocation(pool, name, created=True, lend=lend)


def _note(conf: IpamConfig, claim: ClaimOwner, state: PoolState) -> None:
    if conf.data_root:  # so that the claim's deletion finds this pool (claimed.py)
        claimed.note(conf.data_root, claim.uid, state.directory)


def _allocation(pool: Pool, name: str, *, created: bool, adopted: Record | None = None,
                lend: lending.Lend | None = None) -> Allocation:
    index = pool.index_of_name(name)
    if index is None:
        raise CniError(INTERNAL_ERROR, f"reserved {name!r}, which is not a block of {pool.subnet}")
    return Allocation(pool, index, created=created, adopted=adopted, lend=lend)


def _place(conf: IpamConfig, pool: Pool, state: PoolState, index: int,
           blocks: BlockApi | None, claim: ClaimOwner | None) -> lending.Lend | None:
    """Where allocation index of a cluster pool is used: in a block this node holds (or claims
    now), whose lend to another node for the claim, if any, is recalled; in another node's
    block, borrowed for the claim (code 102 without a claim: only claims' addresses are
    lent). The lend this call created, if any."""
    if blocks is None:
        raise CniError(INTERNAL_ERROR, f"pool {pool.subnet} has scope 'cluster' but no "
                       "API was given to claim a block")
    holder = block_claims.hold_block_of(state, conf.network, pool, index, blocks, conf.data_root,
                                  conf.persistent_ips)
    if holder is None:
        if claim is not None:
            lending.recall(state, conf.network, pool, index, blocks, claim)
        return None
    if claim is None:
        raise block_claims.held_elsewhere(conf.network, pool, index, holder, blocks.node)
    return lending.borrow(state, conf.network, pool, index,
                          block_of_index(conf.network, pool, index),
                          block_claims.node_of(holder) or "", blocks, claim)


def _claims_record(state: PoolState, claim: ClaimOwner,
                   requested: PoolRequest | None) -> Record | None:
    """The claim's record in this pool (the requested one, when the claim's addresses are
    requested), if it has one."""
    owned = state.claimed(claim.uid)
    if requested is not None:
        owned = [r for r in owned if r.name == requested.pool.record_name(requested.index)]
    return owned[0] if owned else None


def _reserve_in_cluster(conf: IpamConfig, pool: Pool, state: PoolState, attachment: Attachment,
                        blocks: BlockApi | None, claim: ClaimOwner | None) -> str:
    """An allocation in this node's cluster blocks, claiming blocks until one has room (code
    102 when the cluster has none left)."""
    while (name := block_claims.reserve_in_held(state, conf.network, pool, attachment,
                                          claim)) is None:
        if blocks is None:
            raise CniError(INTERNAL_ERROR, f"pool {pool.subnet} has scope 'cluster' but no "
                           "API was given to claim a block")
        block_claims.claim(state, conf.network, pool, blocks, conf.data_root, conf.persistent_ips)
    return name


def _reserve_requested(conf: IpamConfig, state: PoolState, attachment: Attachment,
                       blocks: BlockApi | None, requested: PoolRequest,
                       claim: ClaimOwner | None) -> tuple[str, lending.Lend | None]:
    """The requested allocation, reserved for attachment, and the lend made for it; code 102
    naming who holds it (in a cluster pool: the node holding its block unless it is a claim's
    address, lent then; or the claim or container on this node)."""
    pool, index = requested.pool, requested.index
    lend = _place(conf, pool, state, index, blocks, claim) if conf.scope == "cluster" else None
    name = pool.record_name(index)
    if state.reserve(attachment, [name], claim) is not None:
        return name, lend
    if lend is not None and blocks is not None:  # what this call lent goes with it
        lending.undo_lend_locked(state, blocks, lend)
    record = state.read_record(name)
    raise AddressTaken(IPAM_EXHAUSTED, f"requested address {pool.answer(index)} of pool "
                   f"{pool.subnet} is taken: {_holder(record)} holds it",
                   f"network {conf.network!r}; requested by {requested.source}")


def _holder(record: Record | None) -> str:
    """Who holds a record, for a message."""
    holder = record.attachment if record is not None else None
    container = (f"container {holder.container_id!r} interface {holder.ifname!r}" if holder
                 else None)
    if record is not None and record.claim is not None:
        return f"IPAMClaim {record.claim}" + (f" (attached to {container})" if container else "")
    return container or "an unreadable record (the next GC removes it)"


def allocate_all(conf: IpamConfig, attachment: Attachment,
                 blocks: BlockApi | None = None,
                 requested: Mapping[Pool, PoolRequest] | None = None,
                 claim: ClaimOwner | None = None) -> list[Allocation]:
    """One block per active pool, the requested one where a request names it (owned by
    claim, if given); what this call reserved or adopted is undone if a later pool fails."""
    allocations: list[Allocation] = []
    try:
        for pool in conf.pools:
            allocations.append(allocate(conf, pool, attachment, blocks,
                                        (requested or {}).get(pool), claim))
    except CniError:
        undo(conf, attachment, allocations, blocks)
        raise
    return allocations


def undo(conf: IpamConfig, attachment: Attachment, allocations: list[Allocation],
         blocks: BlockApi | None = None) -> None:
    """Undo what allocate_all did and only that (a failed ADD's rollback): a record it reserved
    is freed, a claim's included (its status never got it); an adopted one is put back as it
    was (never freed: the claim holds it); one the attachment already held stays; a lend it
    created is deleted (blocks: the API). Best effort: logged, never raised."""
    for done in reversed(allocations):
        state = pool_state(conf, done.pool)
        try:
            with state.locked():
                if done.created:
                    state.free(attachment)
                elif done.adopted is not None:
                    state.restore(done.adopted, attachment)
        except CniError as exc:
            log.warning("cannot undo allocation in %s: %s", state.directory, exc.msg)
    lends = [done.lend for done in allocations if done.lend is not None]
    if lends and blocks is not None:
        lending.undo_lends(blocks, lends, conf.lock_timeout)


def free_claim(data_root: str, uid: str, lock_timeout: float,
               lends: list[lending.Lend] | None = None) -> list[str]:
    """Free every record the IPAMClaim with this uid owns on this node, in the pools noted
    for it under the node's ipamDataRoot (the claim is gone: the agent's watch, GC);
    `pool directory/address` of each. The local records of lends made for those addresses go
    too, and are appended to lends (the caller deletes them from the API; GC deletes any it
    could not). Continues past a failing pool and raises its error after visiting the
    others; the notes go once every pool is done."""
    freed: list[str] = []
    failures: list[CniError] = []
    for path in claimed.pools_of(data_root, uid):
        state = PoolState(path, lock_timeout)
        try:
            with state.locked():
                records = state.free_claim(uid)
                freed.extend(f"{path}/{r.name}" for r in records)
                dropped = lending.forget_lends_of(state, (r.name for r in records))
                if lends is not None:
                    lends.extend(dropped)
        except CniError as exc:
            failures.append(exc)
    if failures:
        raise failures[0]
    claimed.forget(data_root, uid)
    return freed


def claim_owners(data_root: str) -> dict[str, ClaimOwner]:
    """uid → claim of every IPAMClaim that owns records on this node (lock-free: records
    change atomically)."""
    found: dict[str, ClaimOwner] = {}
    for uid in claimed.uids(data_root):
        for path in claimed.pools_of(data_root, uid):
            for record in PoolState(path, 0).claimed(uid):
                if record.claim is not None:
                    found.setdefault(uid, record.claim)
    return found


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


def configured_pool(conf: IpamConfig, state: PoolState) -> Pool | None:
    """The configured pool whose state directory state is."""
    name = os.path.basename(state.directory)
    return next((pool for pool in conf.pools if pool.pool_id == name), None)


def release(conf: IpamConfig, attachment: Attachment,
            blocks: BlockApi | None = None) -> list[str]:
    """Release `attachment`'s records in every pool of the network; the names released. In a
    cluster pool, a block this emptied goes back to the cluster when the node has room enough
    in its other blocks (blocks: the API; None keeps every block).

    Continues past a failing pool and raises its error after visiting the others.
    """
    released: list[str] = []
    failures: list[CniError] = []
    for state in pool_states(conf):
        try:
            with state.locked():
                name = state.release(attachment)
                pool = configured_pool(conf, state)
                if name is not None and pool is not None and conf.scope == "cluster":
                    _release_block_quietly(conf, pool, state, name, blocks)
        except CniError as exc:
            failures.append(exc)
            continue
        if name is not None:
            released.append(name)
    if failures:
        raise failures[0]
    return released


def collect_garbage(conf: IpamConfig, valid: set[Attachment],
                    blocks: BlockApi | None = None) -> list[Record]:
    """Release records of attachments not in `valid` in every pool, continuing past errors.
    In cluster pools (with blocks, the API): settle unfinished claims, give back spare empty
    blocks and delete this node's IPAMBlocks of the network that no pool records."""
    released: list[Record] = []
    failures: list[CniError] = []
    for state in pool_states(conf):
        try:
            with state.locked():
                released.extend(state.collect_garbage(valid))
                pool = configured_pool(conf, state)
                if pool is not None and conf.scope == "cluster" and blocks is not None:
                    block_claims.settle(state, conf.network, pool, blocks)
                    lending.drop_moved_on(state, blocks)
                    block_claims.release_spare_blocks(state, conf.network, pool, blocks)
        except CniError as exc:
            log.warning("GC of %s: %s", state.directory, exc.msg)
            failures.append(exc)
    if conf.scope == "cluster" and blocks is not None:
        states = {pool_hash(conf.network, pool): pool_state(conf, pool) for pool in conf.pools}
        try:
            block_claims.delete_orphans(states, conf.network, conf.pools, blocks)
        except CniError as exc:
            log.warning("GC of network %s's IPAM blocks: %s", conf.network, exc.msg)
            failures.append(exc)
    if failures:
        raise failures[0]
    return released


def _release_block_quietly(conf: IpamConfig, pool: Pool, state: PoolState, name: str,
                           blocks: BlockApi | None) -> None:
    # DEL succeeds whatever happens to the block: it stays held, and GC tries again.
    index = pool.index_of_name(name)
    if index is None:
        return
    try:
        block_claims.release_if_spare(state, conf.network, pool, index, blocks)
    except CniError as exc:
        log.warning("cannot give back the IPAM block of %s: %s", name, exc.msg)

