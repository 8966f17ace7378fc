"""`vpc-attach doctor`: the kernel features the networks found need (VRF, /dev/net/tun, SRv6
decapsulation), and the host protection table."""

from __future__ import annotations

import os

from cni_plugin.doctor.node import FAIL, NETLINK_SECONDS, OK, TUN_DEVICE, WARN, Finding, Node
from cni_plugin.kernel import hostfilter, isolation, netns, srv6
from netconf.errors import CniError


def kernel(node: Node) -> list[Finding]:
    """VRF devices and /dev/net/tun, failing only when a network found needs them."""
    needs_vrf = [conf.name for _, conf in node.networks
                 if conf.attachment != "existing" and conf.isolation == "vrf"]
    needs_tun = [conf.name for _, conf in node.networks if conf.attachment == "tap"]
    findings = []
    try:
        with netns.open_netlink(None, NETLINK_SECONDS) as rtnl:
            has_vrf = isolation.vrf_supported(rtnl)
    except (OSError, CniError) as exc:
        findings.append(Finding("kernel.vrf", FAIL, f"cannot ask the kernel: {exc}",
                                "run doctor as root in the host network namespace"))
    else:
        if has_vrf:
            findings.append(Finding("kernel.vrf", OK, "VRF devices can be created"))
            findings.append(srv6_decap())
        else:
            findings.append(Finding(
                "kernel.vrf", FAIL if needs_vrf else WARN,
                "this kernel has no VRF device type" + (
                    f"; networks {', '.join(map(repr, needs_vrf))} use isolation 'vrf'"
                    if needs_vrf else "; networks must use \"isolation\": \"table\""),
                "modprobe vrf (CONFIG_NET_VRF), or set \"isolation\": \"table\" in the network"))
    try:
        fd = os.open(TUN_DEVICE, os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
        findings.append(Finding("kernel.tun", OK, f"{TUN_DEVICE} opens"))
    except OSError as exc:
        findings.append(Finding(
            "kernel.tun", FAIL if needs_tun else WARN,
            f"cannot open {TUN_DEVICE}: {exc.strerror or exc}" + (
                f"; tap networks {', '.join(map(repr, needs_tun))} need it" if needs_tun else ""),
            "modprobe tun; mknod /dev/net/tun c 10 200"))
    return findings


def host_protection(node: Node) -> list[Finding]:
    """The `inet vpc_attach` table and its mark rule (SPEC §14), and what it has dropped."""
    fix = "start the agent, or run `vpc-attach install` (it writes the table)"
    try:
        found = hostfilter.state()
    except CniError as exc:
        return [Finding("datapath.protection", FAIL, f"cannot read nftables: {exc.msg}", fix)]
    if not found.table:  # nothing attached yet, or removed: the next ADD writes it
        return [Finding("datapath.protection", WARN,
                        f"nftables table {hostfilter.FAMILY} {hostfilter.TABLE} is missing; "
                        "the next ADD writes it", fix)]
    if not found.mark_rule:  # table-mode VPCs route nothing until it is back
        return [Finding("datapath.protection", FAIL,
                        f"{hostfilter.FAMILY} {hostfilter.TABLE} lacks its mark rule (chain "
                        f"{hostfilter.MARK_CHAIN}): table-mode Pods are cut off", fix)]
    findings = [Finding("datapath.protection", OK,
                        f"nftables table {hostfilter.FAMILY} {hostfilter.TABLE} is in place")]
    try:
        dropped = hostfilter.counters()
    except CniError as exc:
        return [*findings, Finding("datapath.dropped", WARN, f"cannot read counters: {exc.msg}",
                                   "install Debian's nftables package")]
    detail = ", ".join(f"{name} {count}" for name, count in sorted(dropped.items()))
    return [*findings, Finding("datapath.dropped", OK, f"packets dropped: {detail}")]


def srv6_decap() -> Finding:
    """Whether the kernel answers SIDs (End.DT46 into a VRF), and the SIDs it answers now."""
    try:
        with netns.open_netlink(None, NETLINK_SECONDS) as rtnl:
            supported = srv6.end_dt46_supported(rtnl)
            answered = srv6.decap_routes(rtnl)
    except (OSError, CniError) as exc:
        return Finding("kernel.srv6", FAIL, f"cannot ask the kernel: {exc}",
                       "run doctor as root in the host network namespace")
    if not supported:
        return Finding("kernel.srv6", WARN, "this kernel cannot decapsulate SRv6 into a VRF "
                       "(seg6local End.DT46): other nodes' traffic to this node's SIDs is dropped",
                       "a kernel with CONFIG_IPV6_SEG6_LWTUNNEL (Linux 5.14 or later)")
    sids = ", ".join(f"{sid} -> table {table}" for sid, table in sorted(answered.items()))
    return Finding("kernel.srv6", OK, f"End.DT46 works; SIDs answered: {sids or 'none yet'}")
