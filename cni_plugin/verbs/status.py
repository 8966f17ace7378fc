"""STATUS: can ADD be served right now? Code 50 with the reason otherwise."""

from __future__ import annotations

from cni_plugin.attachment.node import host_netlink
from cni_plugin.core.request import Invocation
from cni_plugin.galactic import pins
from cni_plugin.ipam import delegate
from cni_plugin.kernel import isolation, srv6
from cni_plugin.kubevirt import kubevirt_steps
from cni_plugin.publish.status import publishing_status, router_has_sids
from cni_plugin.tenancy import tenancy_status
from cni_plugin.verbs.collaborators import Collaborators
from netconf.errors import INCOMPATIBLE_VERSION, STATUS_NOT_AVAILABLE, CniError
from netconf.versions import GC_STATUS_MIN_VERSION, at_least


def status(inv: Invocation, collaborators: Collaborators) -> None:
    """Return quietly when ADD would work; raise code 50 naming why not."""
    if not at_least(inv.conf.cni_version, GC_STATUS_MIN_VERSION):
        raise CniError(INCOMPATIBLE_VERSION, "config version does not allow STATUS")
    if inv.conf.attachment != "existing" and inv.conf.isolation == "vrf":
        with host_netlink(inv.deadline) as rtnl:
            if not isolation.vrf_supported(rtnl):
                raise CniError(STATUS_NOT_AVAILABLE, "this kernel has no VRF support",
                               "configure \"isolation\": \"table\" or load the vrf module")
    if inv.conf.attachment != "existing" and inv.conf.isolation == "vrf":
        _galactic_status(inv)
    with collaborators.verb_cluster(inv) as cluster:  # one API client for STATUS
        publishing_status(inv, cluster)
        tenancy_status(inv, cluster)
        kubevirt_steps(inv, cluster).api_status()  # claims' permissions, ready targets cut over
        if inv.conf.attachment != "existing" and inv.conf.isolation == "vrf" and \
                router_has_sids(inv, cluster):
            _srv6_status(inv)
        try:
            ipam = delegate.of(inv, cluster)
            if ipam is not None:
                ipam.run("STATUS", inv.stdin, inv.deadline)
        except CniError as exc:
            raise CniError(STATUS_NOT_AVAILABLE, f"IPAM delegate not ready: {exc.msg}",
                           exc.details) from None


def _srv6_status(inv: Invocation) -> None:
    """Code 50 when the kernel cannot answer the SIDs this node's router gives it."""
    with host_netlink(inv.deadline) as rtnl:
        if not srv6.end_dt46_supported(rtnl):
            raise CniError(STATUS_NOT_AVAILABLE, "this kernel cannot answer this node's "
                           "SRv6 SIDs (seg6local End.DT46 into a VRF)",
                           "a kernel with CONFIG_IPV6_SEG6_LWTUNNEL (Linux 5.14 or later)")


def _galactic_status(inv: Invocation) -> None:
    """Where galactic's datapath is pinned, ADD writes into it: code 50 when its layout is not
    the one vpc-attach writes (ADD would fail with 107)."""
    pin_dir = inv.node.galactic.pin_dir
    try:
        with pins.opened(pin_dir):
            pass
    except CniError as exc:
        raise CniError(STATUS_NOT_AVAILABLE, f"galactic's datapath in {pin_dir}: {exc.msg}",
                       exc.details) from None
