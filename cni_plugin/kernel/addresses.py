"""Addresses, routes and neighbour entries on one link (idempotent adds, tolerant deletes)."""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni_plugin.kernel.links import kernel_errors

IFA_F_NODAD = 0x02
IFA_F_NOPREFIXROUTE = 0x200
RTNH_F_ONLINK = 0x04
RT_SCOPE_LINK = 253
NUD_PERMANENT = 0x80
MAIN_TABLE = 254

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


def family_of(version: int) -> int:
    """AF_INET / AF_INET6 of an IP version."""
    return socket.AF_INET if version == 4 else socket.AF_INET6


def add_address(ipr: IPRoute, index: int, ifname: str, address: IPInterface,
                flags: int = 0) -> None:
    """Add address/prefix to link index; already present is fine. IPv6 skips DAD (we own it)."""
    if address.version == 6:
        flags |= IFA_F_NODAD
    try:
        ipr.addr("add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen,
                 flags=flags)
    except NetlinkError as exc:
        if exc.code == errno.EEXIST:
            return
        with kernel_errors("add address " + str(address) + " to", ifname):
            raise


def addresses(ipr: IPRoute, index: int) -> list[IPInterface]:
    """Addresses of a link (global scope only: link-local ones are the kernel's)."""
    found: list[IPInterface] = []
    for msg in ipr.get_addr(index=index):
        if msg["scope"] != 0:
            continue
        found.append(ipaddress.ip_interface(f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}"))
    return found


@dataclass(frozen=True)
class RouteSpec:
    """A route we install: destination, optional gateway, on a link, in a table."""

    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    oif: int
    gateway: IPAddr | None = None
    table: int = MAIN_TABLE
    onlink: bool = False

    def netlink_args(self) -> dict[str, Any]:
        """The keyword arguments of IPRoute.route for this route."""
        args: dict[str, Any] = {
            "dst": str(self.dst), "oif": self.oif, "table": self.table,
            "family": family_of(self.dst.version),
        }
        if self.gateway is not None:
            args["gateway"] = str(self.gateway)
            if self.onlink:
                args["flags"] = RTNH_F_ONLINK
        else:
            args["scope"] = RT_SCOPE_LINK
        return args


def add_route(ipr: IPRoute, route: RouteSpec, ifname: str) -> None:
    """Install route (replace semantics: repeated ADD converges)."""
    with kernel_errors(f"add route {route.dst} via", ifname):
        ipr.route("replace", **route.netlink_args())


def has_route(ipr: IPRoute, route: RouteSpec) -> bool:
    """True when a route to route.dst via route.oif (and gateway, if any) is in route.table."""
    for msg in ipr.get_routes(family=family_of(route.dst.version), table=route.table,
                              oif=route.oif):
        if _route_dst(msg) != route.dst:
            continue
        if route.gateway is None or msg.get("RTA_GATEWAY") == str(route.gateway):
            return True
    return False


def _route_dst(msg: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    dst = msg.get("RTA_DST") or ("0.0.0.0" if msg["family"] == socket.AF_INET else "::")
    return ipaddress.ip_network(f"{dst}/{msg['dst_len']}")


def routes_in_table(ipr: IPRoute, table: int, oif: int) -> list[str]:
    """Destinations (CIDR strings) of routes through oif in table, both families."""
    found: list[str] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for msg in ipr.get_routes(family=family, table=table, oif=oif):
            found.append(str(_route_dst(msg)))
    return found


def default_routes(ipr: IPRoute, oif: int) -> dict[int, str | None]:
    """Gateway of the main-table default route through oif, per IP version."""
    found: dict[int, str | None] = {}
    for version in (4, 6):
        for msg in ipr.get_routes(family=family_of(version), table=MAIN_TABLE, oif=oif):
            if msg["dst_len"] == 0:
                found[version] = msg.get("RTA_GATEWAY")
    return found


def add_permanent_neighbour(ipr: IPRoute, index: int, ifname: str, ip: IPAddr, mac: str) -> None:
    """Pin ip -> mac on link index (replace: repeated ADD converges)."""
    with kernel_errors(f"add neighbour {ip} on", ifname):
        ipr.neigh("replace", dst=str(ip), lladdr=mac, ifindex=index, state=NUD_PERMANENT,
                  family=family_of(ip.version))


def permanent_neighbours(ipr: IPRoute, index: int) -> dict[str, str]:
    """ip -> mac of permanent neighbour entries on link index."""
    found: dict[str, str] = {}
    for msg in ipr.get_neighbours(ifindex=index):
        if msg["state"] & NUD_PERMANENT:
            found[str(msg.get("NDA_DST"))] = (msg.get("NDA_LLADDR") or "").lower()
    return found
