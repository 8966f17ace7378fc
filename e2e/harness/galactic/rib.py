"""The collector's EVPN routes, as ``gobgp global rib -a evpn -j`` prints them, as records.

The JSON maps each destination to its paths; a path has ``nlri.value`` (``rd``, ``prefix``),
``attrs`` (14 MP_REACH_NLRI: ``nexthop``; 16 extended communities; 40 BGP Prefix-SID: the SRv6
SID, base64) and ``peer-address`` (the neighbor it came from).
"""

from __future__ import annotations

import base64
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ATTR_MP_REACH = 14
ATTR_EXTENDED_COMMUNITIES = 16
ATTR_PREFIX_SID = 40
SUBTYPE_ROUTE_TARGET = 2
TLV_SRV6_L3_SERVICE = 5
SUBTLV_SRV6_SID_INFORMATION = 1


@dataclass(frozen=True)
class EvpnRoute:
    """One path: the prefix, its RD, route targets, SRv6 SID, next hop and the peer it came from."""

    prefix: str
    rd: str
    route_targets: tuple[str, ...]
    sid: str | None
    next_hop: str
    router: str  # the neighbor address the collector learned it from


def sorted_routes(routes: Iterable[EvpnRoute]) -> list[EvpnRoute]:
    """Routes in one order (a route without a SID sorts before one with)."""
    return sorted(routes, key=lambda r: (r.prefix, r.rd, r.route_targets, r.sid or "",
                                         r.sid is not None, r.next_hop, r.router))


def parse_rib(text: str) -> list[EvpnRoute]:
    """Every path of the JSON RIB, in ``sorted_routes`` order."""
    destinations: dict[str, list[dict[str, Any]]] = json.loads(text) or {}
    return sorted_routes(parse_path(path) for paths in destinations.values() for path in paths)


def parse_path(path: dict[str, Any]) -> EvpnRoute:
    """One path object of the RIB."""
    nlri = path["nlri"]["value"]
    attrs = {attr["type"]: attr for attr in path.get("attrs") or []}
    return EvpnRoute(
        prefix=str(nlri["prefix"]),
        rd=f"{nlri['rd']['admin']}:{nlri['rd']['assigned']}",
        route_targets=_route_targets(attrs.get(ATTR_EXTENDED_COMMUNITIES)),
        sid=_sid(attrs.get(ATTR_PREFIX_SID)),
        next_hop=str(attrs[ATTR_MP_REACH]["nexthop"]),
        router=str(path["peer-address"]),
    )


def _route_targets(attr: dict[str, Any] | None) -> tuple[str, ...]:
    communities = (attr or {}).get("value") or []
    return tuple(sorted(str(c["value"]) for c in communities
                        if c.get("subtype") == SUBTYPE_ROUTE_TARGET))


def _sid(attr: dict[str, Any] | None) -> str | None:
    for tlv in (attr or {}).get("TLVs") or []:
        if tlv.get("type") != TLV_SRV6_L3_SERVICE:
            continue
        for sub in tlv.get("SubTLVs") or []:
            if sub.get("type") == SUBTLV_SRV6_SID_INFORMATION:
                return str(ipaddress.IPv6Address(base64.b64decode(sub["sid"])))
    return None
