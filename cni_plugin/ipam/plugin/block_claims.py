"""Cluster blocks held by this node (`scope: cluster`): allocate inside them from disk, claim
another through the API only when they are full, release a spare empty one.

Every function here runs under the pool's lock (store.PoolState.locked), so no allocation on
this node races a claim or a release. The order of each change keeps the cluster safe:
- claim: the local record (`claiming`) is written before the IPAMBlock's create and becomes
  `held` after it. A create that failed leaves no record; a record left `claiming` by a crash
  or a failed write is settled against the API by the next claim or GC (adopted when the object
  names this node, forgotten otherwise). Addresses come only from `held` blocks.
- release: the local record goes first (nothing allocates from the block any more), then the
  object is deleted with a uid precondition; if the delete fails the record is put back.
A block object whose local record is gone (a lost answer, a failed release) only wastes
addresses: the next claim that meets it adopts it, GC deletes it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from cni_plugin.ipam.plugin import claimed
from cni_plugin.ipam.plugin.blocks import (
    ClusterBlock,
    block_of_cidr,
    block_of_index,
    blocks_of,
    candidates,
    pool_hash,
)
from cni_plugin.ipam.plugin.pool import IPAddress, Pool
from cni_plugin.ipam.plugin.store import Attachment, BlockRecord, ClaimOwner, PoolState
from netconf.errors import IPAM_EXHAUSTED, TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)
CLAIMING, HELD = "claiming", "held"
POOL_LABEL = "vpc-attach.datum.net/pool"  # the pool's hash: a claim lists only its pool
LENT_LABEL = "vpc-attach.datum.net/lent"  # "true" on a lend of one address (lending.py)


class BlockApi(Protocol):
    """The IPAMBlock objects as one node sees them (kubeblocks.KubeBlockApi; fakes in tests)."""

    node: str
    created_by: str  # the created-by annotation of what this verb creates

    def node_uid(self) -> str:
        """The UID of this node's Node object (code 11 while it does not exist)."""

    def pool_blocks(self, network: str, pool: Pool) -> list[dict[str, Any]]:
        """Every IPAMBlock of the pool, whichever node holds it."""

    def node_blocks(self) -> list[dict[str, Any]]:
        """Every IPAMBlock that names this node."""

    def create(self, block: ClusterBlock, node_uid: str) -> dict[str, Any] | None:
        """Create the block's object for this node; None when the name exists (409)."""

    def create_lend(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a lend (lending.lend_object); None when the name exists (409)."""

    def get(self, name: str) -> dict[str, Any] | None:
        """The object, or None."""

    def delete(self, name: str, uid: str) -> bool:
        """Delete it if it still has uid; False when it was gone or replaced."""

    def network_claims(self, network: str) -> list[dict[str, Any]]:
        """Every IPAMClaim of network (`spec.network`), in every namespace."""


def node_of(obj: dict[str, Any]) -> str | None:
    """The node an IPAMBlock names."""
    node = (obj.get("spec") or {}).get("node")
    return node if isinstance(node, str) else None


def is_lend(obj: dict[str, Any]) -> bool:
    """Whether an IPAMBlock is a lend of one address (lending.py) rather than a block."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(LENT_LABEL) == "true"


def uid_of(obj: dict[str, Any]) -> str:
    """The object's UID."""
    return str((obj.get("metadata") or {}).get("uid") or "")


def held_blocks(state: PoolState, network: str, pool: Pool) -> list[tuple[BlockRecord,
                                                                              ClusterBlock]]:
    """The blocks this node holds in pool (records of another pool's shape are ignored)."""
    found = []
    for record in state.blocks():
        block = block_of_cidr(network, pool, record.cidr)
        if record.state == HELD and block is not None and block.name == record.name:
            found.append((record, block))
    return found


def reserve_in_held(state: PoolState, network: str, pool: Pool,
                    attachment: Attachment, claim: ClaimOwner | None = None) -> str | None:
    """Reserve the next free allocation in this node's blocks, after the cursor (owned by
    claim, if given); None if they are full (or there are none). Disk only: the common-case
    ADD."""
    indices = sorted(i for _, block in held_blocks(state, network, pool)
                     for i in block.allocatable())
    if not indices:
        return None
    after = pool.index_of_name(state.cursor() or "")
    if after is not None:
        split = next((n for n, i in enumerate(indices) if i > after), len(indices))
        indices = indices[split:] + indices[:split]
    return state.reserve(attachment, (pool.record_name(i) for i in indices), claim)


def claim(state: PoolState, network: str, pool: Pool, api: BlockApi,
          data_root: str = "", persistent: bool = False) -> ClusterBlock | None:
    """Claim a block of pool for this node (code 102 when none is free, 11 when the API
    cannot be reached, 5 when the local record cannot be written); None when an unfinished
    claim was adopted instead (the caller looks for room again). data_root: the node's
    ipamDataRoot, where the claims of kept addresses in the block are noted; persistent: the
    network allows IPAMClaims (`allowPersistentIPs`), whose addresses a new block keeps."""
    if settle(state, network, pool, api):
        return None
    node_uid = api.node_uid()
    everything = api.pool_blocks(network, pool)
    listed = {str(o["metadata"]["name"]): o for o in everything if not is_lend(o)}
    keeping = Keeping(api, network, pool, persistent,
                      [o for o in everything if is_lend(o)])
    reassert(state, network, pool, api, listed, node_uid)
    held = {record.name for record in state.blocks()}
    count = blocks_of(network, pool)
    # Nodes start their search at different blocks, so nodes claiming at once rarely collide.
    start = int(hashlib.sha256(api.node.encode()).hexdigest()[:8], 16) % count
    for block in candidates(network, pool, start):
        if block.name in held:
            continue
        existing = listed.get(block.name)
        if existing is not None:
            if node_of(existing) == api.node:  # ours, without a local record: adopt it
                state.write_block(BlockRecord(block.name, str(block.cidr), uid_of(existing),
                                              HELD))
                return block
            continue
        if _create_claim(state, pool, block, api, node_uid, keeping, data_root):
            return block
    mine = sum(1 for o in listed.values() if node_of(o) == api.node)
    raise CniError(IPAM_EXHAUSTED, f"pool {pool.subnet} of network {network!r} is exhausted "
                   "across the cluster",
                   f"all {count} blocks of {block_size_text(pool)} are claimed, {mine} by this "
                   f"node ({api.node}) and full; other nodes' blocks are not borrowed")


def _create_claim(state: PoolState, pool: Pool, block: ClusterBlock, api: BlockApi,
                  node_uid: str, keeping: Keeping, data_root: str) -> bool:
    """Create block's IPAMBlock for this node, its local record written `claiming` first and
    `held` after; False (and no record) when another node has it. The addresses in the block
    that IPAMClaims hold (keeping, read before anything is made) become their records."""
    kept = keeping.addresses()
    state.write_block(BlockRecord(block.name, str(block.cidr), None, CLAIMING))
    try:
        created = api.create(block, node_uid)
        if created is None:  # another node won the race, or our own answer was lost
            current = api.get(block.name)
            created = current if current is not None and node_of(current) == api.node \
                else None
    except BaseException:
        _forget(state, block.name)
        raise
    if created is None:
        _forget(state, block.name)
        return False
    state.write_block(BlockRecord(block.name, str(block.cidr), uid_of(created), HELD))
    log.info("claimed IPAM block %s (%s) of pool %s for node %s", block.name, block.cidr,
             pool.subnet, api.node)
    keep(state, block, kept, data_root)
    return True


@dataclass(frozen=True)
class Kept:
    """An address an IPAMClaim holds, whichever node holds its block: a node claiming that
    block keeps it as the claim's record, as the block's former holder did."""

    address: IPAddress
    owner: ClaimOwner
    why: str  # for the log: where the claim's hold on it was read


class Keeping:
    """The claims' addresses a block claimed now must keep, read once per claim: the pool's
    lends (a claim's VM running on another node) and, when the network allows IPAMClaims, each
    claim's `status.ips` (a VM running nowhere while its holder's Node was deleted)."""

    def __init__(self, api: BlockApi, network: str, pool: Pool, persistent: bool,
                 lends: list[dict[str, Any]] | None = None) -> None:
        self.api, self.network, self.pool, self.persistent = api, network, pool, persistent
        self._lends = lends
        self._kept: list[Kept] | None = None

    def addresses(self) -> list[Kept]:
        """Every kept address of the pool's network (one or two LISTs, the first time)."""
        if self._kept is None:
            lends = self._lends if self._lends is not None else \
                [o for o in self.api.pool_blocks(self.network, self.pool) if is_lend(o)]
            kept = lent_addresses(lends)
            if self.persistent:
                kept += claimed_addresses(self.api.network_claims(self.network))
            self._kept = kept
        return self._kept


def lent_addresses(lends: Iterable[dict[str, Any]]) -> list[Kept]:
    """The addresses of lends and the claims they are lent for."""
    kept = []
    for lend in lends:
        spec = lend.get("spec") or {}
        namespace, _, name = str(spec.get("claim") or "").partition("/")
        uid = str(spec.get("claimUID") or "")
        try:
            address = ipaddress.ip_network(str(spec.get("cidr"))).network_address
        except ValueError:
            continue
        if namespace and name and uid:
            kept.append(Kept(address, ClaimOwner(namespace, name, uid),
                             f"lent to node {node_of(lend)!r}"))
    return kept


def claimed_addresses(objects: Iterable[dict[str, Any]]) -> list[Kept]:
    """The addresses in the `status.ips` of IPAMClaims (BlockApi.network_claims), and their
    claims."""
    kept = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        namespace, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
        if not (namespace and name and uid):
            continue
        for ip in (obj.get("status") or {}).get("ips") or ():
            try:
                address = ipaddress.ip_interface(str(ip)).ip
            except ValueError:
                continue
            kept.append(Kept(address, ClaimOwner(namespace, name, uid), "in its status.ips"))
    return kept


def keep(state: PoolState, block: ClusterBlock, kept: Iterable[Kept], data_root: str) -> None:
    """The kept addresses in a block this node just claimed become their claims' records, so
    this node never hands one out while its claim exists (freed with the claim, like any
    claim's record; noted under data_root so that the claim's deletion finds them)."""
    for entry in kept:
        index = block.pool.index_containing(entry.address)
        if index is None or index not in block.indices():
            continue
        if state.keep_for_claim(block.pool.record_name(index), entry.owner):
            log.warning("kept %s of newly claimed IPAM block %s for IPAMClaim %s: %s",
                        entry.address, block.name, entry.owner, entry.why)
        if data_root:
            claimed.note(data_root, entry.owner.uid, state.directory)


def hold_block_of(state: PoolState, network: str, pool: Pool, index: int,
                  api: BlockApi, data_root: str = "",
                  persistent: bool = False) -> dict[str, Any] | None:
    """Make sure this node holds the cluster block of allocation `index` (a requested
    address): held already, adopted, or claimed now (None; the claims' addresses in it kept
    as `claim` keeps them); the IPAMBlock of the node that holds it otherwise (the caller
    refuses it, or borrows the address for a claim)."""
    block = block_of_index(network, pool, index)

    def held() -> bool:
        return any(record.name == block.name for record, _ in held_blocks(state, network, pool))

    if held():  # the common case of a request: asks the API nothing
        return None
    settle(state, network, pool, api)
    if held():
        return None
    current = api.get(block.name)
    if current is None:
        if _create_claim(state, pool, block, api, api.node_uid(),
                         Keeping(api, network, pool, persistent), data_root):
            return None
        current = api.get(block.name)
    if current is not None and node_of(current) == api.node:  # ours without a local record
        state.write_block(BlockRecord(block.name, str(block.cidr), uid_of(current), HELD))
        return None
    if current is None:  # deleted between our create and our read: ask again
        raise CniError(TRY_AGAIN_LATER, f"IPAM block {block.name} ({block.cidr}) changed "
                       "while it was being claimed")
    return current


def held_elsewhere(network: str, pool: Pool, index: int, holder: dict[str, Any],
                   node: str) -> CniError:
    """Code 102 for a requested address (no IPAMClaim's) in a block another node holds."""
    block = block_of_index(network, pool, index)
    return CniError(IPAM_EXHAUSTED, f"requested address {pool.answer(index)} of pool "
                    f"{pool.subnet} is in IPAM block {block.name} ({block.cidr}), held by node "
                    f"{node_of(holder)!r}", f"network {network!r}: this node ({node}) "
                    "allocates only in blocks it holds; only an IPAMClaim's addresses are lent "
                    "across nodes")


def reassert(state: PoolState, network: str, pool: Pool, api: BlockApi,
             listed: dict[str, dict[str, Any]], node_uid: str) -> None:
    """Blocks this node holds whose IPAMBlock is gone (its Node was deleted and registered
    again while the node ran: the garbage collector took them) are created again; one another
    node took meanwhile is forgotten when empty, and reported otherwise (doctor fails it)."""
    for record, block in held_blocks(state, network, pool):
        if record.name in listed:
            continue
        created = api.create(block, node_uid)
        if created is None:
            current = api.get(block.name)
            created = current if current is not None and node_of(current) == api.node else None
        if created is not None:
            state.write_block(BlockRecord(record.name, record.cidr, uid_of(created), HELD))
            listed[record.name] = created
            log.warning("IPAM block %s (%s) of node %s had no IPAMBlock: created it again",
                        record.name, record.cidr, api.node)
        elif used(state, block) == 0:
            state.remove_block(record.name)
        else:
            log.error("IPAM block %s (%s) is in use on node %s but another node claimed it: "
                      "drain this node", record.name, record.cidr, api.node)


def block_size_text(pool: Pool) -> str:
    """E.g. '16 /32 allocations'."""
    block = block_of_index("", pool, 0)
    return f"{block.size} /{pool.block_prefix} allocation(s)"


def settle(state: PoolState, network: str, pool: Pool, api: BlockApi) -> int:
    """Resolve block records left `claiming`: adopted when the object names this node,
    forgotten otherwise; how many were adopted."""
    adopted = 0
    for record in state.blocks():
        if record.state != CLAIMING:  # held, or a lend (lending.py)
            continue
        current = api.get(record.name)
        block = block_of_cidr(network, pool, record.cidr)
        if current is not None and node_of(current) == api.node and block is not None:
            state.write_block(BlockRecord(record.name, record.cidr, uid_of(current), HELD))
            adopted += 1
        else:
            state.remove_block(record.name)
    return adopted


def used(state: PoolState, block: ClusterBlock) -> int:
    """How many of the block's allocations this node has handed out."""
    return sum(1 for i in block.allocatable() if state.holds(block.pool.record_name(i)))


def release_if_spare(state: PoolState, network: str, pool: Pool, index: int,
                     api: BlockApi | None) -> bool:
    """After allocation `index` was released: give its block back when it is empty and this
    node's other blocks of the pool have at least a block's worth of room or another is empty
    (so a node at a block boundary does not claim and release on every ADD and DEL, and keeps
    at most one empty block). True if released."""
    block = block_of_index(network, pool, index)
    return release_spare_blocks(state, network, pool, api, only=[block.name]) > 0


def release_spare_blocks(state: PoolState, network: str, pool: Pool, api: BlockApi | None,
                         only: Iterable[str] | None = None) -> int:
    """Release empty blocks (those named in only, or all) while the node keeps a block's worth
    of room in its other blocks, or another empty block; how many were released. Without an
    API nothing is released (DEL and GC still succeed: the block stays held)."""
    if api is None:
        return 0
    chosen = set(only) if only is not None else None
    held = held_blocks(state, network, pool)
    capacity = {record.name: len(block.allocatable()) for record, block in held}
    room = {record.name: capacity[record.name] - used(state, block) for record, block in held}
    released = 0
    for record, _block in held:
        if chosen is not None and record.name not in chosen:
            continue
        others = [name for name in room if name != record.name]
        spare = sum(room[name] for name in others) >= capacity[record.name] \
            or any(room[name] == capacity[name] for name in others)  # another empty one
        if room[record.name] != capacity[record.name] or not spare:
            continue
        if _release(state, record, api):
            del room[record.name]
            released += 1
    return released


def _release(state: PoolState, record: BlockRecord, api: BlockApi) -> bool:
    state.remove_block(record.name)  # first: nothing on this node allocates from it any more
    try:
        api.delete(record.name, record.uid or "")
    except CniError as exc:
        log.warning("cannot release IPAM block %s, keeping it: %s", record.name, exc.msg)
        state.write_block(record)
        return False
    log.info("released IPAM block %s (%s) of node %s", record.name, record.cidr, api.node)
    return True


def delete_orphans(states: dict[str, PoolState], network: str, pools: Iterable[Pool],
                   api: BlockApi) -> int:
    """Delete this node's IPAMBlocks of network that no pool state records (a lost create
    answer, a failed release): nothing was ever allocated from them. states: by pool hash;
    how many were deleted."""
    by_hash = {pool_hash(network, pool): pool for pool in pools}
    deleted = 0
    for obj in api.node_blocks():
        spec = obj.get("spec") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        digest = labels.get(POOL_LABEL)
        if spec.get("network") != network or digest not in by_hash or digest not in states:
            continue
        name = str(obj["metadata"]["name"])
        with states[digest].locked() as state:
            if any(record.name == name for record in state.blocks()):
                continue
            if api.delete(name, uid_of(obj)):
                log.info("deleted IPAM block %s: this node held it without a record", name)
                deleted += 1
    return deleted


def _forget(state: PoolState, name: str) -> None:
    try:
        state.remove_block(name)
    except CniError as exc:  # left `claiming`: the next claim or GC settles it
        log.warning("cannot remove the claim record of IPAM block %s: %s", name, exc.msg)
