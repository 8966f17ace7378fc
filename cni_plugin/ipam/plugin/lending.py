"""An IPAMClaim's address lent across nodes (`scope: cluster`, SPEC §16): a VM keeps its
address wherever it runs, even inside a block another node holds.

The node that first allocated the claim's address (the holder of its block) keeps the claim's
record after the VM leaves (DEL detaches it), so it never hands the address to anyone else
while the claim exists. The node the VM runs on now records the address too (the claim's
record in its own pool state) and makes the lend visible: an IPAMBlock for that one address
(`lend_name`), labelled `vpc-attach.datum.net/lent`, naming this node, the holder's block
(`lentFrom`) and the claim, owned by this node's Node. Its name is the address's, so two
nodes cannot both borrow it: the second one's create is a 409, and the lend it then reads
names the claim — another claim's lend is code 102, the same claim's is the VM moving on
(taken over: deleted with a uid precondition, then created for this node). When the VM
comes back to the holder, the holder deletes the lend (`recall`).

Order, as for blocks (block_claims.py): the local record of the lend (state `borrowed`) is written
before the create, so GC never deletes a lend this node is making (it deletes only lends of
this node without a local record). A failed ADD deletes a lend it created (`undo_lends`); the
claim's deletion frees the records on every node (the agent's watch, GC) and deletes the lend
the node recorded (`cni_plugin/kubevirt/release.py`).

Every function here runs under the pool's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cni_plugin.ipam.plugin.block_claims import LENT_LABEL, POOL_LABEL, BlockApi, node_of, uid_of
from cni_plugin.ipam.plugin.blocks import ClusterBlock, object_name, pool_hash
from cni_plugin.ipam.plugin.pool import Pool
from cni_plugin.ipam.plugin.store import AddressTaken, BlockRecord, ClaimOwner, PoolState
from cni_plugin.kube.client import CREATED_BY_ANNOTATION
from netconf.errors import IPAM_EXHAUSTED, TRY_AGAIN_LATER, CniError

log = logging.getLogger(__name__)
BORROWED = "borrowed"  # the local record of a lend this node made
LEND_SUFFIX = "-lent"
MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class Lend:
    """A lend this call created: what its undo deletes."""

    name: str
    uid: str
    directory: str  # the pool state recording it


def lend_name(network: str, pool: Pool, index: int) -> str:
    """The IPAMBlock name of allocation index lent out: its own block name plus `-lent`,
    e.g. `3f2a9c1b0e4d-v4-ac1b0045-32-lent` (≤ 57 characters for IPv6)."""
    return object_name(pool_hash(network, pool), pool.block(index)) + LEND_SUFFIX


def claim_of(obj: dict[str, Any]) -> tuple[str, str]:
    """(`namespace/name`, uid) of the claim a lend is for."""
    spec = obj.get("spec") or {}
    return str(spec.get("claim") or ""), str(spec.get("claimUID") or "")


def lend_object(network: str, pool: Pool, index: int, holder: ClusterBlock, node: str,
                node_uid: str, claim: ClaimOwner, created_by: str) -> dict[str, Any]:
    """The IPAMBlock saying that allocation index of holder's block is lent to node for claim,
    owned by node's Node (it goes with the Node, as the node's blocks do)."""
    return {
        "apiVersion": "vpc-attach.datum.net/v1alpha1", "kind": "IPAMBlock",
        "metadata": {
            "name": lend_name(network, pool, index),
            "labels": {POOL_LABEL: pool_hash(network, pool), LENT_LABEL: "true"},
            "annotations": {CREATED_BY_ANNOTATION: created_by},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                 "uid": node_uid}],
        },
        "spec": {"network": network, "subnet": str(pool.subnet),
                 "allocationPrefixLength": pool.block_prefix, "cidr": str(pool.block(index)),
                 "node": node, "lentFrom": holder.name, "claim": str(claim),
                 "claimUID": claim.uid},
    }


def borrow(state: PoolState, network: str, pool: Pool, index: int, holder: ClusterBlock,
           holder_node: str, api: BlockApi, claim: ClaimOwner) -> Lend | None:
    """Make allocation index (in holder's block, another node's) this node's for claim: a lend
    naming this node, created or taken over from the node the claim's VM ran on before (code
    102 naming the claim and node when another claim has it lent). The lend this call created,
    None when this node had it already."""
    name = lend_name(network, pool, index)
    cidr = str(pool.block(index))
    for _ in range(MAX_ATTEMPTS):
        current = api.get(name)
        if current is not None:
            named, uid = claim_of(current)
            if uid != claim.uid:
                raise AddressTaken(IPAM_EXHAUSTED, f"requested address {pool.answer(index)} "
                                   f"of pool {pool.subnet} is lent to node "
                                   f"{node_of(current)!r} for IPAMClaim {named}",
                                   f"network {network!r}: IPAMBlock {name}")
            if node_of(current) == api.node:
                state.write_block(BlockRecord(name, cidr, uid_of(current), BORROWED))
                return None
            if not api.delete(name, uid_of(current)):
                continue  # changed meanwhile: read again
            log.info("took over the lend of %s for IPAMClaim %s from node %s", cidr, claim,
                     node_of(current))
        state.write_block(BlockRecord(name, cidr, None, BORROWED))  # first: GC keeps it
        try:
            created = api.create_lend(lend_object(network, pool, index, holder, api.node,
                                                  api.node_uid(), claim, api.created_by))
        except BaseException:
            state.remove_block(name)
            raise
        if created is None:  # another node borrowed it meanwhile: read whose it is
            state.remove_block(name)
            continue
        state.write_block(BlockRecord(name, cidr, uid_of(created), BORROWED))
        log.info("borrowed %s of IPAM block %s (node %s) for IPAMClaim %s", cidr, holder.name,
                 holder_node, claim)
        return Lend(name, uid_of(created), state.directory)
    raise CniError(TRY_AGAIN_LATER, f"IPAMBlock {name} (the lend of {cidr}) keeps changing")


def recall(state: PoolState, network: str, pool: Pool, index: int, api: BlockApi,
           claim: ClaimOwner) -> None:
    """The claim's VM is on the node holding its address's block (back, or this node claimed
    the block since): delete the claim's lend of it, and this node's record of a lend it made
    before (one GET when there is none)."""
    name = lend_name(network, pool, index)
    if any(record.name == name for record in borrowed(state)):
        state.remove_block(name)
    current = api.get(name)
    if current is None or claim_of(current)[1] != claim.uid:
        return
    if api.delete(name, uid_of(current)):
        log.info("recalled %s for IPAMClaim %s from node %s", pool.block(index), claim,
                 node_of(current))


def borrowed(state: PoolState) -> list[BlockRecord]:
    """The lends this node recorded in this pool."""
    return [record for record in state.blocks() if record.state == BORROWED]


def forget_lends_of(state: PoolState, addresses: Iterable[str]) -> list[Lend]:
    """Drop the local records of lends of these record names (a claim's freed records); the
    lends to delete from the API."""
    freed = set(addresses)
    dropped: list[Lend] = []
    for record in borrowed(state):
        if record.cidr.split("/", 1)[0] in freed:
            state.remove_block(record.name)
            dropped.append(Lend(record.name, record.uid or "", state.directory))
    return dropped


def drop_moved_on(state: PoolState, api: BlockApi) -> list[str]:
    """GC: forget the lends this node made whose object is gone or names another node now (the
    claim's VM moved on, or came back to the holder), with the claim's record here when no
    container holds it: this node never allocates in another node's block, so the record kept
    nothing, and the claim's next Pod here borrows again. The addresses forgotten."""
    dropped: list[str] = []
    for record in borrowed(state):
        if record.uid is None:
            continue  # a create in flight or unanswered: left to the claim's deletion
        current = api.get(record.name)
        if current is not None and uid_of(current) == record.uid:
            continue
        address = record.cidr.split("/", 1)[0]
        kept = state.read_record(address)
        if kept is not None and kept.attachment is None and kept.claim is not None:
            state.free_claim_record(address)
        state.remove_block(record.name)
        dropped.append(address)
        log.info("forgot the lend of %s: it names node %s now", record.cidr,
                 node_of(current) if current is not None else "none (recalled)")
    return dropped


def undo_lends(api: BlockApi, lends: Iterable[Lend], lock_timeout: float) -> None:
    """A failed ADD deletes the lends it created (uid precondition: one another node took over
    since stays), then their local records; best effort, logged."""
    for lend in lends:
        try:
            with PoolState(lend.directory, lock_timeout).locked() as state:
                undo_lend_locked(state, api, lend)
        except CniError as exc:
            log.warning("cannot undo the lend %s (GC deletes it): %s", lend.name, exc.msg)


def undo_lend_locked(state: PoolState, api: BlockApi, lend: Lend) -> None:
    """Delete a lend this call created and its local record (the pool's lock held); best
    effort: a lend left behind names this node without a local record, which GC deletes."""
    try:
        api.delete(lend.name, lend.uid)
        state.remove_block(lend.name)
    except CniError as exc:
        log.warning("cannot undo the lend %s (GC deletes it): %s", lend.name, exc.msg)
