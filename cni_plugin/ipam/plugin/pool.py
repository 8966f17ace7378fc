"""Pool arithmetic: a subnet cut into equal blocks, numbered from 0, some of them reserved.

Pure (no I/O): the allocator and the on-disk store speak of blocks by index and by record name
(the block's first address), and this module converts between the two.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_IPV6_BLOCK_PREFIX = 96


@dataclass(frozen=True)
class Pool:
    """A subnet handing out blocks of `block_prefix` (/96 IPv6 by default, /32 IPv4).

    Reserved, never handed out: block 0 (the network address, where the default gateway lives),
    the gateway's block, and for IPv4 the broadcast address.
    """

    subnet: IPNetwork
    block_prefix: int
    gateway: IPAddress

    def __post_init__(self) -> None:
        if not self.subnet.prefixlen <= self.block_prefix <= self.subnet.max_prefixlen:
            raise ValueError(f"block prefix /{self.block_prefix} does not fit in {self.subnet}")
        if self.gateway.version != self.subnet.version or self.gateway not in self.subnet:
            raise ValueError(f"gateway {self.gateway} is not in {self.subnet}")

    @classmethod
    def with_default_gateway(cls, subnet: IPNetwork, block_prefix: int) -> Pool:
        """The pool whose gateway is the subnet's first host address (network + 1)."""
        if subnet.num_addresses < 2:
            raise ValueError(f"{subnet} has no room for a gateway")
        return cls(subnet, block_prefix, subnet.network_address + 1)

    @property
    def family(self) -> int:
        """4 or 6."""
        return self.subnet.version

    @property
    def size(self) -> int:
        """Number of blocks, reserved ones included."""
        return 1 << (self.block_prefix - self.subnet.prefixlen)

    @property
    def _block_bits(self) -> int:
        return self.subnet.max_prefixlen - self.block_prefix

    @cached_property
    def reserved(self) -> frozenset[int]:
        """Indices of blocks never handed out."""
        indices = {0, self._index_of(self.gateway)}
        if self.family == 4:
            indices.add(self.size - 1)  # broadcast
        return frozenset(indices)

    @property
    def capacity(self) -> int:
        """How many blocks can be allocated at most."""
        return self.size - len(self.reserved)

    @property
    def pool_id(self) -> str:
        """Directory name of this pool's state: subnet and block length, e.g. `fd00::_64_96`."""
        return f"{self.subnet.network_address}_{self.subnet.prefixlen}_{self.block_prefix}"

    def block(self, index: int) -> IPNetwork:
        """Block number `index` (0 ≤ index < size)."""
        if not 0 <= index < self.size:
            raise IndexError(f"block {index} is outside {self.subnet}")
        first = int(self.subnet.network_address) + (index << self._block_bits)
        # By class, not ip_network(): a small integer would be read as IPv4.
        return type(self.subnet)((first, self.block_prefix))

    def _index_of(self, address: IPAddress) -> int:
        return (int(address) - int(self.subnet.network_address)) >> self._block_bits

    def index_containing(self, address: IPAddress) -> int | None:
        """The block `address` lies in; None outside the subnet (or of the other family)."""
        if address.version != self.family or address not in self.subnet:
            return None
        return self._index_of(address)

    def record_name(self, index: int) -> str:
        """The name of block `index` on disk: its first address, e.g. `fd00::1:0:0`."""
        return str(self.block(index).network_address)

    def index_of_name(self, name: str) -> int | None:
        """The block a record name stands for; None if it is not a block start of this pool."""
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return None
        if address.version != self.family or address not in self.subnet:
            return None
        index = self._index_of(address)
        return index if self.block(index).network_address == address else None

    def answer(self, index: int) -> str:
        """The address handed out for block `index`, e.g. `fd00::1:0:0/96`, `10.0.0.2/32`."""
        return f"{self.block(index).network_address}/{self.block_prefix}"

    def candidates(self, after: int | None = None) -> Iterator[int]:
        """Allocatable block indices, starting just after `after` and wrapping around once."""
        start = 0 if after is None or not 0 <= after < self.size else (after + 1) % self.size
        for offset in range(self.size):
            index = (start + offset) % self.size
            if index not in self.reserved:
                yield index
