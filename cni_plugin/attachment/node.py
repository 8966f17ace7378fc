"""The node's state that attachments share (SPEC §5): the host netns's netlink socket, the
host-wide and per-VPC locks, the VPC's table or VRF (with the table id it keeps), node set-up,
and the VPC's state released once nothing of it is left."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.locks import file_lock, lock_path
from cni_plugin.galactic import removal
from cni_plugin.kernel import hostfilter, isolation, links, netns, tableids
from cni_plugin.kernel.rtnl import Rtnl
from netconf.errors import CniError
from netconf.host import NodeSettings
from netconf.node_groups import DatapathSettings


@contextmanager
def host_netlink(deadline: Deadline | None = None) -> Iterator[Rtnl]:
    """A netlink socket in the host netns, closed afterwards (each call bounded by deadline)."""
    with netns.open_netlink(None, deadline=deadline) as rtnl:
        yield rtnl


def host_lock(lock_dir: str, deadline: Deadline) -> AbstractContextManager[None]:
    """The node-wide lock of per-VPC and per-node state (code 11 when it is not had in time)."""
    return file_lock(_host_lock_path(lock_dir), deadline.remaining())


def _host_lock_path(lock_dir: str) -> str:
    return lock_path(lock_dir, "host")


def _vpc_lock_path(lock_dir: str, vpc: str) -> str:
    """Held shared by every ADD of the VPC, exclusively by whoever removes its state."""
    return lock_path(lock_dir, naming.vrf_name(vpc))


@contextmanager
def lock_attachment(vpc: str, vpcattachment: str, *, lock_dir: str,
                    deadline: Deadline) -> Iterator[None]:
    """Hold the lock of the attachment's host link, and the VPC's shared (code 11 when the
    deadline runs out)."""
    name = naming.host_link_name(vpc, vpcattachment)
    with file_lock(lock_path(lock_dir, name), deadline.remaining()), \
            file_lock(_vpc_lock_path(lock_dir, vpc), deadline.remaining(), shared=True):
        yield


def vpc_owners(rtnl: Rtnl, vpc: str) -> set[tuple[str, str]]:
    """(containerID, ifname) of every attachment of the VPC on this host: the owners recorded
    on its host links (retired links are renamed, so never counted)."""
    return {(link.owner.container_id, link.owner.ifname) for link in links.all_links(rtnl)
            if link.owner is not None and naming.is_host_link_of(link.name, vpc)}


def ensure_vpc_table(rtnl: Rtnl, vpc: str, mode: str, *, lock_dir: str,
                     node: NodeSettings, deadline: Deadline,
                     keeps_table: bool) -> isolation.VpcTable:
    """The VPC's isolation in mode `vrf` or `table` (shared, created once under the host-wide
    lock), and the node's host protection, installed here if neither the agent nor
    `vpc-attach install` did.

    `keeps_table`: the VPC publishes a BGPVRFInstance on this node, so its VRF keeps its table
    id until GC forgets it (`tableids`): galactic-router keys the VPC's routes by it."""
    with host_lock(lock_dir, deadline):
        hostfilter.ensure(lambda: node.datapath, deadline)
        kept = tableids.kept(lock_dir)
        if mode != "vrf":
            return isolation.ensure_table(rtnl, vpc, lambda: set(kept.values()))
        pin_dir = node.galactic.pin_dir
        vpc_table = isolation.ensure_vrf(rtnl, vpc, kept,
                                         lambda: removal.route_table_ids(pin_dir))
        vrf = naming.vrf_name(vpc)
        if keeps_table and kept.get(vrf) != vpc_table.table:
            tableids.keep(lock_dir, vrf, vpc_table.table)
        return vpc_table


def forget_kept_table(vpc: str, *, lock_dir: str, deadline: Deadline) -> bool:
    """GC, once the VPC's BGPVRFInstance on this node is gone: its table id is free again
    unless its VRF still exists (then the next GC decides); whether it was forgotten."""
    with host_lock(lock_dir, deadline), host_netlink(deadline) as rtnl:
        vrf = naming.vrf_name(vpc)
        if links.find(rtnl, vrf) is not None:
            return False
        return tableids.forget(lock_dir, vrf)


def set_up_node(settings: DatapathSettings, lock_dir: str, timeout: float) -> list[str]:
    """Node set-up (agent start, `vpc-attach install`) under the host lock: host protection
    written afresh, attachments of earlier versions adopted; the links adopted."""
    with file_lock(_host_lock_path(lock_dir), timeout):
        hostfilter.install(settings)
        with host_netlink() as rtnl:
            return isolation.adopt_legacy(rtnl)


def release_unused_vpc(vpc: str, mode: str, *, lock_dir: str, node: NodeSettings,
                       deadline: Deadline) -> int | None:
    """The VPC's per-node state (isolation mode `vrf` or `table`) removed when no host link of
    it is left and no ADD of it runs (DEL, GC); the table released, if any."""
    with ExitStack() as stack:
        try:
            stack.enter_context(file_lock(_vpc_lock_path(lock_dir, vpc), 0.0))
        except CniError:
            return None  # an ADD of the VPC is running: the state is about to be used
        stack.enter_context(host_lock(lock_dir, deadline))
        with host_netlink(deadline) as rtnl:
            table = isolation.release(rtnl, vpc)
        if table is not None and mode == "vrf":  # its SID's rows go with it
            settings = node.galactic
            removal.release_vpc(settings.pin_dir, table, settings.nat66_shard_sids)
        return table
    return None
