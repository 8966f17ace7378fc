"""The rtnetlink client against the real kernel: what it writes is there, what it reads is what
`ip -j` (and pyroute2, where installed) sees. Everything happens in namespaces made here."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from cni_plugin.kernel.netns import entered, open_netlink
from cni_plugin.kernel.rtnl import (
    IFF_UP,
    NUD_PERMANENT,
    RT_SCOPE_LINK,
    RTN_UNREACHABLE,
    RTNH_F_ONLINK,
    NetlinkError,
    RouteMsg,
    Rtnl,
)
from e2e.harness.kernel import run_ip, temporary_netns

pytestmark = pytest.mark.root
IFA_F_NODAD = 0x02
IFA_F_NOPREFIXROUTE = 0x200
BIG_TABLE = 100_000  # above 255: only RTA_TABLE / FRA_TABLE can name it
SMALL_TABLE = 100
ROUTE_TYPES = {1: "unicast", 7: "unreachable"}
TABLE_NAMES = {"main": 254, "local": 255, "default": 253}


@pytest.fixture
def space() -> Iterator[str]:
    """A second throwaway netns (the `netns` fixture gives the first)."""
    with temporary_netns("vpa-rtnl") as path:
        yield path


def ip_json(path: str, *args: str) -> Any:
    """`ip -j -d` in the netns at path, parsed."""
    return json.loads(run_ip("-n", os.path.basename(path), "-j", "-d", *args) or "[]")


def veth_pair(host: Rtnl, pod_path: str, name: str = "vpa-h0", peer: str = "vpa-p0",
              mtu: int | None = 1400) -> None:
    """A veth with its peer created directly in the netns at pod_path."""
    fd = os.open(pod_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        host.new_veth(name, peer, fd, mtu)
    finally:
        os.close(fd)


def _links_by_ip(path: str) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for link in ip_json(path, "link", "show"):
        info = link.get("linkinfo") or {}
        found[link["ifindex"]] = {
            "name": link["ifname"], "mtu": link["mtu"], "mac": link.get("address", ""),
            "alias": link.get("ifalias"), "up": "UP" in link["flags"],
            "kind": info.get("info_kind", ""), "master": link.get("master")}
    return found


def _links_by_rtnl(nl: Rtnl) -> dict[int, dict[str, Any]]:
    links = nl.links()
    names = {link.index: link.name for link in links}
    return {link.index: {
        "name": link.name, "mtu": link.mtu, "mac": link.mac, "alias": link.alias,
        "up": link.up, "kind": link.kind,
        "master": names.get(link.master) if link.master is not None else None}
        for link in links}


def test_a_veth_made_across_namespaces_reads_back_as_ip_shows_it(netns: str,
                                                                  space: str) -> None:
    with open_netlink(space) as host, open_netlink(netns) as pod:
        veth_pair(host, netns)
        host_link = host.get_link(name="vpa-h0")
        pod_link = pod.get_link(name="vpa-p0")
        host.set_link(host_link.index, alias="vpc-attach/c1/eth0", up=True)
        pod.set_link(pod_link.index, mac="02:00:5e:10:00:01")
        pod.set_link(pod_link.index, name="eth0", alias="vpc-attach/c1/eth0", mtu=1300, up=True)

        renamed = pod.get_link(index=pod_link.index)
        assert (renamed.name, renamed.mtu, renamed.mac, renamed.alias, renamed.up) == (
            "eth0", 1300, "02:00:5e:10:00:01", "vpc-attach/c1/eth0", True)
        assert host.get_link(index=host_link.index).kind == "veth"
        assert _links_by_rtnl(host) == _links_by_ip(space)
        assert _links_by_rtnl(pod) == _links_by_ip(netns)

        host.set_link(host_link.index, up=False)
        assert not host.get_link(name="vpa-h0").flags & IFF_UP
        host.del_link(index=host_link.index)
        assert {link.name for link in pod.links()} == {"lo"}, "the peer goes with it"


def test_a_dump_larger_than_one_datagram_is_read_whole(space: str, netns: str) -> None:
    with open_netlink(space) as nl:
        for i in range(150):
            veth_pair(nl, netns, f"vpa-m{i}", f"vpa-n{i}", mtu=None)
        assert _links_by_rtnl(nl) == _links_by_ip(space)
        assert len(nl.links()) == 151


def test_addresses_and_their_flags_are_what_ip_shows(space: str, netns: str) -> None:
    with open_netlink(space) as nl:
        veth_pair(nl, netns)
        index = nl.get_link(name="vpa-h0").index
        nl.set_link(index, up=True)
        wanted = [(ipaddress.ip_interface("10.1.2.3/32"), IFA_F_NOPREFIXROUTE),
                  (ipaddress.ip_interface("10.9.0.1/25"), IFA_F_NOPREFIXROUTE),
                  (ipaddress.ip_interface("fd00::3/64"), IFA_F_NODAD | IFA_F_NOPREFIXROUTE),
                  (ipaddress.ip_interface("fe80::1/128"), IFA_F_NODAD)]
        for address, flags in wanted:
            nl.new_addr(index, address, flags)
        with pytest.raises(NetlinkError) as raised:
            nl.new_addr(index, wanted[0][0], wanted[0][1])
        assert raised.value.code == errno.EEXIST

        by_ip = {(a["local"], a["prefixlen"], a["scope"])
                 for link in ip_json(space, "addr", "show", "dev", "vpa-h0")
                 for a in link["addr_info"]}
        scopes = {0: "global", RT_SCOPE_LINK: "link", 254: "host"}
        by_rtnl = {(a.local or a.address, a.prefixlen, scopes[a.scope])
                   for a in nl.addrs(index=index)}
        assert by_rtnl == by_ip
        assert {(str(a), True) for a, _ in wanted} <= {
            (f"{a.local or a.address}/{a.prefixlen}", True) for a in nl.addrs(index=index)}
        flags_by_ip = {a["local"]: (a.get("noprefixroute", False), a.get("nodad", False))
                       for link in ip_json(space, "addr", "show", "dev", "vpa-h0")
                       for a in link["addr_info"]}
        for address, flags in wanted:
            assert flags_by_ip[str(address.ip)] == (bool(flags & IFA_F_NOPREFIXROUTE),
                                                    bool(flags & IFA_F_NODAD))
        assert nl.addrs(index=index + 1000) == []


def _route_key(family: int, msg: RouteMsg, names: dict[int, str]) -> tuple[Any, ...]:
    dst = msg.dst or ("0.0.0.0" if family == socket.AF_INET else "::")
    return (str(ipaddress.ip_network(f"{dst}/{msg.dst_len}")), msg.gateway,
            names.get(msg.oif) if msg.oif is not None else None, msg.priority,
            ROUTE_TYPES.get(msg.type, msg.type), bool(msg.flags & RTNH_F_ONLINK), msg.table)


def _ip_route_key(family: int, route: dict[str, Any], table: int) -> tuple[Any, ...]:
    dst = route["dst"]
    if dst == "default":
        dst = "0.0.0.0/0" if family == socket.AF_INET else "::/0"
    return (str(ipaddress.ip_network(dst)), route.get("gateway"), route.get("dev"),
            route.get("metric"), route.get("type", "unicast"), "onlink" in route["flags"],
            table)


def _ip_routes(path: str, family: int, table: int) -> set[tuple[Any, ...]]:
    flag = "-4" if family == socket.AF_INET else "-6"
    return {_ip_route_key(family, r, table)
            for r in ip_json(path, flag, "route", "show", "table", str(table))}


def test_routes_in_numbered_tables_are_what_ip_shows(space: str, netns: str) -> None:
    with open_netlink(space) as nl:
        veth_pair(nl, netns)
        index = nl.get_link(name="vpa-h0").index
        nl.set_link(index, up=True)
        nl.set_link(nl.get_link(name="lo").index, up=True)  # else no gateway is valid here
        names = {link.index: link.name for link in nl.links()}
        for table in (SMALL_TABLE, BIG_TABLE):
            for dst in ("10.1.2.3/32", "fd00::3/128"):
                for _ in range(2):  # replace: a repeat converges
                    nl.replace_route(ipaddress.ip_network(dst), table=table, oif=index,
                                     scope=RT_SCOPE_LINK)
            for dst in ("0.0.0.0/0", "::/0"):
                nl.replace_route(ipaddress.ip_network(dst), table=table, rtype=RTN_UNREACHABLE,
                                 priority=4278198272)
        for gateway, dst in (("169.254.1.1", "0.0.0.0/0"), ("fe80::1", "::/0")):
            nl.replace_route(ipaddress.ip_network(dst), table=254, oif=index,
                             gateway=ipaddress.ip_address(gateway), onlink=True)

        for family in (socket.AF_INET, socket.AF_INET6):
            for table in (SMALL_TABLE, BIG_TABLE, 254):
                filtered = {_route_key(family, r, names) for r in nl.routes(family, table)}
                unfiltered = {_route_key(family, r, names) for r in nl.routes(family)
                              if r.table == table}
                assert filtered == unfiltered == _ip_routes(space, family, table)
                assert filtered, f"table {table} has routes"
            through = nl.routes(family, BIG_TABLE, oif=index)
            assert [r.dst_len for r in through] == [32 if family == socket.AF_INET else 128]
        assert nl.routes(socket.AF_INET, 4242) == nl.routes(socket.AF_INET6, 4242) == []
        assert nl.routes(socket.AF_INET, BIG_TABLE, oif=index + 1000) == []


def test_permanent_neighbours_are_what_ip_shows(space: str, netns: str) -> None:
    with open_netlink(space) as nl:
        veth_pair(nl, netns)
        index = nl.get_link(name="vpa-h0").index
        nl.set_link(index, up=True)
        for ip in ("10.1.2.3", "fd00::3"):
            nl.replace_neigh(index, ipaddress.ip_address(ip), "02:00:00:00:00:01")
            nl.replace_neigh(index, ipaddress.ip_address(ip), "02:00:00:00:00:02")
        by_rtnl = {(n.dst, n.lladdr) for n in nl.neighbours(index=index)
                   if n.state & NUD_PERMANENT}
        by_ip = {(n["dst"], n["lladdr"]) for n in ip_json(space, "neigh", "show", "dev", "vpa-h0")
                 if "PERMANENT" in n["state"]}
        assert by_rtnl == by_ip == {("10.1.2.3", "02:00:00:00:00:02"),
                                    ("fd00::3", "02:00:00:00:00:02")}
        assert nl.neighbours(index=index + 1000) == []


def test_policy_rules_are_what_ip_shows(space: str) -> None:
    with open_netlink(space) as nl:
        for family in (socket.AF_INET, socket.AF_INET6):
            nl.new_rule(family, "vpa-h0", BIG_TABLE, 1000)
            nl.new_rule(family, "vpa-h1", SMALL_TABLE, 1001)
            with pytest.raises(NetlinkError) as raised:
                nl.new_rule(family, "vpa-h0", BIG_TABLE, 1000)
            assert raised.value.code == errno.EEXIST
            flag = "-4" if family == socket.AF_INET else "-6"
            by_ip = {(r.get("iif"), TABLE_NAMES.get(r["table"]) or int(r["table"]),
                      r["priority"] or None)
                     for r in ip_json(space, flag, "rule", "show")}
            by_rtnl = {(r.iifname, r.table, r.priority) for r in nl.rules(family)}
            assert by_rtnl == by_ip
            assert ("vpa-h0", BIG_TABLE, 1000) in by_rtnl


def test_kernel_errors_carry_errno_and_the_extended_ack(space: str) -> None:
    with open_netlink(space) as nl:
        with pytest.raises(NetlinkError) as missing:
            nl.get_link(name="vpa-absent")
        assert missing.value.code == errno.ENODEV
        with pytest.raises(NetlinkError) as gone:
            nl.del_link(name="vpa-absent")
        assert gone.value.code == errno.ENODEV
        with pytest.raises(NetlinkError) as refused:
            nl.replace_route(ipaddress.ip_network("10.0.0.0/8"), table=254, oif=1,
                             gateway=ipaddress.ip_address("10.1.1.1"))
        assert refused.value.code == errno.ENETUNREACH
        assert "Nexthop has invalid gateway" in str(refused.value)


def test_a_socket_made_in_another_netns_stays_there_and_the_thread_comes_back(
        netns: str, space: str) -> None:
    home = os.stat("/proc/thread-self/ns/net").st_ino
    with open_netlink(space) as there:
        veth_pair(there, netns)
        assert os.stat("/proc/thread-self/ns/net").st_ino == home
        assert {link.name for link in there.links()} == {"lo", "vpa-h0"}
    with open_netlink(netns) as pod:
        assert {link.name for link in pod.links()} == {"lo", "vpa-p0"}


@pytest.mark.fullkernel
def test_vrf_devices_report_their_table(space: str) -> None:
    with open_netlink(space) as nl:
        try:
            nl.new_vrf("vpa-vrf0", BIG_TABLE)
        except NetlinkError as exc:
            if exc.code == errno.EOPNOTSUPP:
                pytest.skip(f"this kernel cannot create VRF devices ({exc})")
            raise
        vrf = nl.get_link(name="vpa-vrf0")
        assert (vrf.kind, vrf.vrf_table) == ("vrf", BIG_TABLE)
        shown = ip_json(space, "link", "show", "vpa-vrf0")[0]["linkinfo"]
        assert shown["info_kind"] == "vrf" and shown["info_data"]["table"] == BIG_TABLE


def test_pyroute2_reads_what_rtnl_reads(space: str, netns: str) -> None:
    import pyroute2  # the test extra installs it for this cross-check: never skip
    with open_netlink(space) as nl:
        veth_pair(nl, netns)
        index = nl.get_link(name="vpa-h0").index
        nl.set_link(index, alias="vpc-attach/c9/eth0", up=True)
        nl.new_addr(index, ipaddress.ip_interface("169.254.1.1/32"))
        nl.replace_route(ipaddress.ip_network("10.1.2.3/32"), table=BIG_TABLE, oif=index,
                         scope=RT_SCOPE_LINK)
        nl.new_rule(socket.AF_INET, "vpa-h0", BIG_TABLE, 1000)
        nl.replace_neigh(index, ipaddress.ip_address("10.1.2.3"), "02:00:00:00:00:09")
        with entered(space):
            ipr = pyroute2.IPRoute()
        try:
            theirs_links = {(m["index"], m.get("IFLA_IFNAME"), m.get("IFLA_MTU"),
                             m.get("IFLA_IFALIAS"), bool(m["flags"] & IFF_UP))
                            for m in ipr.get_links()}
            theirs_routes = {(m.get("RTA_DST"), m["dst_len"], m.get("RTA_OIF"))
                             for m in ipr.get_routes(family=socket.AF_INET, table=BIG_TABLE)}
            theirs_rules = {(m.get("FRA_IIFNAME"), m.get("FRA_TABLE"))
                            for m in ipr.get_rules(family=socket.AF_INET)}
            theirs_neigh = {(m.get("NDA_DST"), m.get("NDA_LLADDR"))
                            for m in ipr.get_neighbours(ifindex=index)
                            if m["state"] & NUD_PERMANENT}
            theirs_addrs = {(m.get("IFA_ADDRESS"), m["prefixlen"]) for m in ipr.get_addr()}
        finally:
            ipr.close()
        assert theirs_links == {(m.index, m.name, m.mtu, m.alias, m.up) for m in nl.links()}
        assert theirs_routes == {(m.dst, m.dst_len, m.oif)
                                 for m in nl.routes(socket.AF_INET, BIG_TABLE)}
        assert theirs_rules == {(m.iifname, m.table) for m in nl.rules(socket.AF_INET)}
        assert theirs_neigh == {(m.dst, m.lladdr) for m in nl.neighbours(index=index)
                                if m.state & NUD_PERMANENT}
        assert theirs_addrs == {(m.address, m.prefixlen) for m in nl.addrs()}


def test_requests_on_a_socket_in_a_deleted_netns_still_answer(space: str) -> None:
    # The socket holds its netns: deleting the name must not leave a call hanging.
    nl = open_netlink(space, timeout=5)
    try:
        subprocess.run(["ip", "netns", "del", os.path.basename(space)], check=True, timeout=20)
        assert {link.name for link in nl.links()} == {"lo"}
    finally:
        nl.close()
