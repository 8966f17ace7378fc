"""Attachments in the kernel (SPEC §5): veth and tap, built from the kernel primitives.

`open_links` gives ADD a `VethLinks` or `TapLinks`, whose `create` makes the links (each
recorded for rollback) and returns a `CreatedVeth` or `CreatedTap`: only that has `configure`,
which gives them their addresses; `detach` removes only what carries this
container's ownership mark; `differences` lists what CHECK finds changed.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass

from cni_plugin.core import naming
from cni_plugin.core.addressing import DEFAULT_DST, Addressing, IPInterface
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.locks import file_lock
from cni_plugin.core.request import Invocation
from cni_plugin.core.rollback import Rollback, Undo
from cni_plugin.galactic import layout, pins, registration, underlay
from cni_plugin.kernel import (
    addresses,
    hostfilter,
    isolation,
    links,
    netns,
    srv6,
    sysctl,
    tableids,
    tap,
)
from cni_plugin.kernel.addresses import RouteSpec
from cni_plugin.kernel.links import Link, Owner
from cni_plugin.kernel.rtnl import Rtnl
from netconf.errors import INTERFACE_CONFLICT, TRY_AGAIN_LATER, CniError
from netconf.host import DatapathSettings, resolve_datapath_settings, resolve_galactic_settings
from netconf.result import Interface, Result

log = logging.getLogger(__name__)
TAP_IPV4_GATEWAY_PREFIX = 25


@contextmanager
def host_netlink(deadline: Deadline | None = None) -> Iterator[Rtnl]:
    """A netlink socket in the host netns, closed afterwards (each call bounded by deadline)."""
    with netns.open_netlink(None, deadline=deadline) as rtnl:
        yield rtnl


@contextmanager
def pod_netlink(path: str, deadline: Deadline | None = None) -> Iterator[Rtnl]:
    """A netlink socket in the pod netns at path, closed afterwards."""
    with netns.open_netlink(path, deadline=deadline) as rtnl:
        yield rtnl


def vpc_owners(rtnl: Rtnl, vpc: str) -> set[tuple[str, str]]:
    """(containerID, ifname) of every attachment of the VPC on this host: the owners recorded
    on its host links (retired links are renamed, so never counted)."""
    return {(link.owner.container_id, link.owner.ifname) for link in links.all_links(rtnl)
            if link.owner is not None and naming.is_host_link_of(link.name, vpc)}


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


def ensure_vpc_table(rtnl: Rtnl, inv: Invocation, *, keeps_table: bool) -> isolation.VpcTable:
    """The VPC's isolation (shared, created once under the host-wide lock), and the node's host
    protection, installed here if neither the agent nor `vpc-attach install` did.

    `keeps_table`: the VPC publishes a BGPVRFInstance on this node, so its VRF keeps its table
    id until GC forgets it (`tableids`): galactic-router keys the VPC's routes by it."""
    lock_dir = inv.host.lock_dir
    with host_lock(lock_dir, inv.deadline):
        hostfilter.ensure(lambda: resolve_datapath_settings(inv.node_env), inv.deadline)
        kept = tableids.kept(lock_dir)
        if inv.conf.isolation != "vrf":
            return isolation.ensure_table(rtnl, inv.conf.vpc, lambda: set(kept.values()))
        pin_dir = resolve_galactic_settings(inv.node_env).pin_dir
        vpc_table = isolation.ensure_vrf(rtnl, inv.conf.vpc, kept,
                                         lambda: registration.route_table_ids(pin_dir))
        vrf = naming.vrf_name(inv.conf.vpc)
        if keeps_table and kept.get(vrf) != vpc_table.table:
            tableids.keep(lock_dir, vrf, vpc_table.table)
        return vpc_table


def forget_kept_table(inv: Invocation) -> bool:
    """GC, once the VPC's BGPVRFInstance on this node is gone: its table id is free again
    unless its VRF still exists (then the next GC decides); whether it was forgotten."""
    with host_lock(inv.host.lock_dir, inv.deadline), host_netlink(inv.deadline) as rtnl:
        vrf = naming.vrf_name(inv.conf.vpc)
        if links.find(rtnl, vrf) is not None:
            return False
        return tableids.forget(inv.host.lock_dir, vrf)


def set_up_node(settings: DatapathSettings, lock_dir: str, timeout: float) -> list[str]:
    """Node set-up (agent start, `vpc-attach install`) under the host lock: host protection
    written afresh, attachments of earlier versions adopted; the links adopted."""
    with file_lock(_host_lock_path(lock_dir), timeout):
        hostfilter.install(settings)
        with host_netlink() as rtnl:
            return isolation.adopt_legacy(rtnl)


def _vpc_lock_path(inv: Invocation) -> str:
    """Held shared by every ADD of the VPC, exclusively by whoever removes its state."""
    return inv.lock_path(naming.vrf_name(inv.conf.vpc))


def release_unused_vpc(inv: Invocation) -> int | None:
    """The VPC's per-node state removed when no host link of it is left and no ADD of it runs
    (DEL, GC); the table released, if any."""
    with ExitStack() as stack:
        try:
            stack.enter_context(file_lock(_vpc_lock_path(inv), 0.0))
        except CniError:
            return None  # an ADD of the VPC is running: the state is about to be used
        stack.enter_context(host_lock(inv.host.lock_dir, inv.deadline))
        with host_netlink(inv.deadline) as rtnl:
            table = isolation.release(rtnl, inv.conf.vpc)
        if table is not None and inv.conf.isolation == "vrf":  # its SID's rows go with it
            settings = resolve_galactic_settings(inv.node_env)
            registration.release_vpc(settings.pin_dir, table, settings.nat66_shard_sids)
        return table
    return None


@dataclass(frozen=True)
class VpcSid:
    """The SID this node publishes for the VPC, and the fields it is made of."""

    sid: str
    locator: str
    node_id: int
    vrf_id: int


def galactic_datapath(node_env: Mapping[str, str]) -> bool:
    """Whether galactic's datapath is pinned on this node (its pin directory)."""
    return pins.present(resolve_galactic_settings(node_env).pin_dir)


def link_mtu(rtnl: Rtnl, node_env: Mapping[str, str], configured: int | None, link_name: str,
             *, encapsulated: bool) -> int | None:
    """The MTU of the links ADD makes: the stanza's (configured); else, where the node's
    packets leave encapsulated (galactic's datapath and a router with SIDs), the underlay's MTU
    less the 40-byte outer header, since galactic's usid_egress drops what no longer fits."""
    if not encapsulated:
        return configured
    settings = resolve_galactic_settings(node_env)
    room = underlay.workload_mtu(underlay.underlay_links(rtnl, settings.underlay_interfaces),
                                 settings.underlay_mtu)
    if room is None or configured is None:
        return room if configured is None else configured
    if configured > room:
        log.warning("mtu %d of %s leaves no room for the 40-byte SRv6 encapsulation (the "
                    "underlay carries %d): larger packets to other nodes are dropped",
                    configured, link_name, room)
    return configured


def answer_sid(inv: Invocation, host_link: Link, table: int, vpc_sid: VpcSid,
               addressing: Addressing, rollback: Rollback) -> None:
    """The node answers the VPC's SID before it is announced: End.DT46 into the VPC's VRF in
    the kernel (shared per-VPC state; never undone: it goes with the VRF), and where galactic's
    datapath is pinned, the attachment registered in it (undone by the rollback)."""
    settings = resolve_galactic_settings(inv.node_env)
    with host_lock(inv.host.lock_dir, inv.deadline), host_netlink(inv.deadline) as rtnl:
        srv6.ensure_decap(rtnl, inv.conf.vpc, vpc_sid.sid)
        with pins.opened(settings.pin_dir) as datapath:
            if datapath is None:
                return
            registration.register(
                datapath, rtnl, registration.Registration(
                    network=inv.conf.name, container_id=inv.env.container_id,
                    ifname=inv.env.ifname, host_link=host_link.name,
                    host_ifindex=host_link.index,
                    egress_kind=_egress_kind(rtnl, inv.conf.vpc,
                                             tap=inv.conf.attachment == "tap"),
                    locator=vpc_sid.locator, node_id=vpc_sid.node_id, argument=vpc_sid.vrf_id,
                    table_id=table, prefixes=addressing.advertised(host_only=False),
                    nat66_shard_sids=settings.nat66_shard_sids),
                rollback, inv.host.lock_dir, settings.underlay_interfaces,
                lambda deadline: host_lock(inv.host.lock_dir, deadline))


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


def host_lock(lock_dir: str, deadline: Deadline) -> AbstractContextManager[None]:
    """The node-wide lock of per-VPC and per-node state (code 11 when it is not had in time)."""
    return file_lock(_host_lock_path(lock_dir), deadline.remaining())


def _host_lock_path(lock_dir: str) -> str:
    return os.path.join(lock_dir, "host.lock")


def unregister_datapath(inv: Invocation) -> None:
    """DEL: this attachment's rows in galactic's datapath, if it registered any."""
    settings = resolve_galactic_settings(inv.node_env)
    with host_lock(inv.host.lock_dir, inv.deadline):
        registration.unregister(settings.pin_dir, inv.host.lock_dir, inv.env.container_id,
                                inv.env.ifname)


def collect_registrations(inv: Invocation, valid: set[tuple[str, str]]) -> list[str]:
    """GC: the rows of this network's attachments the runtime no longer runs; their
    (containerID/ifname)."""
    settings = resolve_galactic_settings(inv.node_env)
    collected = []
    with host_lock(inv.host.lock_dir, inv.deadline):
        for container_id, ifname in list(registration.records_of(inv.host.lock_dir,
                                                                 inv.conf.name)):
            if (container_id, ifname) in valid:
                continue
            registration.unregister(settings.pin_dir, inv.host.lock_dir, container_id, ifname)
            collected.append(f"{container_id}/{ifname}")
        with host_netlink(inv.deadline) as rtnl:
            live = {link.index for link in rtnl.links()}
            orphans = registration.collect_orphans(settings.pin_dir, live)
        if orphans:
            collected.append(f"{orphans} row(s) of links that are gone")
    return collected


def sid_differences(inv: Invocation, vpc_sid: VpcSid, addressing: Addressing) -> list[str]:
    """What CHECK finds wrong with the answer to the VPC's SID: its decapsulation in the
    kernel and, where galactic's datapath is pinned, the attachment's registration in it."""
    settings = resolve_galactic_settings(inv.node_env)
    with host_netlink(inv.deadline) as rtnl:
        diffs = srv6.decap_differences(rtnl, inv.conf.vpc, vpc_sid.sid)
        with pins.opened(settings.pin_dir) as datapath:
            link = links.find(rtnl, naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment))
            table = isolation.find_vpc_table(rtnl, inv.conf.vpc, "vrf")
            if datapath is None or link is None or table is None:
                return diffs  # nothing registered to compare, or reported already
            return diffs + registration.differences(datapath, rtnl, registration.Registration(
                network=inv.conf.name, container_id=inv.env.container_id,
                ifname=inv.env.ifname, host_link=link.name, host_ifindex=link.index,
                egress_kind=layout.EGRESS_KIND_VETH, locator=vpc_sid.locator,
                node_id=vpc_sid.node_id, argument=vpc_sid.vrf_id, table_id=table,
                prefixes=addressing.advertised(host_only=False)))


def _undo_temporary(name: str) -> Undo:
    def undo(deadline: Deadline) -> None:
        with host_netlink(deadline) as rtnl:
            link = links.find(rtnl, name)
            if link is not None:  # still unnamed: nobody else can own it
                links.delete(rtnl, link)
    return undo


def _undo_link(name: str, owner: Owner) -> Undo:
    def undo(deadline: Deadline) -> None:
        with host_netlink(deadline) as rtnl:
            link = links.find(rtnl, name)
            if link is not None and link.owner == owner:
                links.delete(rtnl, link)
    return undo


def _setup_host_side(rtnl: Rtnl, link: Link, vpc_table: isolation.VpcTable,
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


def pod_routes(addressing: Addressing, oif: int) -> list[RouteSpec]:
    """Inside the pod: an on-link default route per version via its gateway."""
    return [RouteSpec(dst=DEFAULT_DST[v], oif=oif, gateway=addressing.gateways[v], onlink=True)
            for v in sorted(addressing.versions)]


@contextmanager
def lock(inv: Invocation) -> Iterator[None]:
    """Hold the lock of this attachment's host link, and the VPC's shared (code 11 when the
    deadline runs out)."""
    name = naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment)
    with file_lock(inv.lock_path(name), inv.deadline.remaining()), \
            file_lock(_vpc_lock_path(inv), inv.deadline.remaining(), shared=True):
        yield


class _Links:
    """What the links of either kind are made in: the VPC's table, at an MTU."""

    def __init__(self, inv: Invocation, host_rtnl: Rtnl) -> None:
        self.inv = inv
        self.host_rtnl = host_rtnl

    def ensure_vpc_table(self, *, keeps_table: bool) -> isolation.VpcTable:
        """The VPC's VRF or table, created if missing (kernel, under the host lock)."""
        return ensure_vpc_table(self.host_rtnl, self.inv, keeps_table=keeps_table)

    def mtu(self, *, encapsulated: bool) -> int | None:
        """The MTU to make the links with (`link_mtu`)."""
        inv = self.inv
        return link_mtu(self.host_rtnl, inv.node_env, inv.conf.mtu,
                        naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment),
                        encapsulated=encapsulated)


class VethLinks(_Links):
    """A veth pair to make: host end G…H in the VPC's table, container end CNI_IFNAME in the
    pod."""

    def __init__(self, inv: Invocation, host_rtnl: Rtnl, pod_rtnl: Rtnl) -> None:
        super().__init__(inv, host_rtnl)
        self.pod_rtnl = pod_rtnl

    def create(self, rollback: Rollback, vpc_table: isolation.VpcTable,
               mtu: int | None) -> CreatedVeth:
        """Make the pair, name both ends with their owner mark and bring the pod end up."""
        inv, host_rtnl, pod_rtnl = self.inv, self.host_rtnl, self.pod_rtnl
        owner = Owner(inv.env.container_id, inv.env.ifname)
        name = naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment)
        claim_pod_ifname(pod_rtnl, inv.env.ifname, inv.env.netns, owner)
        claim_host_link(host_rtnl, name, owner)
        guest = naming.guest_link_name(inv.conf.vpc, inv.conf.vpcattachment)
        stale = links.find(pod_rtnl, guest)
        if stale is not None:  # a killed ADD's half-made pair: the G…G name is ours alone
            links.delete(pod_rtnl, stale)
        # The host end starts under a temporary name and becomes G…H together with its owner
        # mark in one request, so a G…H without its owner never exists, even if we are killed.
        temporary = f"vpa{secrets.token_hex(5)}"
        with netns.opened(inv.env.netns) as fd:
            links.create_veth(host_rtnl, temporary, guest, fd, mtu)
        rollback.created(f"veth {temporary}", _undo_temporary(temporary))
        fresh = _require(links.find(host_rtnl, temporary), temporary)
        host_link = links.configure(host_rtnl, fresh, name=name, alias=owner.alias)
        rollback.created(f"veth {name}", _undo_link(name, owner))
        pod_link = _require(links.find(pod_rtnl, guest), guest)
        runtime_mac = inv.runtime_value("mac")
        mac = runtime_mac if isinstance(runtime_mac, str) and runtime_mac else None
        if mac:
            links.set_mac(pod_rtnl, pod_link, mac)
        pod_link = links.configure(pod_rtnl, pod_link, name=inv.env.ifname, alias=owner.alias,
                                   up=True)
        return CreatedVeth(inv.env.ifname, inv.env.netns, host_rtnl, pod_rtnl, vpc_table,
                           host_link, pod_link, mac, mtu)


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
    mac: str | None  # runtimeConfig's, set on the pod end
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
            pod_link = _require(links.by_index(pod_rtnl, pod_link.index), ifname)
        host_link = _setup_host_side(self.host_rtnl, self.host_link, self.vpc_table,
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


class TapLinks(_Links):
    """A host tap G…H for a VM to make, in the VPC's table."""

    def create(self, rollback: Rollback, vpc_table: isolation.VpcTable,
               mtu: int | None) -> CreatedTap:
        """Make the tap with its owner mark and MTU."""
        inv, rtnl = self.inv, self.host_rtnl
        name = naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment)
        owner = Owner(inv.env.container_id, inv.env.ifname)
        options = inv.conf.tap_options
        claim_host_link(rtnl, name, owner)
        tap.create_tap(name, owner=options.owner, group=options.group,
                       multi_queue=options.multi_queue, vnet_hdr=options.vnet_hdr)
        link = _require(links.find(rtnl, name), name)
        link = links.configure(rtnl, link, alias=owner.alias, mtu=mtu)
        rollback.created(f"tap {name}", _undo_link(name, owner))
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
        link = _setup_host_side(self.host_rtnl, self.host_link, self.vpc_table, addressing,
                                workload_mac=None, tap=True)
        return Result(
            interfaces=[Interface(name=link.name, mac=link.mac, mtu=self.mtu,
                                  sandbox="")],
            ips=addressing.result_ips(interface=0),
            routes=addressing.result_routes(),
        )


@contextmanager
def open_links(inv: Invocation) -> Iterator[VethLinks | TapLinks]:
    """The attachment's links to make, with netlink sockets in the host (and pod) netns until
    exit; only what their `create` returns can be configured."""
    with ExitStack() as stack:
        host_rtnl = stack.enter_context(host_netlink(inv.deadline))
        if inv.conf.attachment == "tap":
            yield TapLinks(inv, host_rtnl)
        else:
            yield VethLinks(inv, host_rtnl,
                            stack.enter_context(pod_netlink(inv.env.netns, inv.deadline)))


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


def _require(link: Link | None, name: str) -> Link:
    if link is None:
        raise CniError(TRY_AGAIN_LATER, f"link {name!r} disappeared while being configured")
    return link


# Takes the name of a retired host link and deletes it after the verb answered (the agent's
# reaper); without one, DEL deletes links at once.
RetiredLinks = Callable[[str], None]


def detach(inv: Invocation, delete_later: RetiredLinks | None = None) -> None:
    """Delete this container's host link (veth or tap) and pod interface; others' stay.

    With delete_later the links are retired instead and the host one (taking its veth peer
    along) is deleted after the answer: the kernel's teardown is off the runtime's path.
    """
    owner = Owner(inv.env.container_id, inv.env.ifname)
    retired: str | None = None
    with host_netlink(inv.deadline) as rtnl:
        link = links.find(rtnl, naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment))
        if link is not None and link.owner == owner:
            if delete_later is not None:
                retired = links.retire(rtnl, link)
            else:
                links.delete(rtnl, link)
    if inv.conf.attachment == "veth" and inv.env.netns and netns.exists(inv.env.netns):
        with suppress(netns.NetnsGone), pod_netlink(inv.env.netns, inv.deadline) as pod_rtnl:
            pod_link = links.find(pod_rtnl, inv.env.ifname)
            if pod_link is not None and pod_link.owner == owner:
                if retired is not None:  # the peer of the retired host end: goes with it
                    links.retire(pod_rtnl, pod_link)
                else:
                    links.delete(pod_rtnl, pod_link)
    if retired is not None and delete_later is not None:
        delete_later(retired)


def differences(inv: Invocation, prev: Result, addressing: Addressing) -> list[str]:
    """Everything ADD is responsible for in the kernel that no longer matches prevResult (and
    the addressing read from it)."""
    name = naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment)
    diffs: list[str] = []
    with host_netlink(inv.deadline) as rtnl:
        host_link = links.find(rtnl, name)
        if host_link is None:
            return [f"host link {name!r} is missing"]
        if host_link.owner != Owner(inv.env.container_id, inv.env.ifname):
            diffs.append(f"host link {name!r} belongs to {host_link.alias!r}")
        pod_mac: str | None = None
        if inv.conf.attachment == "veth":
            pod_mac, pod_diffs = _pod_differences(inv, prev, addressing)
            diffs.extend(pod_diffs)
        diffs.extend(_link_differences(host_link, prev, inv.conf.mtu, "host link"))
        diffs.extend(_host_differences(rtnl, inv.conf.vpc, inv.conf.isolation, host_link,
                                       addressing, pod_mac))
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


def _pod_differences(inv: Invocation, prev: Result,
                     addressing: Addressing) -> tuple[str | None, list[str]]:
    ifname = inv.env.ifname
    with pod_netlink(inv.env.netns, inv.deadline) as pod_rtnl:
        pod_link = links.find(pod_rtnl, ifname)
        if pod_link is None:
            return None, [f"interface {ifname!r} is missing in netns {inv.env.netns!r}"]
        diffs = _link_differences(pod_link, prev, inv.conf.mtu, "interface")
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
