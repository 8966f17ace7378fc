"""CHECK's differences (SPEC §5): everything ADD made in the kernel for an attachment that no
longer matches prevResult, each named."""

from __future__ import annotations

from cni_plugin.attachment.host_side import host_route
from cni_plugin.attachment.node import host_netlink
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.attachment.veth import pod_routes
from cni_plugin.core import naming
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import addresses, isolation, links, netns
from cni_plugin.kernel.links import Link
from cni_plugin.kernel.rtnl import Rtnl
from netconf.result import Result


def attachment_differences(attachment: AttachmentRef, prev: Result, addressing: Addressing, *,
                           mode: str, mtu: int | None, deadline: Deadline) -> list[str]:
    """Everything ADD is responsible for in the kernel that no longer matches prevResult (and
    the addressing read from it), in isolation mode `vrf` or `table`, at the stanza's mtu."""
    name = attachment.host_link
    diffs: list[str] = []
    with host_netlink(deadline) as rtnl:
        host_link = links.find(rtnl, name)
        if host_link is None:
            return [f"host link {name!r} is missing"]
        if host_link.owner != attachment.owner:
            diffs.append(f"host link {name!r} belongs to {host_link.alias!r}")
        pod_mac: str | None = None
        if attachment.kind == "veth":
            pod_mac, pod_diffs = _pod_differences(attachment.netns, attachment.ifname, prev,
                                                  addressing, mtu, deadline)
            diffs.extend(pod_diffs)
        diffs.extend(_link_differences(host_link, prev, mtu, "host link"))
        diffs.extend(_host_differences(rtnl, attachment.vpc, mode, host_link, addressing,
                                       pod_mac))
    return diffs


def _link_differences(link: Link, prev: Result, mtu: int | None, what: str) -> list[str]:
    diffs: list[str] = []
    recorded = next((i for i in prev.interfaces if i.name == link.name), None)
    if mtu is None and recorded is not None:  # the default ADD chose (the underlay's room)
        mtu = recorded.mtu
    if recorded is None:
        diffs.append(f"{what} {link.name!r} is not in prevResult.interfaces")
    elif recorded.mac and recorded.mac.lower() != link.mac:
        diffs.append(f"{what} {link.name!r} has MAC {link.mac}, prevResult says {recorded.mac}")
    if mtu is not None and link.mtu != mtu:
        diffs.append(f"{what} {link.name!r} has MTU {link.mtu}, config says {mtu}")
    if not link.up:
        diffs.append(f"{what} {link.name!r} is down")
    return diffs


def _pod_differences(pod_netns: str, ifname: str, prev: Result, addressing: Addressing,
                     mtu: int | None, deadline: Deadline) -> tuple[str | None, list[str]]:
    with netns.open_netlink(pod_netns, deadline=deadline) as pod_rtnl:
        pod_link = links.find(pod_rtnl, ifname)
        if pod_link is None:
            return None, [f"interface {ifname!r} is missing in netns {pod_netns!r}"]
        diffs = _link_differences(pod_link, prev, mtu, "interface")
        present = set(addresses.addresses(pod_rtnl, pod_link.index))
        for workload in addressing.workload:
            if workload not in present:
                diffs.append(f"interface {ifname!r} lacks IPv{workload.version} address "
                             f"{workload}")
        for route in pod_routes(addressing, pod_link.index):
            if not addresses.has_route(pod_rtnl, route):
                diffs.append(f"route {route.dst} via {route.gateway} dev {ifname} is missing")
        return pod_link.mac, diffs


def _host_differences(rtnl: Rtnl, vpc: str, mode: str, link: Link, addressing: Addressing,
                      pod_mac: str | None) -> list[str]:
    rules = isolation.all_rules(rtnl) if mode == "table" else None
    table = isolation.find_vpc_table(rtnl, vpc, mode, rules)
    if table is None:
        return [f"VPC {vpc!r} has no routing table ({mode})"]
    diffs: list[str] = []
    if mode == "vrf":
        vrf = links.find(rtnl, naming.vrf_name(vpc))
        if vrf is None or link.master != vrf.index:
            diffs.append(f"host link {link.name!r} is not enslaved to its VRF")
    else:
        if not isolation.has_mark_rules(rtnl, table, rules):
            diffs.append(f"policy rules 'fwmark {isolation.vpc_mark(table):#x}/"
                         f"{isolation.MARK_MASK:#x} lookup {table}' are missing")
        if link.group != isolation.vpc_mark(table):
            diffs.append(f"host link {link.name!r} has device group {link.group:#x}, not its "
                         f"VPC's mark {isolation.vpc_mark(table):#x}")
    present = set(addresses.addresses(rtnl, link.index, link_scope=True))
    for version, gateway in addressing.gateways.items():
        if not any(a.ip == gateway for a in present):
            diffs.append(f"host link {link.name!r} lacks gateway IPv{version} address {gateway}")
    neighbours = addresses.permanent_neighbours(rtnl, link.index)
    for workload in addressing.workload:
        if not addresses.has_route(rtnl, host_route(workload, link.index, table)):
            diffs.append(f"route to {workload.ip} via {link.name} in table {table} is missing")
        if pod_mac and neighbours.get(str(workload.ip)) != pod_mac:
            diffs.append(f"permanent neighbour {workload.ip} -> {pod_mac} on {link.name} is "
                         "missing")
    return diffs
