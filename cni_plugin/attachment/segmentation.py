"""A registered veth hands galactic's `usid_egress` no packet larger than the link's MTU
(SPEC §15): with the node's `galacticOffloads` off (the default), the Pod's side of the veth
has its segmentation offloads off, so the Pod's own stack segments before a packet crosses.
Why: `usid_egress` at the compatible commit grows a GSO packet without
BPF_F_ADJ_ROOM_ENCAP_L3_IPV6, and the underlay drops what it cannot segment
(docs/operations.md#segmentation-offloads-and-gro). A tap's guest decides its own."""

from __future__ import annotations

import socket

from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import ethtool, netns
from cni_plugin.kernel.rtnl import DEFAULT_TIMEOUT, NetlinkError
from netconf.errors import KERNEL_FAILURE, CniError

SETTING = "galacticOffloads"


def _ifindex(ifname: str, pod_netns: str) -> int:
    try:
        return socket.if_nametoindex(ifname)  # in the netns this thread entered
    except OSError:
        raise CniError(KERNEL_FAILURE, f"interface {ifname!r} not found in netns "
                       f"{pod_netns!r}") from None


def turn_off(pod_netns: str, ifname: str, deadline: Deadline) -> None:
    """Turn off every segmentation offload of the Pod's end of the veth; code 100 naming the
    link when the kernel keeps one on."""
    try:
        with netns.entered(pod_netns), ethtool.Ethtool(DEFAULT_TIMEOUT, deadline) as tool:
            left_on = ethtool.turn_off_segmentation_offloads(tool, _ifindex(ifname, pod_netns))
    except NetlinkError as exc:
        raise CniError(KERNEL_FAILURE, f"failed to turn off the segmentation offloads of "
                       f"{ifname!r} in netns {pod_netns!r}", exc.message) from None
    if left_on:
        raise CniError(KERNEL_FAILURE, f"the segmentation offloads {', '.join(sorted(left_on))} "
                       f"of {ifname!r} in netns {pod_netns!r} stay on",
                       f"galactic's usid_egress drops the packets they make; set {SETTING} "
                       "on only where galactic encapsulates GSO packets itself")


def left_on(pod_netns: str, ifname: str, deadline: Deadline) -> frozenset[str]:
    """The segmentation offloads on at the Pod's end of the veth (CHECK, doctor)."""
    try:
        with netns.entered(pod_netns), ethtool.Ethtool(DEFAULT_TIMEOUT, deadline) as tool:
            return ethtool.segmentation_offloads_on(tool.features(_ifindex(ifname, pod_netns)))
    except NetlinkError as exc:
        raise CniError(KERNEL_FAILURE, f"failed to read the offloads of {ifname!r} in netns "
                       f"{pod_netns!r}", exc.message) from None


def difference(pod_netns: str, ifname: str, deadline: Deadline) -> list[str]:
    """CHECK: the Pod's end lost the setting (its segmentation offloads are on again)."""
    found = left_on(pod_netns, ifname, deadline)
    if not found:
        return []
    return [f"{ifname} in netns {pod_netns} has segmentation offloads on "
            f"({', '.join(sorted(found))}): galactic's usid_egress drops the packets they make "
            f"({SETTING} is off on this node)"]
