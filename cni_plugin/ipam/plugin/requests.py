"""Requested addresses (the `ips` capability, SPEC §16) matched to the config's pools: which
allocation of which pool each one names. Pure (no I/O): every refusal is code 7 naming where
the request came from, before anything is written or asked.

A request reaches only what the config itself would hand out: an allocation of one of its
pools that is not reserved (so never an address outside the network's pools, a gateway, or
the middle of an IPv6 block), at most one per pool, as host-local takes at most one per range
set. Record names come from the pool, never from the request's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from cni_plugin.ipam.plugin.config import IpamConfig
from cni_plugin.ipam.plugin.pool import Pool
from netconf.capabilities import RequestedAddress, RequestedIps, invalid_request


@dataclass(frozen=True)
class PoolRequest:
    """A requested address as an allocation of a pool: block `index` of `pool`."""

    pool: Pool
    index: int
    requested: RequestedAddress
    source: str  # runtimeConfig.ips, args.cni.ips or CNI_ARGS 'IP'


def match_pools(conf: IpamConfig, requested: RequestedIps | None) -> dict[Pool, PoolRequest]:
    """The allocation each requested address names, by pool (code 7 for an address outside
    every pool, reserved, not the start of a block, or a second one in a pool). In the
    `addresses` and `static_ip` modes a request must name a configured address."""
    if requested is None:
        return {}
    source = requested.source
    if conf.mode != "pools":
        configured = {fixed.address.ip for fixed in conf.fixed}
        for address in requested.addresses:
            if address.ip not in configured:
                raise invalid_request(source, f"{address.text} is not an address of network "
                                      f"{conf.network!r}", "its ipam block hands out only "
                                      f"{', '.join(sorted(str(ip) for ip in configured))}")
        return {}
    matched: dict[Pool, PoolRequest] = {}
    for address in requested.addresses:
        pool, index = _allocation_of(conf, source, address)
        earlier = matched.get(pool)
        if earlier is not None:
            raise invalid_request(source, f"{earlier.requested.text} and {address.text} are "
                                  f"both in pool {pool.subnet}", "at most one requested address "
                                  "per pool (per family), as host-local takes one per range set")
        matched[pool] = PoolRequest(pool, index, address, source)
    return matched


def _allocation_of(conf: IpamConfig, source: str, address: RequestedAddress) -> tuple[Pool, int]:
    for pool in conf.pools:
        index = pool.index_containing(address.ip)
        if index is None:
            continue
        block = pool.block(index)
        if index in pool.reserved:
            raise invalid_request(source, f"{address.text} is reserved in pool {pool.subnet}",
                                  f"block {block} holds the network address, the gateway "
                                  f"{pool.gateway} or the broadcast address")
        if block.network_address != address.ip:
            raise invalid_request(source, f"{address.text} is not an address pool "
                                  f"{pool.subnet} hands out", f"the pool hands out "
                                  f"/{pool.block_prefix} blocks by their first address: "
                                  f"request {block.network_address} for block {block}")
        return pool, index
    pools = ", ".join(str(pool.subnet) for pool in conf.pools)
    raise invalid_request(source, f"{address.text} is outside every pool of network "
                          f"{conf.network!r}", f"its pools: {pools}")
