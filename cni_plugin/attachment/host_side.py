"""What either kind of attachment makes on the host side (SPEC §5): the host link G…H claimed,
marked with its owner and undone by rollback; then the host side configured: the VRF master or
device group, sysctls, gateways, routes in the VPC's table and neighbours."""

from __future__ import annotations

import ipaddress

from cni_plugin.attachment.node import host_netlink
from cni_plugin.core.addressing import Addressing, IPInterface
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Undo
from cni_plugin.kernel import addresses, isolation, links, sysctl
from cni_plugin.kernel.addresses import RouteSpec
from cni_plugin.kernel.links import Link, Owner
from cni_plugin.kernel.rtnl import Rtnl
from netconf.errors import INTERFACE_CONFLICT, TRY_AGAIN_LATER, CniError

TAP_IPV4_GATEWAY_PREFIX = 25


def claim_host_link(rtnl: Rtnl, name: str, owner: Owner) -> None:
    """Make room for our host link name: remove owner's leftover, refuse anyone else's."""
    existing = links.find(rtnl, name)
    if existing is None:
        return
    found = existing.owner
    if found == owner:
        links.delete(rtnl, existing)  # a repeated ADD rebuilds from scratch, converging
    elif found is not None:
        raise CniError(TRY_AGAIN_LATER, f"attachment {name!r} is in use by container "
                       f"{found.container_id!r} (interface {found.ifname!r})",
                       "a DEL for that container must run first")
    else:
        raise CniError(INTERFACE_CONFLICT, f"link {name!r} exists and was not created by "
                       "vpc-attach", f"kind {existing.kind!r}; remove it or pick another "
                       "vpcattachment")


def undo_link(name: str, owner: Owner) -> Undo:
    """Rollback of a host link: delete it if it still carries owner's mark."""
    def undo(deadline: Deadline) -> None:
        with host_netlink(deadline) as rtnl:
            link = links.find(rtnl, name)
            if link is not None and link.owner == owner:
                links.delete(rtnl, link)
    return undo


def require_link(link: Link | None, name: str) -> Link:
    """The link just made or found; code 11 if it vanished meanwhile."""
    if link is None:
        raise CniError(TRY_AGAIN_LATER, f"link {name!r} disappeared while being configured")
    return link


def set_up_host_side(rtnl: Rtnl, link: Link, vpc_table: isolation.VpcTable,
                     addressing: Addressing, workload_mac: str | None, *, tap: bool) -> Link:
    """Gateways, routes in the VPC table, neighbours, sysctls, isolation, link up."""
    if vpc_table.vrf_index is not None:
        link = links.configure(rtnl, link, master=vpc_table.vrf_index)
    elif vpc_table.group is not None:  # the mark that selects the VPC's table (table mode)
        link = links.configure(rtnl, link, group=vpc_table.group)
    for key, value in sysctl.host_side_sysctls(link.name, 4 in addressing.versions,
                                               6 in addressing.versions).items():
        sysctl.set_sysctl(key, value)
    link = links.configure(rtnl, link, up=True)
    for version, gateway in sorted(addressing.gateways.items()):
        if tap and version == 4:
            addresses.add_address(rtnl, link.index, link.name, ipaddress.ip_interface(
                f"{gateway}/{TAP_IPV4_GATEWAY_PREFIX}"), addresses.IFA_F_NOPREFIXROUTE)
        else:
            addresses.add_address(rtnl, link.index, link.name,
                                  ipaddress.ip_interface(f"{gateway}/{gateway.max_prefixlen}"))
    for workload in addressing.workload:
        addresses.add_route(rtnl, host_route(workload, link.index, vpc_table.table), link.name)
        if workload_mac:
            addresses.add_permanent_neighbour(rtnl, link.index, link.name, workload.ip,
                                              workload_mac)
    return link


def host_route(workload: IPInterface, oif: int, table: int) -> RouteSpec:
    """The route to one workload address through its host link in the VPC table."""
    return RouteSpec(dst=ipaddress.ip_network(f"{workload.ip}/{workload.max_prefixlen}"),
                     oif=oif, table=table)
