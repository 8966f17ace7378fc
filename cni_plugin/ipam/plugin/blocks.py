"""Cluster blocks of a pool (`scope: cluster`): the pool's allocations grouped into equal,
aligned blocks that a node claims whole through an `IPAMBlock` object. Pure (no I/O).

A pool hands out allocations (a /32, or an IPv6 block of `ipv6_prefix_length`) numbered from 0
(`pool.Pool`); cluster block k holds allocations k*size … k*size+size-1. Its size is derived
from the pool alone, so every node agrees on it without asking anyone: at least 16 blocks per
pool (so 16 nodes can share a small one), at most 64 allocations per block (a node claims again
after 64 Pods, not after one). docs/architecture.md explains the choice.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass

from cni_plugin.ipam.plugin.pool import IPNetwork, Pool

MAX_BLOCK_SIZE = 64
MIN_BLOCKS_PER_POOL = 16
POOL_HASH_LENGTH = 12
# `<pool hash>-v4-<hex of the block's first address>-<prefix length>`: a DNS label.
NAME = re.compile(r"^([0-9a-f]{12})-v([46])-([0-9a-f]+)-([0-9]{1,3})$")


def block_size(pool: Pool) -> int:
    """Allocations per cluster block of `pool`: a power of two, 1 … MAX_BLOCK_SIZE."""
    bits = (pool.size.bit_length() - 1) - (MIN_BLOCKS_PER_POOL.bit_length() - 1)
    return 1 << max(0, min(bits, MAX_BLOCK_SIZE.bit_length() - 1))


def pool_identity(network: str, pool: Pool) -> str:
    """What names a pool across the cluster: network name, subnet and allocation length."""
    return f"{network}/{pool.subnet}/{pool.block_prefix}"


def pool_hash(network: str, pool: Pool) -> str:
    """A short, stable digest of the pool's identity (object names, the pool label)."""
    return hashlib.sha256(pool_identity(network, pool).encode()).hexdigest()[:POOL_HASH_LENGTH]


@dataclass(frozen=True)
class ClusterBlock:
    """Block number `number` of a pool in network `network`."""

    network: str
    pool: Pool
    number: int

    @property
    def size(self) -> int:
        """Allocations in the block."""
        return block_size(self.pool)

    @property
    def cidr(self) -> IPNetwork:
        """The addresses the block covers."""
        first = self.pool.block(self.number * self.size).network_address
        prefix = self.pool.block_prefix - (self.size.bit_length() - 1)
        return type(self.pool.subnet)((first, prefix))

    @property
    def name(self) -> str:
        """Its IPAMBlock's name: two nodes claiming it create the same name, so one gets 409."""
        return object_name(pool_hash(self.network, self.pool), self.cidr)

    def indices(self) -> range:
        """The pool's allocation indices in this block."""
        return range(self.number * self.size, (self.number + 1) * self.size)

    def allocatable(self) -> list[int]:
        """Indices in the block that are not reserved (network, gateway, broadcast)."""
        return [i for i in self.indices() if i not in self.pool.reserved]


def blocks_of(network: str, pool: Pool) -> int:
    """How many cluster blocks the pool has."""
    return pool.size // block_size(pool)


def block_of_index(network: str, pool: Pool, index: int) -> ClusterBlock:
    """The cluster block holding allocation `index`."""
    return ClusterBlock(network, pool, index // block_size(pool))


def block_of_cidr(network: str, pool: Pool, cidr: str) -> ClusterBlock | None:
    """The cluster block whose CIDR is `cidr`; None if it is not one of the pool's."""
    try:
        network_cidr = ipaddress.ip_network(cidr)
    except ValueError:
        return None
    if network_cidr.version != pool.family or not network_cidr.subnet_of(pool.subnet):  # type: ignore[arg-type]
        return None
    index = pool.index_of_name(str(network_cidr.network_address))
    if index is None or index % block_size(pool):
        return None
    block = ClusterBlock(network, pool, index // block_size(pool))
    return block if block.cidr == network_cidr else None


def candidates(network: str, pool: Pool, start: int) -> Iterator[ClusterBlock]:
    """Blocks with at least one allocatable index, from block `start` on, wrapping once."""
    count = blocks_of(network, pool)
    for offset in range(count):
        block = ClusterBlock(network, pool, (start + offset) % count)
        if block.allocatable():
            yield block


def object_name(pool_digest: str, cidr: IPNetwork) -> str:
    """`<pool digest>-v<family>-<first address in hex>-<prefix length>`, e.g.
    `3f2a9c1b0e4d-v4-ac1b0040-28` for 172.27.0.64/28: a DNS label (≤ 63 characters)."""
    width = 8 if cidr.version == 4 else 32
    return f"{pool_digest}-v{cidr.version}-{int(cidr.network_address):0{width}x}-{cidr.prefixlen}"


def parse_object_name(name: str) -> tuple[str, IPNetwork] | None:
    """(pool digest, CIDR) of an IPAMBlock name written by `object_name`; None otherwise."""
    match = NAME.match(name)
    if match is None:
        return None
    digest, family, first, prefix = match.groups()
    width = 8 if family == "4" else 32
    if len(first) != width:
        return None
    try:
        cidr: IPNetwork = ipaddress.IPv4Network((int(first, 16), int(prefix))) if family == "4" \
            else ipaddress.IPv6Network((int(first, 16), int(prefix)))
    except ValueError:  # host bits set, or a prefix out of range
        return None
    return (digest, cidr) if object_name(digest, cidr) == name else None
