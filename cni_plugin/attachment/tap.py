"""A tap attachment (SPEC §5): a persistent host tap G…H for a VM, in the VPC's table; the
result has the tap alone (empty sandbox)."""

from __future__ import annotations

from dataclasses import dataclass

from cni_plugin.attachment.host_side import (
    claim_host_link,
    require_link,
    set_up_host_side,
    undo_link,
)
from cni_plugin.attachment.new_links import NewLinks
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.rollback import Rollback
from cni_plugin.kernel import isolation, links
from cni_plugin.kernel.links import Link
from cni_plugin.kernel.rtnl import Rtnl
from cni_plugin.kernel.tap import create_tap
from netconf.result import Interface, Result


class TapLinks(NewLinks):
    """A host tap G…H for a VM to make, in the VPC's table."""

    def create(self, rollback: Rollback, vpc_table: isolation.VpcTable,
               mtu: int | None) -> CreatedTap:
        """Make the tap with its owner mark and MTU."""
        rtnl, name, owner = self.host_rtnl, self.name, self.owner
        options = self.options.tap
        claim_host_link(rtnl, name, owner)
        create_tap(name, owner=options.owner, group=options.group,
                   multi_queue=options.multi_queue, vnet_hdr=options.vnet_hdr)
        link = require_link(links.find(rtnl, name), name)
        link = links.configure(rtnl, link, alias=owner.alias, mtu=mtu)
        rollback.created(f"tap {name}", undo_link(name, owner))
        if self.options.mac:  # the `mac` capability, on the VM's link as the `tap` plugin sets it
            links.set_mac(rtnl, link, self.options.mac)
            link = require_link(links.by_index(rtnl, link.index), name)
        return CreatedTap(rtnl, vpc_table, link, mtu)


@dataclass(frozen=True)
class CreatedTap:
    """A tap `TapLinks.create` made: what `configure` gives its gateways."""

    host_rtnl: Rtnl
    vpc_table: isolation.VpcTable
    host_link: Link  # the tap
    mtu: int | None

    def configure(self, addressing: Addressing) -> Result:
        """Gateways and routes on the tap; the result has the tap alone (IPs at index 0)."""
        link = set_up_host_side(self.host_rtnl, self.host_link, self.vpc_table, addressing,
                                workload_mac=None, tap=True)
        return Result(
            interfaces=[Interface(name=link.name, mac=link.mac, mtu=self.mtu,
                                  sandbox="")],
            ips=addressing.result_ips(interface=0),
            routes=addressing.result_routes(),
        )
