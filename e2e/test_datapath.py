"""The datapath's boundaries with real packets (SPEC §14): a workload reaches its VPC and
nothing else, sends only from its own addresses, and per-VPC state goes with the VPC.

Every test runs its own "node": a network namespace where the plugin (and, with
VPC_ATTACH_E2E_VIA=agent, an agent) runs, so the `inet vpc_attach` table, the policy rules
and the host links exist only there; Pods are further namespaces; `ext` stands for a network
only the node's main table routes. VRF-mode runs need a kernel with VRF: where the host's has
none they run in the full-kernel VM (`fullkernel`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_plugin.core import naming
from e2e.harness.agentproc import OwnAgents
from e2e.harness.datapath_node import (
    EXT_V4,
    EXT_V6,
    NODE_V4,
    NODE_V6,
    Node,
    host_link,
    ipv4_udp_frame,
    node_with_uplink,
    use_vrf,
    vpc_attach_cli,
)
from e2e.harness.kernel import mark_rules, run_ip, vpc_table
from e2e.harness.packets import (
    ask,
    in_netns,
    listener,
    nft_table,
    ping,
    send,
    wait_counter_above,
    write_tap_frames,
)

pytestmark = [pytest.mark.root, pytest.mark.both_paths]


@pytest.fixture
def node(cni_bin: Path, own_agents: OwnAgents, tmp_path: Path,
         request: pytest.FixtureRequest) -> Iterator[Node]:
    """A node netns with an uplink to `ext`; the plugin (or agent) inside; torn down after."""
    param = getattr(request, "param", "")  # hostAccess, or the node's whole host file
    host_access, host_file = (param, None) if isinstance(param, str) else ("", param)
    with node_with_uplink(cni_bin, own_agents, tmp_path, host_access, host_file) as node:
        yield node


@pytest.fixture(params=["table", pytest.param("vrf", marks=[pytest.mark.fullkernel,
                                                             pytest.mark.once_through_agent])])
def mode(request: pytest.FixtureRequest, node: Node) -> str:
    """The isolation mode (vrf only where the kernel has VRF devices)."""
    if request.param == "vrf":
        use_vrf(node)
    return str(request.param)


def test_pods_of_a_vpc_reach_each_other_and_nothing_else(node: Node, mode: str) -> None:
    a1, a2 = node.attach("a1", "1"), node.attach("a1", "2")
    b1, c1 = node.attach("b2", "1"), node.attach("c3", "1")
    for version in (4, 6):  # v6 needs ND with the gateway on both sides
        assert ping(a1.netns, a2.ip(version)), f"a1 -> a2 IPv{version}"
    with listener(a2.netns, "tcp", 7001, node.work) as tcp, \
            listener(a2.netns, "udp", 7002, node.work) as udp:
        assert send(a1.netns, "tcp", a2.ip(4), 7001, "a1-tcp")
        assert send(a1.netns, "udp", a2.ip(6), 7002, "a1-udp6")
        tcp.wait_for("a1-tcp")
        udp.wait_for("a1-udp6")
        # b2 reuses a1's subnets: a2's addresses are nobody's in b2, and c3 is elsewhere.
        assert b1.ip(4) == a1.ip(4)
        for version in (4, 6):
            assert not ping(b1.netns, a2.ip(version), wait=1), f"b -> a IPv{version}"
            assert not ping(c1.netns, a1.ip(version), wait=1), f"c -> a IPv{version}"
        send(b1.netns, "udp", a2.ip(4), 7002, "b-udp")
        assert not send(b1.netns, "tcp", a2.ip(4), 7001, "b-tcp", timeout=1)
        assert send(a1.netns, "udp", a2.ip(4), 7002, "a1-control")
        udp.wait_for("a1-control")
        assert "b-udp" not in udp.payloads() and "b-tcp" not in tcp.payloads()
    with listener(node.ext, "udp", 7003, node.work) as outside:
        for version, ext in ((4, EXT_V4), (6, EXT_V6)):
            assert not ping(a1.netns, ext, wait=1), f"a -> main-table network IPv{version}"
            send(a1.netns, "udp", ext, 7003, f"escape-{version}")
        assert send(node.name, "udp", EXT_V4, 7003, "node-control")
        outside.wait_for("node-control")
        assert outside.payloads() == {"node-control"}


def test_host_listeners_receive_nothing_from_a_workload(node: Node, mode: str) -> None:
    a1 = node.attach("a1", "1")
    c1 = node.attach("c3", "1")
    before = node.counters()["host_dropped"]
    targets = [NODE_V4, NODE_V6, a1.gateway(4), a1.gateway(6), c1.gateway(4), c1.gateway(6),
               "127.0.0.1"]
    with listener(node.name, "udp", 7100, node.work) as udp, \
            listener(node.name, "tcp", 7101, node.work) as tcp:
        for target in targets:
            send(a1.netns, "udp", target, 7100, f"udp-{target}")
            assert not send(a1.netns, "tcp", target, 7101, f"tcp-{target}", timeout=1), target
        assert not ping(a1.netns, a1.gateway(4), wait=1), "echo to the gateway is host input"
        assert send(node.name, "udp", "127.0.0.1", 7100, "node-control")
        assert send(node.name, "tcp", NODE_V4, 7101, "node-tcp-control")
        udp.wait_for("node-control")
        tcp.wait_for("node-tcp-control")
        assert udp.payloads() == {"node-control"}
        assert tcp.payloads() == {"node-tcp-control"}
    assert node.counters()["host_dropped"] > before


def test_spoofed_source_is_dropped_and_counted(node: Node, mode: str) -> None:
    a1, a2 = node.attach("a1", "1"), node.attach("a1", "2")
    c1 = node.attach("c3", "1")
    before = node.counters()["source_dropped"]
    with listener(a2.netns, "udp", 7200, node.work) as udp:
        for version, spoofed in ((4, "10.80.0.99"), (6, "fd80::99"), (4, c1.ip(4))):
            assert send(a1.netns, "udp", a2.ip(version), 7200, f"spoofed-{spoofed}",
                        source=spoofed)
            before = wait_counter_above(node.name, "source_dropped", before)
        assert send(a1.netns, "udp", a2.ip(4), 7200, "own-source", source=a1.ip(4))
        udp.wait_for("own-source")
        assert udp.payloads() == {"own-source"}


@pytest.mark.parametrize("node", [{"allowedSourcePrefixes": [
    {"vpc": "a1", "vpcattachment": "2", "prefixes": ["10.81.0.0/24", "fd81::/64"]}]}],
    indirect=True)
def test_allowed_source_prefixes_widen_only_the_named_attachment(node: Node, mode: str) -> None:
    a1, a2 = node.attach("a1", "1"), node.attach("a1", "2")
    assert "10.81.0.0/24" in nft_table(node.name)
    before = node.counters()["source_dropped"]
    with listener(a1.netns, "udp", 7250, node.work) as at_a1, \
            listener(a2.netns, "udp", 7251, node.work) as at_a2:
        for version, routed in ((4, "10.81.0.9"), (6, "fd81::9")):
            assert send(a2.netns, "udp", a1.ip(version), 7250, f"routed-{version}",
                        source=routed)
            at_a1.wait_for(f"routed-{version}")
            # The same prefix from an attachment the host file does not name: dropped.
            assert send(a1.netns, "udp", a2.ip(version), 7251, f"not-named-{version}",
                        source=routed)
            before = wait_counter_above(node.name, "source_dropped", before)
        assert send(a1.netns, "udp", a2.ip(4), 7251, "own-source", source=a1.ip(4))
        at_a2.wait_for("own-source")
        assert at_a2.payloads() == {"own-source"}
        assert at_a1.payloads() == {"routed-4", "routed-6"}


def test_path_mtu_discovery_reaches_the_pod(node: Node, mode: str) -> None:
    a1, a2 = node.attach("a1", "1"), node.attach("a1", "2")
    node.run_ip("link", "set", host_link(a2), "mtu", "1280")
    for version in (4, 6):
        assert not ping(a1.netns, a2.ip(version), "-M", "do", "-s", "1400", wait=1)
        family = f"-{version}"
        learnt = run_ip("-n", os.path.basename(a1.netns), family, "route", "get", a2.ip(version))
        assert "mtu 1280" in learnt, f"no frag-needed/packet-too-big reached a1: {learnt}"
        assert ping(a1.netns, a2.ip(version), "-M", "do", "-s", "1200"), version


def test_tap_frames_are_checked_like_a_pod(node: Node, mode: str) -> None:
    a2 = node.attach("a1", "2")
    vm = node.attach("a1", "60", attachment="tap", ipam={"type": "static", "addresses": [
        {"address": "10.80.0.60/32", "gateway": "10.80.0.1"}]})
    tap = host_link(vm)
    mac = node.run_ip("-j", "link", "show", tap)
    tap_mac = mac.split('"address":"')[1].split('"')[0]
    node.run_ip("link", "set", tap, "up")
    before = node.counters()
    frames = [ipv4_udp_frame(tap_mac, "10.80.0.60", NODE_V4, 7300, b"vm-to-node"),
              ipv4_udp_frame(tap_mac, "10.80.0.99", a2.ip(4), 7301, b"vm-spoofed"),
              ipv4_udp_frame(tap_mac, "10.80.0.60", a2.ip(4), 7301, b"vm-to-a2")]
    with listener(node.name, "udp", 7300, node.work) as host, \
            listener(a2.netns, "udp", 7301, node.work) as pod:
        write_tap_frames(node.name, tap, frames)
        pod.wait_for("vm-to-a2")
        wait_counter_above(node.name, "host_dropped", before["host_dropped"])
        wait_counter_above(node.name, "source_dropped", before["source_dropped"])
        assert pod.payloads() == {"vm-to-a2"} and host.payloads() == set()


@pytest.mark.parametrize("node", ["udp/7400,tcp/7402"], indirect=True)
def test_host_access_opens_exactly_the_configured_ports_and_answers_reach_the_pod(
        node: Node) -> None:
    a1, a2 = node.attach("a1", "1"), node.attach("a1", "2")
    b1 = node.attach("b2", "1")  # b2 reuses a1's subnets: answers must find the right VPC
    assert b1.ip(4) == a1.ip(4)
    # A node's main table has a default route: an answer's first route lookup (before any mark)
    # needs one; its conntrack mark then reroutes it in the VPC's table.
    node.run_ip("route", "add", "default", "via", EXT_V4)
    node.run_ip("-6", "route", "add", "default", "via", EXT_V6)
    with listener(node.name, "udp", 7400, node.work, answer=True) as opened, \
            listener(node.name, "udp", 7401, node.work, answer=True) as closed, \
            listener(node.name, "tcp", 7402, node.work, answer=True):
        for pod, vpc in ((a1, "a1"), (b1, "b2")):
            for target in (NODE_V4, NODE_V6, pod.gateway(4), pod.gateway(6)):
                query = f"{vpc}-{target}"
                assert ask(pod.netns, "udp", target, 7400, query) == f"re:{query}", query
                assert ask(pod.netns, "udp", target, 7401, f"closed-{query}", timeout=1) \
                    is None, query
        for version, target in ((4, NODE_V4), (6, NODE_V6)):
            assert ask(a1.netns, "tcp", target, 7402, f"tcp{version}") == f"re:tcp{version}"
        # The conntrack mark alone routes TCP answers too (tcp_fwmark_accept is not needed for it).
        subprocess.run(in_netns(node.name, "sysctl", "-qw", "net.ipv4.tcp_fwmark_accept=0"),
                       check=True, timeout=20)
        for version, target in ((4, NODE_V4), (6, NODE_V6)):
            assert ask(b1.netns, "tcp", target, 7402, f"mark{version}") == f"re:mark{version}"
        assert closed.payloads() == set()
        assert len(opened.received()) == 8
    listing = nft_table(node.name)
    assert "udp dport 7400 goto host_access" in listing and "udp dport 7401" not in listing
    # Only answers get the mark: the node opens nothing into a Pod through its main table.
    with listener(a1.netns, "udp", 7403, node.work) as pod_udp, \
            listener(a1.netns, "tcp", 7404, node.work) as pod_tcp:
        for version in (4, 6):
            send(node.name, "udp", a1.ip(version), 7403, f"node-udp{version}")
            assert not send(node.name, "tcp", a1.ip(version), 7404, f"node-tcp{version}",
                            timeout=1)
        assert send(a2.netns, "udp", a1.ip(4), 7403, "a2-control")
        pod_udp.wait_for("a2-control")
        assert pod_udp.payloads() == {"a2-control"} and pod_tcp.payloads() == set()


@pytest.mark.fullkernel
@pytest.mark.once_through_agent
@pytest.mark.parametrize("node", ["udp/7400,tcp/7402"], indirect=True)
def test_host_access_in_vrf_mode_reaches_a_service_bound_to_the_vpcs_vrf(node: Node) -> None:
    use_vrf(node)
    a1, b1 = node.attach("a1", "1"), node.attach("b2", "1")  # same addresses, two VRFs
    assert (b1.ip(4), b1.gateway(6)) == (a1.ip(4), a1.gateway(6))
    vrf = naming.vrf_name("a1")
    with listener(node.name, "udp", 7400, node.work, answer=True, device=vrf) as opened, \
            listener(node.name, "udp", 7401, node.work, answer=True, device=vrf) as closed, \
            listener(node.name, "tcp", 7402, node.work, answer=True, device=vrf), \
            listener(node.name, "udp", 7400, node.work) as wildcard:
        asked = set()
        for target in (a1.gateway(4), a1.gateway(6)):  # what the Pod knows: its default route
            assert ask(a1.netns, "udp", target, 7400, f"udp-{target}") == f"re:udp-{target}"
            assert ask(a1.netns, "tcp", target, 7402, f"tcp-{target}") == f"re:tcp-{target}"
            assert ask(a1.netns, "udp", target, 7401, f"closed-{target}", timeout=1) is None
            # b2's VRF (same gateway addresses) has no service of its own: the wildcard
            # listener does not serve it.
            assert ask(b1.netns, "udp", target, 7400, f"b-{target}", timeout=1) is None
            asked.add(f"udp-{target}")
        assert opened.payloads() == asked
        assert closed.payloads() == set() and wildcard.payloads() == set()
    assert "udp dport 7400 goto host_access" in nft_table(node.name)


def test_vpc_state_goes_with_its_last_attachment_and_a_reused_table_starts_clean(
        node: Node) -> None:
    netns = f"/var/run/netns/{node.name}"
    first = [node.attach("a1", att) for att in ("1", "2", "3")]
    table = vpc_table("a1", netns)
    assert table is not None
    assert len(mark_rules(table, netns)) == 2, "two rules for the VPC, whatever its attachments"
    rules_before = node.run_ip("rule", "show").count("\n")
    more = node.attach("a1", "4")
    assert node.run_ip("rule", "show").count("\n") == rules_before, "an ADD adds no rule"
    for pod in (*first, more):
        node.detach(pod)
    assert vpc_table("a1", netns) is None and mark_rules(table, netns) == []
    for family in ("-4", "-6"):
        assert node.run_ip(family, "route", "show", "table", table).strip() == ""
    # Leftovers in the freed table id (someone else's, or a crash's) are gone before reuse.
    node.run_ip("route", "add", "unicast", "198.51.100.0/24", "dev", "up0", "table", table)
    c1 = node.attach("c3", "1")
    assert vpc_table("c3", netns) == table
    assert "198.51.100.0/24" not in node.run_ip("route", "show", "table", table)
    assert ping(c1.netns, c1.gateway(4)) is False  # still host input: dropped
    # GC removes the state of a VPC whose last link vanished without a DEL.
    node.run_ip("link", "del", host_link(c1))
    conf, container, path = node.pods.pop()
    gc_conf = {**{k: v for k, v in conf.items() if k != "prevResult"},
               "cni.dev/valid-attachments": []}
    node.plugin.ok("GC", gc_conf, container_id=container, netns=path)
    assert vpc_table("c3", netns) is None and mark_rules(table, netns) == []


def test_install_adopts_earlier_attachments_and_uninstall_removes_only_our_table(
        node: Node) -> None:
    netns = f"/var/run/netns/{node.name}"
    a1, a2 = node.attach("a1", "1"), node.attach("a1", "2")
    table = vpc_table("a1", netns)
    assert table is not None
    # What an earlier version left: an `iif G…H` rule per link and family, no group, no mark.
    for family in ("-4", "-6"):
        node.run_ip(family, "rule", "del", "fwmark", f"{int(table) << 16:#x}/0xfff0000",
                    "lookup", table)
        for pod in (a1, a2):
            node.run_ip(family, "rule", "add", "iif", host_link(pod), "lookup", table, "pref",
                        "1000")
    node.run_ip("rule", "del", "pref", "40000", "iif", naming.vrf_name("a1"), "lookup", table)
    for pod in (a1, a2):
        node.run_ip("link", "set", host_link(pod), "group", "0")
    assert not ping(a1.netns, a2.ip(4), wait=1), "unmarked: the source check drops"
    subprocess.run(in_netns(node.name, "nft", "add", "table", "inet", "someone_else"),
                   check=True, timeout=20)

    root = node.work / "root"
    root.mkdir()
    common = ["--root", str(root), "--host-protection"]
    done = vpc_attach_cli(node, "install", *common, "--no-binaries", "--no-kubeconfig")
    assert done.returncode == 0, done.stderr
    for family in ("-4", "-6"):
        assert ping(a1.netns, a2.ip(int(family[1])))
        assert f"iif {host_link(a1)}" not in node.run_ip(family, "rule")
    assert vpc_table("a1", netns) == table and len(mark_rules(table, netns)) == 2

    done = vpc_attach_cli(node, "uninstall", *common)
    assert done.returncode == 0, done.stderr
    tables = subprocess.run(in_netns(node.name, "nft", "list", "tables"), capture_output=True,
                            text=True, check=True, timeout=20).stdout
    assert "someone_else" in tables and "vpc_attach" not in tables
