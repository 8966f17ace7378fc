"""A tap attachment's policy as stateful tc filters on its host link (pure).

A VM's packets reach the node on its tap's TC ingress, where galactic's `usid_egress` sends
those for other nodes out of the underlay before any netfilter hook runs; packets for the VM
leave through the tap's TC egress, which galactic's `usid_ingress` redirects into from the
underlay, again past every netfilter hook (nftables' egress hook skips what TC redirected).
So the tap's own TC hooks are the one place every path of a VM passes
(docs/architecture.md, "Policy inside a VPC"). Connections are tracked there by `act_ct` in the
VPC's own conntrack zone (its table id), so replies pass and two VPCs' equal addresses never
share an entry.

Per hook, in priority order (one flower instance per priority and family):
  ND and router discovery            → pass (always allowed; the node answers them)
  every IP packet                    → conntrack lookup in the VPC's zone
  isolated: new and allowed by rule  → commit, connection mark |= this hook's bit
            new without that bit    → drop
  not isolated: new                  → commit (its replies must find the connection)
Replies and the ICMP errors of allowed connections are established or related: no rule
drops them. Each hook keeps its own bit of the connection mark, so what one VM's egress let
through never counts as another VM's ingress on the same node.
"""

from __future__ import annotations

from collections.abc import Sequence

from cni_plugin.kernel.flower import (
    CT_NEW,
    CT_TRACKED,
    ETH_P_IP,
    ETH_P_IPV6,
    ConnTrack,
    FlowerFilter,
)
from cni_plugin.kernel.tc import TC_H_EGRESS_HOOK, TC_H_INGRESS_HOOK
from cni_plugin.policy.compile import Allow, Compiled, Direction
from cni_plugin.policy.nft import merged_ranges

# Priorities on the tap's hooks: all before galactic's usid_egress, which vpc-attach attaches
# on a tap at galactic/layout.py's TAP_EGRESS_FILTER_PRIORITY.
ND_PRIORITY = 100
LOOKUP_PRIORITY = {ETH_P_IP: 101, ETH_P_IPV6: 102}
ALLOW_PRIORITY = {ETH_P_IP: 103, ETH_P_IPV6: 104}
DROP_PRIORITY = {ETH_P_IP: 105, ETH_P_IPV6: 106}
PRIORITIES = range(ND_PRIORITY, 107)
ND_TYPES = (133, 134, 135, 136, 137)  # router/neighbour solicitation and advertisement, redirect
NEW = (CT_TRACKED | CT_NEW, CT_TRACKED | CT_NEW)
# The tap's ingress carries what the VM sends (its egress policy), its egress what it gets.
HOOKS = {"egress": TC_H_INGRESS_HOOK, "ingress": TC_H_EGRESS_HOOK}
MARK_BITS = {"egress": 0x1, "ingress": 0x2}


def render(compiled: Compiled, zone: int) -> list[FlowerFilter]:
    """Every filter the tap carries for what it enforces (none when nothing is)."""
    if not compiled.enforced:
        return []
    filters: list[FlowerFilter] = []
    for direction, rendered in (("egress", compiled.egress), ("ingress", compiled.ingress)):
        filters.extend(_hook(direction, rendered, zone))
    return sorted(set(filters))


def _hook(direction: str, rendered: Direction, zone: int) -> list[FlowerFilter]:
    hook, bit = HOOKS[direction], MARK_BITS[direction]
    filters = [FlowerFilter(hook, ND_PRIORITY, ETH_P_IPV6, "ok", ip_proto="icmpv6",
                            icmpv6_type=kind) for kind in ND_TYPES]
    for protocol in (ETH_P_IP, ETH_P_IPV6):
        filters.append(FlowerFilter(hook, LOOKUP_PRIORITY[protocol], protocol,
                                    conntrack=ConnTrack(zone)))
        if not rendered.isolated:
            filters.append(FlowerFilter(hook, ALLOW_PRIORITY[protocol], protocol,
                                        conntrack=ConnTrack(zone, commit=True), ct_state=NEW))
            continue
        filters.append(FlowerFilter(hook, DROP_PRIORITY[protocol], protocol, "drop",
                                    ct_state=NEW, ct_mark=(0, bit)))
    if rendered.isolated:
        commit = ConnTrack(zone, commit=True, mark=bit, mark_mask=bit)
        for allow in rendered.allows:
            filters.extend(_allowing(hook, direction, allow, commit))
    return filters


def _allowing(hook: int, direction: str, allow: Allow, commit: ConnTrack) -> list[FlowerFilter]:
    """The filters one allow needs: one per peer network and port range (none when its peers
    are not known yet)."""
    side = "src" if direction == "ingress" else "dst"
    peers: Sequence[str | None] = [None] if allow.peers is None else \
        [str(net) for net in allow.peers]
    filters = []
    for peer in peers:
        protocols = [ETH_P_IP, ETH_P_IPV6] if peer is None else \
            [ETH_P_IPV6 if ":" in peer else ETH_P_IP]
        for protocol in protocols:
            for ip_proto, ports in _ports(allow):
                filters.append(FlowerFilter(
                    hook, ALLOW_PRIORITY[protocol], protocol, conntrack=commit, ct_state=NEW,
                    ip_proto=ip_proto, ports=ports, src=peer if side == "src" else None,
                    dst=peer if side == "dst" else None))
    return filters


def _ports(allow: Allow) -> list[tuple[str | None, tuple[int, int] | None]]:
    """(ip_proto, port range) pairs; (None, None) for every protocol."""
    if allow.ports is None:
        return [(None, None)]
    found: list[tuple[str | None, tuple[int, int] | None]] = []
    for protocol in sorted({r.protocol for r in allow.ports}):
        ranges = [r for r in allow.ports if r.protocol == protocol]
        ip_proto = protocol.lower()
        if any(r.first is None for r in ranges):
            found.append((ip_proto, None))
        else:
            found.extend((ip_proto, span) for span in merged_ranges(ranges))
    return found


def rule_count(filters: Sequence[FlowerFilter]) -> int:
    """How many of them allow something (the rules gauge's count)."""
    return sum(1 for f in filters if f.priority in ALLOW_PRIORITY.values() and
               f.conntrack is not None and f.conntrack.mark_mask)
