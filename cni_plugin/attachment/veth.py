"""A veth attachment (SPEC §5): host end G…H in the VPC's table, container end CNI_IFNAME in
the pod netns with the workload's addresses and an on-link default route per family."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cni_plugin.attachment.host_side import (
    claim_host_link,
    require_link,
    set_up_host_side,
    undo_link,
)
from cni_plugin.attachment.new_links import LinkOptions, NewLinks
from cni_plugin.attachment.node import host_netlink
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.core import naming
from cni_plugin.core.addressing import DEFAULT_DST, Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback, Undo
from cni_plugin.kernel import addresses, isolation, links, netns
from cni_plugin.kernel.addresses import RouteSpec
from cni_plugin.kernel.links import Link, Owner
from cni_plugin.kernel.rtnl import Rtnl
from netconf.errors import INTERFACE_CONFLICT, CniError
from netconf.host import NodeSettings
from netconf.result import Interface, Result


class VethLinks(NewLinks):
    """A veth pair to make: host end G…H in the VPC's table, container end CNI_IFNAME in the
    pod."""

    def __init__(self, attachment: AttachmentRef, options: LinkOptions, host_rtnl: Rtnl,
                 pod_rtnl: Rtnl, *, lock_dir: str, node: NodeSettings,
                 deadline: Deadline) -> None:
        super().__init__(attachment, options, host_rtnl, lock_dir=lock_dir, node=node,
                         deadline=deadline)
        self.pod_rtnl = pod_rtnl

    def create(self, rollback: Rollback, vpc_table: isolation.VpcTable,
               mtu: int | None) -> CreatedVeth:
        """Make the pair, name both ends with their owner mark and bring the pod end up."""
        attachment, host_rtnl, pod_rtnl = self.attachment, self.host_rtnl, self.pod_rtnl
        name, owner, ifname, pod_netns = self.name, self.owner, attachment.ifname, attachment.netns
        claim_pod_ifname(pod_rtnl, ifname, pod_netns, owner)
        claim_host_link(host_rtnl, name, owner)
        guest = naming.guest_link_name(attachment.vpc, attachment.vpcattachment)
        stale = links.find(pod_rtnl, guest)
        if stale is not None:  # a killed ADD's half-made pair: the G…G name is ours alone
            links.delete(pod_rtnl, stale)
        # The host end starts under a temporary name and becomes G…H together with its owner
        # mark in one request, so a G…H without its owner never exists, even if we are killed.
        temporary = f"vpa{secrets.token_hex(5)}"
        with netns.opened(pod_netns) as fd:
            links.create_veth(host_rtnl, temporary, guest, fd, mtu)
        rollback.created(f"veth {temporary}", _undo_temporary(temporary))
        fresh = require_link(links.find(host_rtnl, temporary), temporary)
        host_link = links.configure(host_rtnl, fresh, name=name, alias=owner.alias)
        rollback.created(f"veth {name}", undo_link(name, owner))
        pod_link = require_link(links.find(pod_rtnl, guest), guest)
        mac = self.options.mac  # the `mac` capability: runtimeConfig, args.cni or CNI_ARGS
        if mac:
            links.set_mac(pod_rtnl, pod_link, mac)
        pod_link = links.configure(pod_rtnl, pod_link, name=ifname, alias=owner.alias, up=True)
        return CreatedVeth(ifname, pod_netns, host_rtnl, pod_rtnl, vpc_table, host_link,
                           pod_link, mac, mtu)


@dataclass(frozen=True)
class CreatedVeth:
    """A veth pair `VethLinks.create` made: what `configure` gives addresses to."""

    ifname: str  # CNI_IFNAME, the pod end's name
    netns: str  # CNI_NETNS, the pod end's
    host_rtnl: Rtnl
    pod_rtnl: Rtnl
    vpc_table: isolation.VpcTable
    host_link: Link
    pod_link: Link
    mac: str | None  # the requested one, set on the pod end
    mtu: int | None  # of both ends (None: the kernel's default)

    def configure(self, addressing: Addressing) -> Result:
        """Addresses and routes on both ends; the kernel part of the result."""
        ifname, pod_rtnl, pod_link = self.ifname, self.pod_rtnl, self.pod_link
        for workload in addressing.workload:
            # No connected route: every destination, even in the same prefix, goes via the
            # gateway and so through the VPC table (other Pods are not on this link).
            addresses.add_address(pod_rtnl, pod_link.index, ifname, workload,
                                  addresses.IFA_F_NOPREFIXROUTE)
        for route in pod_routes(addressing, pod_link.index):
            addresses.add_route(pod_rtnl, route, ifname)
        if self.mac:  # the MAC as the kernel stored it
            pod_link = require_link(links.by_index(pod_rtnl, pod_link.index), ifname)
        host_link = set_up_host_side(self.host_rtnl, self.host_link, self.vpc_table,
                                     addressing, pod_link.mac, tap=False)
        mtu = self.mtu
        return Result(
            interfaces=[
                Interface(name=host_link.name, mac=host_link.mac, mtu=mtu),
                Interface(name=pod_link.name, mac=pod_link.mac, mtu=mtu, sandbox=self.netns),
            ],
            ips=addressing.result_ips(interface=1),
            routes=addressing.result_routes(),
        )


def claim_pod_ifname(pod_rtnl: Rtnl, ifname: str, netns_path: str, owner: Owner) -> None:
    """CNI_IFNAME must be free in the pod netns, or be owner's leftover (then removed)."""
    existing = links.find(pod_rtnl, ifname)
    if existing is None:
        return
    if existing.owner == owner:
        links.delete(pod_rtnl, existing)
        return
    raise CniError(INTERFACE_CONFLICT, f"interface {ifname!r} already exists in netns "
                   f"{netns_path!r}", "it was not created by vpc-attach for this container")


def pod_routes(addressing: Addressing, oif: int) -> list[RouteSpec]:
    """Inside the pod: an on-link default route per version via its gateway."""
    return [RouteSpec(dst=DEFAULT_DST[v], oif=oif, gateway=addressing.gateways[v], onlink=True)
            for v in sorted(addressing.versions)]


def _undo_temporary(name: str) -> Undo:
    def undo(deadline: Deadline) -> None:
        with host_netlink(deadline) as rtnl:
            link = links.find(rtnl, name)
            if link is not None:  # still unnamed: nobody else can own it
                links.delete(rtnl, link)
    return undo
