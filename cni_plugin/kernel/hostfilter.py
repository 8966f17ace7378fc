"""Host protection (SPEC §14): one nftables table of our own, `inet vpc_attach`, set up once
per node.

Packets from vpc-attach links (every name starting `G`: host links G…H, VRFs G…V) are checked
for their source (a reverse route lookup in the VPC's table must lead back to the link they
came in on), reach the host stack only for ND and the ICMP errors PMTU needs (plus `hostAccess`,
whose answers the conntrack mark routes back in the VPC's table) and, in `table` mode, leave only
through vpc-attach links. The table is written by the `nft` executable (Debian's `nftables`);
the one rule nft's parser refuses (copying the link's group into the packet mark: the VPC's
routing mark, see isolation.py) and the cheap "is it there?" check go over nfnetlink directly.
Why these rules: docs/architecture.md ("Host protection").
"""

from __future__ import annotations

import errno
import ipaddress
import json
import re
import shutil
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import isolation, netns, sysctl
from cni_plugin.kernel.rtnl import (
    NETLINK_NETFILTER,
    NLA_F_NESTED,
    NLM_F_CREATE,
    NetlinkError,
    Rtnl,
    attr,
    attr_str,
)
from netconf.errors import KERNEL_FAILURE, CniError
from netconf.node_groups import DatapathSettings

TABLE = "vpc_attach"
FAMILY = "inet"
LINK_PATTERN = "G*"  # every vpc-attach link name: host links G…H, VRFs G…V
MARK_CHAIN = "vpc_mark"
ACCESS_CHAIN = "host_access"
COUNTERS = ("source_dropped", "host_dropped", "escape_dropped")
MARK_RULE_LISTED = "meta mark set iifgroup"  # how nft lists the rule it cannot parse
NFT_TIMEOUT = 10.0  # an nft run outside a verb (installer, doctor); inside one, its deadline

# nfnetlink (linux/netfilter/nf_tables.h)
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFT_MSG_GETTABLE, NFT_MSG_DELTABLE, NFT_MSG_NEWRULE, NFT_MSG_GETRULE = 1, 2, 6, 7
NFPROTO_INET, NFPROTO_UNSPEC = 1, 0
NFTA_TABLE_NAME = 1
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS = 1, 2, 4
NFTA_LIST_ELEM, NFTA_EXPR_NAME, NFTA_EXPR_DATA = 1, 1, 2
NFTA_META_DREG, NFTA_META_KEY, NFTA_META_SREG = 1, 2, 3
NFT_META_MARK, NFT_META_IIFGROUP = 3, 21
NFT_REG_1 = 1
NLM_F_APPEND = 0x800

# Replies the node makes itself carry the mark of what they answer, so they are routed in the
# VPC's table: ICMP errors (frag-needed, packet-too-big) and echo replies, TCP RSTs
# (fwmark_reflect); a TCP socket a `hostAccess` port accepts takes the SYN's mark
# (tcp_fwmark_accept), so its answers are routed there even when the main table has no route
# to the Pod (the conntrack mark below needs one: it reroutes after a first lookup succeeded).
NODE_SYSCTLS = {"net.ipv4.fwmark_reflect": "1", "net.ipv6.fwmark_reflect": "1",
                "net.ipv4.tcp_fwmark_accept": "1"}
ICMP_ERRORS = "destination-unreachable, time-exceeded, parameter-problem"
ICMPV6_NEEDED = ("destination-unreachable, packet-too-big, time-exceeded, parameter-problem, "
                 "nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert, "
                 "mld-listener-report, mld2-listener-report")


def ruleset(settings: DatapathSettings) -> str:
    """The table as `nft -f` reads it; replaces an older copy of itself in one transaction."""
    allowed = [_allowed_rule(entry.vpc, entry.vpcattachment, prefix)
               for entry in settings.allowed_sources for prefix in entry.prefixes]
    opened = [f"meta l4proto {p.protocol} th dport {_ports(p.first, p.last)} goto {ACCESS_CHAIN}"
              for p in settings.host_access]
    mask = f"{isolation.MARK_MASK:#010x}"
    lines = [
        f"table {FAMILY} {TABLE} {{}}",
        f"delete table {FAMILY} {TABLE}",
        f"table {FAMILY} {TABLE} {{",
        *(f"  counter {name} {{}}" for name in COUNTERS),
        f"  chain {MARK_CHAIN} {{}}",
        f"  chain {ACCESS_CHAIN} {{",  # a hostAccess port: accepted, its replies find the Pod
        f"    meta mark & {mask} == 0 return",  # vrf mode: the VRF routes the replies
        f"    ct mark set meta mark & {mask}",
        "  }",
        "  chain prerouting {",
        "    type filter hook prerouting priority raw; policy accept;",
        f'    iifname != "{LINK_PATTERN}" return',
        '    meta iifkind "vrf" return',  # a VRF's second pass: its slave was checked already
        f"    jump {MARK_CHAIN}",
        "    ip6 saddr { fe80::/10, ::/128 } return",  # ND and DAD; the kernel never forwards them
        *(f"    {rule}" for rule in allowed),
        '    fib saddr . mark . iif oif missing counter name "source_dropped" drop',
        "  }",
        "  chain input {",
        "    type filter hook input priority filter - 10; policy accept;",
        f'    iifname != "{LINK_PATTERN}" return',
        f"    icmp type {{ {ICMP_ERRORS} }} return",
        f"    icmpv6 type {{ {ICMPV6_NEEDED} }} return",
        *(f"    {rule}" for rule in opened),
        '    counter name "host_dropped" drop',
        "  }",
        "  chain forward {",
        "    type filter hook forward priority filter - 10; policy accept;",
        f'    iifname != "{LINK_PATTERN}" return',
        f"    meta mark & {mask} == 0 return",  # vrf mode: the VRF decides
        f'    oifname != "{LINK_PATTERN}" counter name "escape_dropped" drop',
        "  }",
        "  chain output {",  # the node's replies on a hostAccess connection: the VPC's table
        "    type route hook output priority mangle; policy accept;",
        f"    ct direction reply ct mark & {mask} != 0 meta mark set ct mark & {mask}",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _ports(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _allowed_rule(vpc: str, attachment: str | None,
                  prefix: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    link = naming.host_link_name(vpc, attachment) if attachment is not None \
        else f"G{naming.pad_base62(vpc, naming.VPC_WIDTH)}*"
    family = "ip" if prefix.version == 4 else "ip6"
    return f'iifname "{link}" {family} saddr {prefix} return'


@dataclass(frozen=True)
class State:
    """What the node has of our table."""

    table: bool
    mark_rule: bool

    @property
    def complete(self) -> bool:
        """Both the table and its mark rule are in place."""
        return self.table and self.mark_rule


def state(deadline: Deadline | None = None) -> State:
    """Whether the table and its mark rule exist (two nfnetlink requests, no `nft`)."""
    with _nfnl(deadline) as nfnl:
        try:
            nfnl.request(_msg(NFT_MSG_GETTABLE), _nfgen(NFPROTO_INET)
                         + attr_str(NFTA_TABLE_NAME, TABLE))
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:
                return State(False, False)
            raise _failure("read nftables table", exc) from None
        try:
            rules = nfnl.dump(_msg(NFT_MSG_GETRULE), _nfgen(NFPROTO_INET)
                              + attr_str(NFTA_RULE_TABLE, TABLE)
                              + attr_str(NFTA_RULE_CHAIN, MARK_CHAIN))
        except NetlinkError as exc:
            raise _failure("read nftables chain", exc) from None
        return State(True, bool(rules))


def install(settings: DatapathSettings, deadline: Deadline | None = None) -> bool:
    """Write the table and its mark rule unless the node's table is already exactly what they
    would be, and the node sysctls the marks need; whether it wrote. Rewriting takes two
    transactions (nft, then the mark rule), between which Pods' packets are dropped: a roll of
    the DaemonSet between releases with the same rules must not rewrite them."""
    for key, value in NODE_SYSCTLS.items():
        sysctl.set_sysctl(key, value)
    text = ruleset(settings)
    if _written(text, deadline):
        return False
    _nft(["-f", "-"], text, deadline)
    _add_mark_rule(deadline)
    return True


def _written(text: str, deadline: Deadline | None) -> bool:
    """Whether the node's table is complete and lists as `text` does once nft wrote it (in a
    scratch netns: nft's listing is the one canonical form), counters' values aside."""
    if not state(deadline).complete:
        return False
    with netns.scratch():
        _nft(["-f", "-"], text, deadline)
        fresh = listing(deadline)
    return _comparable(listing(deadline)) == _comparable(fresh)


def _comparable(listed: str) -> str:
    """A listing without counter values and without the mark rule (added over nfnetlink, not
    by nft: absent from the scratch copy; `state` checks it)."""
    lines = [re.sub(r"packets \d+ bytes \d+", "packets bytes", line)
             for line in listed.splitlines() if line.strip() != MARK_RULE_LISTED]
    return "\n".join(lines)


def ensure(settings_of: Callable[[], DatapathSettings], deadline: Deadline | None = None
           ) -> bool:
    """Install the table unless it is complete already (settings read only then); whether it
    was installed. An install that fails where there was no table takes back the table it may
    have left: nft can commit and still miss its bound, or the mark rule can fail after it, and
    a table without its mark rule would stay until the next ADD."""
    found = state(deadline)
    if found.complete:
        return False
    try:
        install(settings_of(), deadline)
    except CniError:
        if not found.table:
            _delete_table()
        raise
    return True


def _delete_table() -> None:
    """Delete our table over nfnetlink, bounded on its own (the verb's deadline may be what
    ran out); absent already is fine, and a failure here leaves the install's error to say."""
    body = _nfgen(NFPROTO_INET) + attr_str(NFTA_TABLE_NAME, TABLE)
    try:
        with _nfnl(None) as nfnl:
            nfnl.batch(NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, _nfgen(NFPROTO_UNSPEC,
                       NFNL_SUBSYS_NFTABLES), _msg(NFT_MSG_DELTABLE), 0, body)
    except (NetlinkError, CniError):
        return


def remove(deadline: Deadline | None = None) -> bool:
    """Delete our table (and nothing else); whether there was one."""
    if not state(deadline).table:
        return False
    _nft(["delete", "table", FAMILY, TABLE], None, deadline)
    return True


def counters(deadline: Deadline | None = None) -> dict[str, int]:
    """Packets dropped per reason (empty without the table)."""
    if not state(deadline).table:
        return {}
    listed = json.loads(_nft(["-j", "list", "counters", "table", FAMILY, TABLE], None,
                             deadline))
    found: dict[str, int] = {}
    for item in listed.get("nftables", []):
        counter = item.get("counter")
        if isinstance(counter, dict) and counter.get("name") in COUNTERS:
            found[str(counter["name"])] = int(counter.get("packets", 0))
    return found


def listing(deadline: Deadline | None = None) -> str:
    """`nft list table inet vpc_attach` as nft prints it."""
    return _nft(["list", "table", FAMILY, TABLE], None, deadline)


def _add_mark_rule(deadline: Deadline | None) -> None:
    """`meta mark set iifgroup` in the mark chain (nft's parser refuses the type change)."""
    expressions = _expr("meta", _be32(NFTA_META_DREG, NFT_REG_1)
                        + _be32(NFTA_META_KEY, NFT_META_IIFGROUP)) \
        + _expr("meta", _be32(NFTA_META_KEY, NFT_META_MARK) + _be32(NFTA_META_SREG, NFT_REG_1))
    body = _nfgen(NFPROTO_INET) + attr_str(NFTA_RULE_TABLE, TABLE) \
        + attr_str(NFTA_RULE_CHAIN, MARK_CHAIN) \
        + attr(NFTA_RULE_EXPRESSIONS | NLA_F_NESTED, expressions)
    with _nfnl(deadline) as nfnl:
        try:
            if nfnl.dump(_msg(NFT_MSG_GETRULE), _nfgen(NFPROTO_INET)
                         + attr_str(NFTA_RULE_TABLE, TABLE)
                         + attr_str(NFTA_RULE_CHAIN, MARK_CHAIN)):
                return
            nfnl.batch(NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, _nfgen(NFPROTO_UNSPEC,
                       NFNL_SUBSYS_NFTABLES), _msg(NFT_MSG_NEWRULE),
                       NLM_F_CREATE | NLM_F_APPEND, body)
        except NetlinkError as exc:
            raise _failure("add the mark rule to nftables chain", exc) from None


def _expr(name: str, data: bytes) -> bytes:
    return attr(NFTA_LIST_ELEM | NLA_F_NESTED, attr_str(NFTA_EXPR_NAME, name)
                + attr(NFTA_EXPR_DATA | NLA_F_NESTED, data))


def _be32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack(">I", value))


def _msg(kind: int) -> int:
    return (NFNL_SUBSYS_NFTABLES << 8) | kind


def _nfgen(family: int, res_id: int = 0) -> bytes:
    """struct nfgenmsg: family, version 0, res_id in network order."""
    return struct.pack("=BB", family, 0) + struct.pack(">H", res_id)


def _nfnl(deadline: Deadline | None) -> Rtnl:
    try:
        return Rtnl(deadline=deadline, protocol=NETLINK_NETFILTER)
    except OSError as exc:
        raise CniError(KERNEL_FAILURE, "this kernel has no nfnetlink socket (nf_tables)",
                       str(exc)) from None


def _failure(action: str, exc: NetlinkError) -> CniError:
    return CniError(KERNEL_FAILURE, f"failed to {action} {FAMILY} {TABLE!r}: {exc.message}",
                    f"netlink error {exc.code}")


def nft_path() -> str:
    """The `nft` executable (code 100 naming the package when missing)."""
    found = shutil.which("nft") or next(
        (p for p in ("/usr/sbin/nft", "/sbin/nft") if shutil.which(p)), None)
    if found is None:
        raise CniError(KERNEL_FAILURE, "the nft executable is missing",
                       "install Debian's nftables package (host protection needs it)")
    return found


def _nft(args: list[str], stdin: str | None, deadline: Deadline | None) -> str:
    # Inside a verb its deadline is the bound: a constant sized on a fast CPU failed a busy
    # machine's emulated VM, where one nft run took over 10 s with the verb's 271 s far from spent.
    timeout = deadline.remaining() if deadline is not None else NFT_TIMEOUT
    try:
        done = subprocess.run([nft_path(), *args], input=stdin, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        bound = "the verb's deadline" if deadline is not None else "its bound"
        raise CniError(KERNEL_FAILURE, f"nft {' '.join(args)} did not finish within "
                       f"{timeout:.1f}s ({bound})") from None
    if done.returncode != 0:
        raise CniError(KERNEL_FAILURE, f"nft {' '.join(args)} failed",
                       (done.stderr or done.stdout).strip()[:2000])
    return done.stdout
