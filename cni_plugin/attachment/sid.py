"""The VPC's SID answered on this node (SPEC §15): End.DT46 into the VPC's VRF in the kernel
and, where galactic's eBPF datapath is pinned, the attachment registered in it (removed by DEL
and GC); what CHECK finds wrong with either."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cni_plugin.attachment import segmentation
from cni_plugin.attachment.node import host_lock, host_netlink
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.core import naming
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.galactic import layout, pins, record, registration, removal
from cni_plugin.kernel import isolation, links, srv6
from cni_plugin.kernel.links import Link, Owner
from cni_plugin.kernel.rtnl import Rtnl
from netconf.host import NodeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VpcSid:
    """The SID this node publishes for the VPC, and the fields it is made of."""

    sid: str
    locator: str
    node_id: int
    vrf_id: int


def galactic_datapath(node: NodeSettings) -> bool:
    """Whether galactic's datapath is pinned on this node (its pin directory)."""
    return pins.present(node.galactic.pin_dir)


def answer_sid(attachment: AttachmentRef, host_link: Link, table: int, vpc_sid: VpcSid,
               addressing: Addressing, rollback: Rollback, *, lock_dir: str,
               node: NodeSettings, deadline: Deadline) -> None:
    """The node answers the VPC's SID before it is announced: where galactic's datapath is
    pinned, the attachment registered in it (undone by the rollback), a veth's Pod side
    segmenting before `usid_egress` sees a packet (`galacticOffloads` off); elsewhere
    End.DT46 into the VPC's VRF in the kernel (shared per-VPC state; never undone: it goes
    with the VRF)."""
    settings = node.galactic
    with host_lock(lock_dir, deadline), host_netlink(deadline) as rtnl, \
            pins.opened(settings.pin_dir) as datapath:
        if datapath is None:
            srv6.ensure_decap(rtnl, attachment.vpc, vpc_sid.sid)
            return
        # No kernel End.DT46 route here: usid_ingress claims every packet to the node's
        # locator before routing, so it would serve nothing (docs/architecture.md).
        if attachment.kind == "veth" and not settings.offloads:
            segmentation.turn_off(attachment.netns, attachment.ifname, deadline)
        registration.register(
            datapath, rtnl, registration.Registration(
                network=attachment.network, container_id=attachment.container_id,
                ifname=attachment.ifname, host_link=host_link.name,
                host_ifindex=host_link.index,
                egress_kind=_egress_kind(rtnl, attachment.vpc,
                                         tap=attachment.kind == "tap"),
                locator=vpc_sid.locator, node_id=vpc_sid.node_id, argument=vpc_sid.vrf_id,
                table_id=table, prefixes=addressing.advertised(host_only=False),
                nat66_shard_sids=settings.nat66_shard_sids,
                pod_netns=attachment.netns if attachment.kind == "veth" else "",
                filter_priority=_filter_priority(attachment)),
            rollback, lock_dir, settings.underlay_interfaces,
            lambda undo_deadline: host_lock(lock_dir, undo_deadline))


def _filter_priority(attachment: AttachmentRef) -> int:
    """usid_egress's priority on the host link: galactic's own on a veth (the Pod's netns
    filters it), after the policy's tc filters on a tap (cni_plugin/policy/tc.py)."""
    return layout.TAP_EGRESS_FILTER_PRIORITY if attachment.kind == "tap" \
        else layout.EGRESS_FILTER_PRIORITY


def _egress_kind(rtnl: Rtnl, vpc: str, *, tap: bool) -> int:
    """How galactic hands a decapsulated packet to the VPC's workloads (one vrf_table row per
    VPC): a plain redirect once a tap of the VPC is on the node (it reaches veth Pods too);
    into the Pod's netns directly while all are veth (galactic-bgp takes the last ADD's kind,
    which breaks a VPC that has both)."""
    if tap:
        return layout.EGRESS_KIND_TAP
    taps = (link for link in links.all_links(rtnl)
            if naming.is_host_link_of(link.name, vpc) and link.kind == "tun")
    return layout.EGRESS_KIND_TAP if any(taps) else layout.EGRESS_KIND_VETH


def unregister_datapath(owner: Owner, *, lock_dir: str, node: NodeSettings,
                        deadline: Deadline) -> None:
    """DEL: the rows owner's attachment registered in galactic's datapath, if any."""
    settings = node.galactic
    with host_lock(lock_dir, deadline):
        removal.unregister(settings.pin_dir, lock_dir, owner.container_id, owner.ifname)


def collect_registrations(network: str, valid: set[tuple[str, str]], *, lock_dir: str,
                          node: NodeSettings, deadline: Deadline) -> list[str]:
    """GC: the rows of the network's attachments the runtime no longer runs; their
    (containerID/ifname)."""
    settings = node.galactic
    collected = []
    with host_lock(lock_dir, deadline):
        for container_id, ifname in list(record.records_of(lock_dir, network)):
            if (container_id, ifname) in valid:
                continue
            removal.unregister(settings.pin_dir, lock_dir, container_id, ifname)
            collected.append(f"{container_id}/{ifname}")
        with host_netlink(deadline) as rtnl:
            live = {link.index for link in rtnl.links()}
            orphans = removal.collect_orphans(settings.pin_dir, live)
        if orphans:
            collected.append(f"{orphans} row(s) of links that are gone")
    return collected


def sid_differences(attachment: AttachmentRef, vpc_sid: VpcSid, addressing: Addressing, *,
                    node: NodeSettings, deadline: Deadline) -> list[str]:
    """What CHECK finds wrong with the answer to the VPC's SID: where galactic's datapath is
    pinned, the attachment's registration in it (and its Pod side's offloads); elsewhere its
    decapsulation in the kernel."""
    settings = node.galactic
    with host_netlink(deadline) as rtnl, pins.opened(settings.pin_dir) as datapath:
        if datapath is None:
            return srv6.decap_differences(rtnl, attachment.vpc, vpc_sid.sid)
        link = links.find(rtnl, attachment.host_link)
        table = isolation.find_vpc_table(rtnl, attachment.vpc, "vrf")
        if link is None or table is None:
            return []  # reported already (the link, the VRF)
        diffs = []
        if attachment.kind == "veth" and not settings.offloads and attachment.netns:
            diffs += segmentation.difference(attachment.netns, attachment.ifname, deadline)
        return diffs + registration.differences(datapath, rtnl, registration.Registration(
            network=attachment.network, container_id=attachment.container_id,
            ifname=attachment.ifname, host_link=link.name, host_ifindex=link.index,
            egress_kind=layout.EGRESS_KIND_VETH, locator=vpc_sid.locator,
            node_id=vpc_sid.node_id, argument=vpc_sid.vrf_id, table_id=table,
            prefixes=addressing.advertised(host_only=False),
            filter_priority=_filter_priority(attachment)))
