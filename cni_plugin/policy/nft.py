"""A veth attachment's policy as an nftables table in its Pod's network namespace (pure).

Every packet into or out of a veth Pod passes its own netns's netfilter, whatever brought it:
the node's forwarding, the kernel's SRv6 decapsulation, or galactic's `usid_ingress`, which
hands packets from other nodes straight into the Pod's netns (`bpf_redirect_peer`) past every
hook of the node's (docs/architecture.md, "Policy inside a VPC"). Each netns has its own
conntrack, so replies are recognised and two VPCs' equal addresses never meet in one table.

One table per attachment, `inet vpc_attach_policy_<ifname>`: its own hooks match only its
interface, so a Pod's attachments never rewrite each other's. Peers live in named interval
sets, one per rule and family, declared even when empty: when only the peers change, an
update flushes and refills those sets in one transaction and leaves every rule alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cni_plugin.policy.compile import Compiled, Direction, PortRange

TABLE_PREFIX = "vpc_attach_policy_"
FAMILY = "inet"
# Always allowed (SPEC §17): replies and the ICMP errors of allowed connections (conntrack's
# related), neighbour and router discovery (untracked by conntrack; DAD from :: included).
# ARP is not IP: an inet table never sees it.
ND_TYPES = ("nd-router-solicit", "nd-router-advert", "nd-neighbor-solicit",
            "nd-neighbor-advert", "nd-redirect")
_IDENTIFIER = re.compile(r"[A-Za-z0-9_]+")
_HOOKS = {"ingress": ("prerouting", "iifname", "saddr"),
          "egress": ("postrouting", "oifname", "daddr")}


@dataclass(frozen=True)
class Table:
    """A rendered table: its rules with every set declared empty (`structure`), and the
    sets' elements. Equal structures differ only in peers."""

    name: str
    structure: str
    elements: Mapping[str, tuple[str, ...]]
    rules: int  # allow rules, the gauge's count

    def script(self) -> str:
        """The whole table, replacing any earlier copy in one transaction."""
        lines = [f"table {FAMILY} {self.name} {{}}", f"delete table {FAMILY} {self.name}",
                 self.structure]
        lines.extend(self._fill(name, elements) for name, elements in self.elements.items()
                     if elements)
        return "\n".join(lines) + "\n"

    def update_from(self, applied: Table) -> str | None:
        """The transaction that turns `applied` into this table by its sets alone; None
        when the rules differ (then the whole `script` is needed) or nothing changed ("")."""
        if applied.name != self.name or applied.structure != self.structure:
            return None
        lines = []
        for name, elements in self.elements.items():
            if applied.elements.get(name) != elements:
                lines.append(f"flush set {FAMILY} {self.name} {name}")
                if elements:
                    lines.append(self._fill(name, elements))
        return "\n".join(lines) + "\n" if lines else ""

    def _fill(self, name: str, elements: Sequence[str]) -> str:
        return f"add element {FAMILY} {self.name} {name} {{ {', '.join(elements)} }}"


def table_name(ifname: str) -> str:
    """`vpc_attach_policy_<ifname>`; a name nft could not read unquoted is replaced by a hash."""
    if _IDENTIFIER.fullmatch(ifname):
        return TABLE_PREFIX + ifname
    return TABLE_PREFIX + "x" + hashlib.sha256(ifname.encode()).hexdigest()[:12]


def removal(ifname: str) -> str:
    """The transaction removing the attachment's table, whether or not it exists."""
    name = table_name(ifname)
    return f"table {FAMILY} {name} {{}}\ndelete table {FAMILY} {name}\n"


def render(ifname: str, compiled: Compiled) -> Table:
    """The attachment's table for what it enforces (`compiled.enforced` must hold)."""
    name = table_name(ifname)
    sets: dict[str, tuple[str, ...]] = {}
    lines = [f"table {FAMILY} {name} {{"]
    body: list[str] = []
    rules = 0
    for direction, rendered in (("ingress", compiled.ingress), ("egress", compiled.egress)):
        if not rendered.isolated:
            continue
        chain_rules, direction_sets, allowing = _chain(direction, rendered)
        rules += allowing
        sets.update(direction_sets)
        hook, match, _ = _HOOKS[direction]
        lines.append(f"  counter {direction}_dropped {{}}")
        body.extend([
            f"  chain {direction} {{",
            f"    type filter hook {hook} priority filter; policy accept;",
            f'    {match} != "{_quoted(ifname)}" return',
            *(f"    {line}" for line in chain_rules),
            f'    counter name "{direction}_dropped" drop',
            "  }"])
    for set_name in sets:
        family = "ipv4_addr" if set_name.endswith("_4") else "ipv6_addr"
        lines.append(f"  set {set_name} {{ type {family}; flags interval; auto-merge; }}")
    lines.extend(body)
    lines.append("}")
    return Table(name, "\n".join(lines), sets, rules)


def _chain(direction: str, rendered: Direction
           ) -> tuple[list[str], dict[str, tuple[str, ...]], int]:
    """The chain's rules after its interface match, the sets they read, how many allow."""
    _, _, side = _HOOKS[direction]
    lines = [
        "ct state established,related accept",
        f"icmpv6 type {{ {', '.join(ND_TYPES)} }} accept",
        "ct state invalid drop",
    ]
    always = len(lines)
    sets: dict[str, tuple[str, ...]] = {}
    for index, allow in enumerate(rendered.allows):
        comment = f'comment "{_quoted(allow.origin)}"'
        ports = _port_matches(allow.ports)
        if allow.peers is None:
            lines.extend(f"{port}counter accept {comment}" for port in ports)
            continue
        prefix = f"{direction[0]}{index}"
        for version, family in ((4, "ip"), (6, "ip6")):
            set_name = f"{prefix}_{version}"
            sets[set_name] = tuple(str(net) for net in allow.peers if net.version == version)
            lines.extend(f"{family} {side} @{set_name} {port}counter accept {comment}"
                         for port in ports)
    return lines, sets, len(lines) - always


def _port_matches(ports: Sequence[PortRange] | None) -> list[str]:
    """One match per protocol ("" when every protocol and port is allowed)."""
    if ports is None:
        return [""]
    by_protocol: dict[str, list[PortRange]] = {}
    for port in ports:
        by_protocol.setdefault(port.protocol.lower(), []).append(port)
    matches = []
    for protocol, ranges in sorted(by_protocol.items()):
        if any(r.first is None for r in ranges):
            matches.append(f"meta l4proto {protocol} ")
            continue
        numbers = ", ".join(str(first) if first == last else f"{first}-{last}"
                            for first, last in merged_ranges(ranges))
        matches.append(f"meta l4proto {protocol} th dport {{ {numbers} }} ")
    return matches


def merged_ranges(ranges: Sequence[PortRange]) -> list[tuple[int, int]]:
    """Numbered ranges of one protocol, overlapping and adjacent ones merged (nft refuses
    overlapping intervals in one set)."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted((r.first, r.last) for r in ranges
                              if r.first is not None and r.last is not None):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _quoted(text: str) -> str:
    """Text safe inside an nft double-quoted string."""
    return text.replace("\\", "").replace('"', "'")
