"""What the links of either kind are made with and in (SPEC §5): the stanza's and runtimeConfig's
options (`LinkOptions`), the VPC's table or VRF, and the MTU: the stanza's, else what the SRv6
encapsulation leaves where the node's packets leave encapsulated (`link_mtu`). `VethLinks` and
`TapLinks` are `NewLinks`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cni_plugin.attachment.node import ensure_vpc_table
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.core.deadline import Deadline
from cni_plugin.galactic import underlay
from cni_plugin.kernel import isolation
from cni_plugin.kernel.rtnl import Rtnl
from netconf.config import TapOptions
from netconf.host import NodeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkOptions:
    """What the stanza and runtimeConfig say an attachment's links are made with."""

    mode: str  # the VPC's isolation: vrf or table
    mtu: int | None  # the stanza's (None: what `link_mtu` leaves)
    mac: str | None  # runtimeConfig's, for a veth's pod end
    tap: TapOptions  # a tap's owner, group, queues and vnet header


class NewLinks:
    """What the links of either kind are made in: the VPC's table, at an MTU, with the host
    link's name and the owner mark they carry."""

    def __init__(self, attachment: AttachmentRef, options: LinkOptions, host_rtnl: Rtnl, *,
                 lock_dir: str, node: NodeSettings, deadline: Deadline) -> None:
        self.attachment = attachment
        self.options = options
        self.host_rtnl = host_rtnl
        self.lock_dir = lock_dir
        self.node = node
        self.deadline = deadline
        self.name = attachment.host_link  # G…H
        self.owner = attachment.owner

    def ensure_vpc_table(self, *, keeps_table: bool) -> isolation.VpcTable:
        """The VPC's VRF or table, created if missing (kernel, under the host lock)."""
        return ensure_vpc_table(self.host_rtnl, self.attachment.vpc, self.options.mode,
                                lock_dir=self.lock_dir, node=self.node,
                                deadline=self.deadline, keeps_table=keeps_table)

    def mtu(self, *, encapsulated: bool) -> int | None:
        """The MTU to make the links with (`link_mtu`)."""
        return link_mtu(self.host_rtnl, self.node, self.options.mtu, self.name,
                        encapsulated=encapsulated)


def link_mtu(rtnl: Rtnl, node: NodeSettings, configured: int | None, link_name: str,
             *, encapsulated: bool) -> int | None:
    """The MTU of the links ADD makes: the stanza's (configured); else, where the node's
    packets leave encapsulated (galactic's datapath and a router with SIDs), the underlay's MTU
    less the 40-byte outer header, since galactic's usid_egress drops what no longer fits."""
    if not encapsulated:
        return configured
    settings = node.galactic
    room = underlay.workload_mtu(underlay.underlay_links(rtnl, settings.underlay_interfaces),
                                 settings.underlay_mtu)
    if room is None or configured is None:
        return room if configured is None else configured
    if configured > room:
        log.warning("mtu %d of %s leaves no room for the 40-byte SRv6 encapsulation (the "
                    "underlay carries %d): larger packets to other nodes are dropped",
                    configured, link_name, room)
    return configured
