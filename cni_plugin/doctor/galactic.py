"""`vpc-attach doctor`: which datapath answers this node's SIDs, and whether the attachments
registered in galactic's datapath still are (SPEC §15)."""

from __future__ import annotations

from cni_plugin.attachment import segmentation
from cni_plugin.core.deadline import Deadline
from cni_plugin.doctor.node import FAIL, NETLINK_SECONDS, OK, WARN, Finding, Node
from cni_plugin.galactic import layout, pins, record
from cni_plugin.galactic.pins import Datapath
from cni_plugin.kernel import ethtool, links, netns, tc
from cni_plugin.kernel.rtnl import NetlinkError, Rtnl
from netconf.errors import CniError
from netconf.host import resolve_galactic_settings
from netconf.node_groups import GalacticSettings

REREGISTER = ("delete and re-create the Pod: its ADD registers it "
              "(docs/operations.md#galactics-datapath)")
INGRESS_FILTER_NAME = "galactic_usid_ingress"  # galactic's attach.filterName
OFFLOADS_DOC = "docs/operations.md#segmentation-offloads-and-gro"


def galactic_datapath(node: Node) -> list[Finding]:
    """galactic's pins (absent: kernel End.DT46 answers; present: their layouts), then each
    attachment's registration."""
    try:
        settings = resolve_galactic_settings(node.environ, node.host_file())
        with pins.opened(settings.pin_dir) as datapath:
            if datapath is None:
                return [Finding("datapath.galactic", OK,
                                f"galactic's datapath is not pinned in {settings.pin_dir}: this "
                                "node answers its SIDs with kernel End.DT46 (kernel.srv6)")]
            with datapath.program():
                pass
            found = [Finding("datapath.galactic", OK,
                             f"galactic's eBPF uSID datapath is pinned in {settings.pin_dir}: "
                             "its maps have the layouts vpc-attach writes, usid_egress is pinned")]
            with netns.open_netlink(None, NETLINK_SECONDS) as rtnl:
                return [*found, *_registrations(node, datapath, rtnl),
                        _pod_offloads(node, settings), _receive_aggregation(rtnl)]
    except CniError as exc:
        return [Finding("datapath.galactic", FAIL, exc.msg, exc.details)]


def _registrations(node: Node, datapath: Datapath, rtnl: Rtnl) -> list[Finding]:
    lock_dir = node.settings.lock_dir
    by_index = {link.index: link for link in rtnl.links()}
    registered: list[str] = []
    broken: list[str] = []
    for path in record.record_paths(lock_dir):
        rows = record.read_record(path) or []
        ifindex_rows = [(k, v) for m, k, v in rows if m is layout.IFINDEX_VRF_TABLE]
        if not ifindex_rows:
            continue
        key, value = ifindex_rows[0]
        ifindex = layout.decode_ifindex_key(key)
        link = by_index.get(ifindex)
        name = link.name if link is not None else f"ifindex {ifindex}"
        problems = [m.name for m, k, v in rows if datapath[m].lookup(k) != v]
        block, argument = layout.decode_ifindex_value(value)
        if datapath[layout.VRF_TABLE].lookup(layout.vrf_key(block, argument)) is None:
            problems.append(layout.VRF_TABLE.name)
        # By name: a restarted galactic-cni pins a new program, the filter keeps running the
        # one it had (on the same pinned maps).
        if link is None or not any(f.name == layout.EGRESS_FILTER_NAME
                                   for f in tc.bpf_filters(rtnl, ifindex)):
            problems.append("usid_egress")
        (broken if problems else registered).append(
            f"{name} ({', '.join(problems)})" if problems else name)
    unregistered = sorted(
        link.name for link in links.all_links(rtnl)
        if link.owner is not None and link.master is not None
        and link.name not in registered and not any(b.startswith(link.name) for b in broken)
        and by_index.get(link.master) is not None and by_index[link.master].kind == "vrf")
    findings = []
    if broken:
        findings.append(Finding("datapath.registered", FAIL, "attachments whose registration "
                                f"is incomplete: {', '.join(broken)}", REREGISTER))
    if unregistered:
        findings.append(Finding("datapath.registered", WARN,
                                "attachments in a VRF not registered in galactic's datapath "
                                f"(added before it was pinned, or their node's router has no "
                                f"SIDs): {', '.join(unregistered)}", REREGISTER))
    if not findings:
        findings.append(Finding("datapath.registered", OK,
                                f"{len(registered)} attachment(s) registered: "
                                f"{', '.join(registered) or 'none yet'}"))
    return findings


def _pod_offloads(node: Node, settings: GalacticSettings) -> Finding:
    """Whether each registered veth's Pod side still segments before `usid_egress`."""
    if settings.offloads:
        return Finding("datapath.offloads", OK, "galacticOffloads is on: the Pods' segmentation "
                       "offloads are left as the kernel made them (galactic encapsulates GSO "
                       "packets itself)")
    checked: list[str] = []
    kept_on: list[str] = []
    for path in record.record_paths(node.settings.lock_dir):
        end = record.pod_end(path)
        if end is None or not netns.exists(end[0]):
            continue
        try:
            found = segmentation.left_on(*end, Deadline(NETLINK_SECONDS))
        except CniError as exc:
            kept_on.append(f"{end[1]} in {end[0]} ({exc.details or exc.msg})")
            continue
        (kept_on if found else checked).append(
            f"{end[1]} in {end[0]} ({', '.join(sorted(found))})" if found else end[1])
    if kept_on:
        return Finding("datapath.offloads", FAIL, "registered Pods whose segmentation offloads "
                       f"are on: {'; '.join(kept_on)}", "galactic's usid_egress drops the GSO "
                       f"packets they make; delete and re-create the Pod ({OFFLOADS_DOC})")
    return Finding("datapath.offloads", OK, f"{len(checked)} registered Pod link(s) segment "
                   "before usid_egress (galacticOffloads off)")


def _receive_aggregation(rtnl: Rtnl) -> Finding:
    """Links carrying galactic's `usid_ingress` with GRO (or LRO): it hands the program one
    packet for many segments, which `usid_ingress` at the compatible commit drops (it checks
    the merged length against the MTU)."""
    carrying = [link for link in rtnl.links() if not link.name.startswith("G") and any(
        f.name == INGRESS_FILTER_NAME for f in tc.bpf_filters(rtnl, link.index))]
    merging: list[str] = []
    try:
        with ethtool.Ethtool(NETLINK_SECONDS) as tool:
            for link in carrying:
                found = ethtool.receive_aggregation_on(tool.features(link.index))
                if found:
                    merging.append(f"{link.name} ({', '.join(sorted(found))})")
    except NetlinkError as exc:
        return Finding("datapath.gro", WARN, f"could not read the offloads of the links "
                       f"usid_ingress is attached to: {exc.message}")
    if merging:
        return Finding("datapath.gro", WARN, "receive aggregation is on where galactic's "
                       f"usid_ingress is attached: {', '.join(merging)}", "usid_ingress drops "
                       "the merged packets of a TCP stream: ethtool -K <link> gro off lro off "
                       f"rx-gro-hw off ({OFFLOADS_DOC})")
    names = ", ".join(link.name for link in carrying) or "no link"
    return Finding("datapath.gro", OK, f"usid_ingress on {names}: no receive aggregation")
