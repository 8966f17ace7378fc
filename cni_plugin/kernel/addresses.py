"""Addresses, routes and neighbour entries on one link (idempotent adds, tolerant deletes)."""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass

from cni_plugin.kernel.links import kernel_errors
from cni_plugin.kernel.rtnl import (
    NUD_PERMANENT,
    RT_SCOPE_LINK,
    RT_SCOPE_UNIVERSE,
    NetlinkError,
    RouteMsg,
    Rtnl,
    family_of,
)

IFA_F_NODAD = 0x02
IFA_F_NOPREFIXROUTE = 0x200
MAIN_TABLE = 254

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


def add_address(rtnl: Rtnl, index: int, ifname: str, address: IPInterface,
                flags: int = 0) -> None:
    """Add address/prefix to link index; already present is fine. IPv6 skips DAD (we own it)."""
    if address.version == 6:
        flags |= IFA_F_NODAD
    try:
        rtnl.new_addr(index, address, flags)
    except NetlinkError as exc:
        if exc.code == errno.EEXIST:
            return
        with kernel_errors("add address " + str(address) + " to", ifname):
            raise


def addresses(rtnl: Rtnl, index: int, *, link_scope: bool = False) -> list[IPInterface]:
    """Addresses of a link: global scope, plus link scope when asked (a gateway like fe80::1
    is ours; the kernel's own fe80::/64 addresses are never compared against)."""
    return [ipaddress.ip_interface(f"{msg.address or msg.local}/{msg.prefixlen}")
            for msg in rtnl.addrs(index=index)
            if msg.scope == RT_SCOPE_UNIVERSE or link_scope]


@dataclass(frozen=True)
class RouteSpec:
    """A route we install: destination, optional gateway, on a link, in a table."""

    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    oif: int
    gateway: IPAddr | None = None
    table: int = MAIN_TABLE
    onlink: bool = False


def add_route(rtnl: Rtnl, route: RouteSpec, ifname: str) -> None:
    """Install route (replace semantics: repeated ADD converges)."""
    # Without a gateway the destination is on the link itself.
    scope = RT_SCOPE_UNIVERSE if route.gateway is not None else RT_SCOPE_LINK
    with kernel_errors(f"add route {route.dst} via", ifname):
        rtnl.replace_route(route.dst, table=route.table, oif=route.oif, gateway=route.gateway,
                           onlink=route.onlink and route.gateway is not None, scope=scope)


def has_route(rtnl: Rtnl, route: RouteSpec) -> bool:
    """True when a route to route.dst via route.oif (and gateway, if any) is in route.table."""
    for msg in rtnl.routes(family_of(route.dst.version), table=route.table, oif=route.oif):
        if _route_dst(msg) != route.dst:
            continue
        if route.gateway is None or msg.gateway == str(route.gateway):
            return True
    return False


def _route_dst(msg: RouteMsg) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    dst = msg.dst or ("0.0.0.0" if msg.family == socket.AF_INET else "::")
    return ipaddress.ip_network(f"{dst}/{msg.dst_len}")


def add_permanent_neighbour(rtnl: Rtnl, index: int, ifname: str, ip: IPAddr, mac: str) -> None:
    """Pin ip -> mac on link index (replace: repeated ADD converges)."""
    with kernel_errors(f"add neighbour {ip} on", ifname):
        rtnl.replace_neigh(index, ip, mac, NUD_PERMANENT)


def permanent_neighbours(rtnl: Rtnl, index: int) -> dict[str, str]:
    """ip -> mac of permanent neighbour entries on link index."""
    return {msg.dst: msg.lladdr or "" for msg in rtnl.neighbours(index=index)
            if msg.state & NUD_PERMANENT and msg.dst is not None}
