"""The node's underlay as galactic finds it: the interface(s) SRv6 packets leave by, this node's
source address for them, the next hop's MAC, and the MTU that is left for a workload.

galactic's datapath takes the interfaces named by its setting, else those of the IPv6 default
route (`attach.ResolveInterfaces`); the first one's first global IPv6 address is the outer
source of encapsulated packets, and its first resolved IPv6 neighbour the uplink's next hop
(`srv6.ResolveNodeSourceAddress`, `ResolvePublicUplink`). vpc-attach resolves them the same way
(host setting `underlayInterfaces` instead of galactic's environment variable).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from cni_plugin.kernel.links import kernel_errors
from cni_plugin.kernel.rtnl import LinkMsg, NetlinkError, Rtnl

MAIN_TABLE = 254
RT_SCOPE_UNIVERSE = 0
ENCAPSULATION_BYTES = 40  # the outer IPv6 header usid_egress pushes (no SRH: one segment)


@dataclass(frozen=True)
class Uplink:
    """Where public_uplink_table sends a reply: the link, its next hop's MAC and its own."""

    ifindex: int
    dmac: str
    smac: str


def underlay_links(rtnl: Rtnl, configured: tuple[str, ...] = ()) -> list[LinkMsg]:
    """The configured underlay links (missing ones skipped), else the devices of the main
    table's IPv6 default routes, in route order; empty when there are none."""
    if configured:
        found = []
        for name in configured:
            try:
                found.append(rtnl.get_link(name=name))
            except NetlinkError:
                continue
        return found
    with kernel_errors("list", "IPv6 routes of the main table"):
        routes = rtnl.routes(socket.AF_INET6, table=MAIN_TABLE)
    indexes: list[int] = []
    for route in routes:
        if route.dst_len == 0 and route.oif and route.oif not in indexes:
            indexes.append(route.oif)
    with kernel_errors("list", "links"):
        by_index = {link.index: link for link in rtnl.links()}
    return [by_index[index] for index in indexes if index in by_index]


def source_address(rtnl: Rtnl, link: LinkMsg) -> str | None:
    """The link's first global-scope IPv6 address (the outer source of encapsulated packets)."""
    with kernel_errors("list the addresses of", link.name):
        addresses = rtnl.addrs(socket.AF_INET6, index=link.index)
    for address in addresses:
        local = address.local or address.address
        if address.scope == RT_SCOPE_UNIVERSE and local and \
                not ipaddress.IPv6Address(local).is_unspecified:
            return local
    return None


def uplink(rtnl: Rtnl, link: LinkMsg) -> Uplink | None:
    """The link with the MAC of its first resolved, non-multicast IPv6 neighbour."""
    with kernel_errors("list the neighbours on", link.name):
        neighbours = rtnl.neighbours(link.index)
    for neighbour in neighbours:
        if neighbour.family == socket.AF_INET6 and neighbour.lladdr and neighbour.dst and \
                not ipaddress.IPv6Address(neighbour.dst).is_multicast and \
                len(neighbour.lladdr.split(":")) == 6:
            return Uplink(link.index, neighbour.lladdr, link.mac)
    return None


def next_hop(rtnl: Rtnl, destination: str) -> Uplink | None:
    """How a packet to destination leaves: the link of its route and the resolved MAC of the
    route's gateway (or of the destination, on link); None when either is missing
    (egressroutemap.resolveLinkAndL2)."""
    address = ipaddress.IPv6Address(destination)
    try:
        route = rtnl.route_get(address)
    except NetlinkError:
        return None
    if not route.oif:
        return None
    hop = ipaddress.IPv6Address(route.gateway) if route.gateway else address
    with kernel_errors("list the neighbours of link", str(route.oif)):
        neighbours = rtnl.neighbours(route.oif)
        link = rtnl.get_link(index=route.oif)
    for neighbour in neighbours:
        if neighbour.dst and ipaddress.ip_address(neighbour.dst) == hop and neighbour.lladdr \
                and len(neighbour.lladdr.split(":")) == 6:
            return Uplink(route.oif, neighbour.lladdr, link.mac)
    return None


def workload_mtu(links: list[LinkMsg], underlay_mtu: int | None = None) -> int | None:
    """The largest MTU a workload link may have for its packets to cross the underlay
    encapsulated: the underlay's MTU (configured, else the smallest of its links) less the
    outer header; None when the node has no underlay to go by."""
    mtu = underlay_mtu if underlay_mtu else min((link.mtu for link in links), default=None)
    return None if mtu is None else mtu - ENCAPSULATION_BYTES
