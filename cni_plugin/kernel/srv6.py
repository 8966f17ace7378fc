"""The node answers its VPCs' SIDs: seg6local End.DT46 routes into each VPC's VRF.

Another node sends a VPC's traffic to the SID this node published for it (`naming.srv6_sid`);
`SID/128 encap seg6local action End.DT46 vrftable T dev G{vpc:9}V` in the main table strips
the outer IPv6 header and looks the inner packet up in the VPC's table. The route goes through
the VRF device, so it is removed with it (shared per-VPC state, like the VRF). End.DT4/DT46
need the kernel's `net.vrf.strict_mode` (one table per VRF, which vpc-attach keeps anyway).
"""

from __future__ import annotations

import ipaddress
import os
import socket

from cni_plugin.core import naming
from cni_plugin.kernel import links
from cni_plugin.kernel.links import kernel_errors
from cni_plugin.kernel.rtnl import (
    LWTUNNEL_ENCAP_SEG6_LOCAL,
    SEG6_LOCAL_ACTION,
    SEG6_LOCAL_ACTION_END_DT46,
    SEG6_LOCAL_VRFTABLE,
    NetlinkError,
    RouteMsg,
    Rtnl,
    as_u32,
    parse_attrs,
    seg6local_end_dt46,
)
from cni_plugin.kernel.sysctl import get_sysctl, set_sysctl
from netconf.errors import KERNEL_FAILURE, CniError

MAIN_TABLE = 254
STRICT_MODE = "net.vrf.strict_mode"
PROBE_TABLE = 4093
PROBE_SID = "fd00:ffff:ffff::1/128"


def ensure_decap(rtnl: Rtnl, vpc: str, sid: str) -> None:
    """``sid`` decapsulated into the VPC's VRF (created or replaced; call after the VRF)."""
    vrf = rtnl.get_link(name=naming.vrf_name(vpc))
    if vrf.kind != "vrf" or vrf.vrf_table is None:
        raise CniError(KERNEL_FAILURE, f"link {vrf.name!r} is not a VRF", "cannot decapsulate")
    set_sysctl(STRICT_MODE, "1")
    with kernel_errors("add SRv6 End.DT46 route for SID", sid):
        rtnl.replace_route(ipaddress.ip_network(f"{sid}/128"), table=MAIN_TABLE, oif=vrf.index,
                           encap=seg6local_end_dt46(vrf.vrf_table))


def decap_table(route: RouteMsg) -> int | None:
    """The VRF table an End.DT46 route decapsulates into; None for any other route."""
    if route.encap_type != LWTUNNEL_ENCAP_SEG6_LOCAL or route.encap is None:
        return None
    attrs = parse_attrs(route.encap)
    if SEG6_LOCAL_ACTION not in attrs or SEG6_LOCAL_VRFTABLE not in attrs:
        return None
    if as_u32(attrs[SEG6_LOCAL_ACTION]) != SEG6_LOCAL_ACTION_END_DT46:
        return None
    return as_u32(attrs[SEG6_LOCAL_VRFTABLE])


def decap_routes(rtnl: Rtnl) -> dict[str, int]:
    """Every End.DT46 route of the main table: {SID: VRF table} (for CHECK and doctor)."""
    found: dict[str, int] = {}
    for route in rtnl.routes(socket.AF_INET6, table=MAIN_TABLE):
        table = decap_table(route)
        if table is not None and route.dst is not None and route.dst_len == 128:
            found[route.dst] = table
    return found


def decap_differences(rtnl: Rtnl, vpc: str, sid: str) -> list[str]:
    """What CHECK finds wrong with the VPC's SID decapsulation."""
    vrf = links.find(rtnl, naming.vrf_name(vpc))
    table = rtnl.get_link(index=vrf.index).vrf_table if vrf is not None else None
    found = decap_routes(rtnl).get(str(ipaddress.ip_address(sid)))
    if found is None:
        return [f"SRv6 SID {sid} has no End.DT46 route (nothing answers it on this node)"]
    if found != table:
        return [f"SRv6 SID {sid} decapsulates into table {found}, VPC {vpc!r}'s VRF has {table}"]
    return []


def end_dt46_supported(rtnl: Rtnl) -> bool:
    """True when the kernel can install End.DT46 into a VRF (probed with a throwaway VRF and
    route; `net.vrf.strict_mode` is left as it was)."""
    probe = f"vpasrv6{os.getpid() % 10**6}"
    try:
        rtnl.new_vrf(probe, PROBE_TABLE)
    except NetlinkError:
        return False
    try:
        strict_before = get_sysctl(STRICT_MODE)
        set_sysctl(STRICT_MODE, "1")
        try:
            index = rtnl.get_link(name=probe).index
            rtnl.set_link(index, up=True)  # a route through a down device is refused
            rtnl.replace_route(ipaddress.ip_network(PROBE_SID), table=MAIN_TABLE, oif=index,
                               encap=seg6local_end_dt46(PROBE_TABLE))
        finally:
            set_sysctl(STRICT_MODE, strict_before)
        return True
    except (NetlinkError, CniError):
        return False
    finally:
        links.ignore_missing(lambda: rtnl.del_link(name=probe))
