"""Policy inside a VPC on one node with real packets (SPEC §17), beyond the upstream cases: the
first packet of a Pod added under a deny-all, two VPCs with the same subnets, bad policies, the
agent restarted, a tap where the kernel cannot filter it, NetworkPolicy on the conflist's
attachment. Multus does not run here: the scene (e2e/harness/policyscene.py) writes the NADs
and the Pods' `k8s.v1.cni.cncf.io/networks` annotation as a user would and calls the plugin as
Multus would. In-process and through the node's agent (`both_paths`) where the behaviour is
the ADD's; the agent's own work (following later changes, Events) through it alone.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import OwnAgents
from e2e.harness.kernel import links_in
from e2e.harness.kube import Kube
from e2e.harness.packets import in_netns
from e2e.harness.plugin import VIA_AGENT, random_vpc
from e2e.harness.policyscene import (
    AddRefused,
    PolicyNode,
    Scene,
    manifest_nad,
    manifest_namespace,
    manifest_pod,
    manifest_policy,
    policy_node,
    scrape,
)
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster]
SETTLE_S = 30.0
EVENT_S = 60.0
DENY_ALL = {"podSelector": {}, "policyTypes": ["Ingress"]}


@pytest.fixture(scope="module")
def node(cluster: Any, cni_bin: Path, own_agents: OwnAgents,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyNode]:
    """One node for the module: in-process, or with its agent in the agent pass."""
    with policy_node(cluster, cni_bin, tmp_path_factory.mktemp("policy-node"), own_agents,
                     via_agent=VIA_AGENT) as made:
        yield made


@pytest.fixture(scope="module")
def agent_node(cluster: Any, cni_bin: Path, own_agents: OwnAgents,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyNode]:
    """A node whose agent keeps the policies (for what only the agent does)."""
    with policy_node(cluster, cni_bin, tmp_path_factory.mktemp("policy-agent-node"),
                     own_agents, via_agent=True) as made:
        yield made


@contextmanager
def scene(kube: Kube, node: PolicyNode, work: Path, vpc: str | None = None) -> Iterator[Scene]:
    """A scene in a VPC of its own (bound), everything removed after."""
    vpc = vpc or random_vpc()
    with bound(kube, vpc):
        made = Scene(kube, node, vpc, work)
        try:
            yield made
        finally:
            made.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def static_element(nad: str, address: str) -> str:
    return json.dumps([{"name": nad, "namespace": "default", "ips": [address]}])


FLOOD = r"""
import socket, sys, time
dst, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, n = time.monotonic() + seconds, 0
print("started", flush=True)
while time.monotonic() < end:
    try:
        sock.sendto(f"flood-{n}".encode(), (dst, port))
    except OSError:
        pass
    n += 1
    time.sleep(0.002)
"""


@pytest.mark.both_paths
def test_a_pod_added_under_a_deny_all_is_unreachable_from_its_first_packet(
        kube: Kube, node: PolicyNode, tmp_path: Path) -> None:
    nad, guarded, open_ns = unique("deny-first"), unique("guarded"), unique("open")
    with scene(kube, node, tmp_path) as made:
        made.nad(manifest_nad(nad, ""))
        for namespace in (guarded, open_ns):
            made.namespace(manifest_namespace(namespace))
        made.policy(manifest_policy("deny-all", guarded, f"default/{nad}", DENY_ALL))
        client = made.pod(manifest_pod("client", open_ns, {}, static_element(nad,
                                                                            "10.61.0.9/24")))
        # Datagrams to both servers' addresses from before their ADD, all the while.
        flood = [subprocess.Popen(in_netns(client.netns, sys.executable, "-c", FLOOD, address,
                                           "5555", "30"), stdout=subprocess.PIPE, text=True)
                 for address in ("10.61.0.1", "10.61.0.2")]
        try:
            for sender in flood:
                assert sender.stdout is not None and sender.stdout.readline() == "started\n"
            server = made.pod(manifest_pod("server", guarded, {}, static_element(
                nad, "10.61.0.1/24"), listen=(("udp", 5555),)), listen_first=True)
            control = made.pod(manifest_pod("control", open_ns, {}, static_element(
                nad, "10.61.0.2/24"), listen=(("udp", 5555),)), listen_first=True)
            control_ear = control.ears[("udp", 5555)]
            wait_until("the flood reaching the Pod no policy selects",
                       lambda: any(p.startswith("flood-") for p in control_ear.payloads()),
                       SETTLE_S)
            # And once more after the guarded Pod has been up as long as the control was.
            seen = len(control_ear.payloads())
            wait_until("more of the flood at the control",
                       lambda: len(control_ear.payloads()) > seen + 10, SETTLE_S)
            assert server.ears[("udp", 5555)].payloads() == set(), \
                "a datagram reached the Pod the deny-all selected"
        finally:
            for sender in flood:
                sender.kill()
                sender.wait(timeout=10)


@pytest.mark.both_paths
def test_two_vpcs_with_the_same_subnets_never_share_a_rule(
        kube: Kube, node: PolicyNode, tmp_path: Path) -> None:
    """Both VPCs hold server .1, client .2 and client .3. In VPC one the server admits
    ipBlock .3 and Pods labelled friend in any namespace; only VPC two's .2 is a friend."""
    nad = unique("twins")
    with scene(kube, node, tmp_path / "one") as one, \
            scene(kube, node, tmp_path / "two") as two:
        first, second = unique("vpc-one"), unique("vpc-two")
        one.nad(manifest_nad(nad, ""))
        two._nads = one._nads  # the same NAD; each Pod says its VPC
        one.namespace(manifest_namespace(first))
        two.namespace(manifest_namespace(second))
        one.policy(manifest_policy("only-three-and-friends", first, f"default/{nad}", {
            "podSelector": {"matchLabels": {"role": "server"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.62.0.3/32"}},
                                  {"namespaceSelector": {},
                                   "podSelector": {"matchLabels": {"role": "friend"}}}]}]}))
        for made, namespace in ((one, first), (two, second)):
            made.pod(manifest_pod("client-2", namespace, {
                "role": "friend" if made is two else "client"},
                static_element(nad, "10.62.0.2/24")))
            made.pod(manifest_pod("client-3", namespace, {"role": "client"},
                                  static_element(nad, "10.62.0.3/24")))
        for made, namespace in ((one, first), (two, second)):
            made.pod(manifest_pod("server", namespace, {"role": "server"},
                                  static_element(nad, "10.62.0.1/24")))
        expected = {(one, first, "client-2"): False, (one, first, "client-3"): True,
                    (two, second, "client-2"): True, (two, second, "client-3"): True}
        seen: dict[tuple[Any, str, str], bool] = {}

        def holds() -> bool:
            for (made, namespace, client), _ in expected.items():
                seen[(made, namespace, client)] = made.reaches(
                    (namespace, client), (namespace, "server"), "tcp", 5555, timeout=0.5)
            return seen == expected

        wait_until("each VPC's checks", holds, SETTLE_S,
                   detail=lambda: str({(n, c): v for (_, n, c), v in seen.items()}))


@pytest.mark.both_paths
def test_bad_policies_open_nothing(kube: Kube, node: PolicyNode, tmp_path: Path) -> None:
    """An unknown protocol, a malformed CIDR, an unresolvable named port: each rule matches
    nothing, so the server stays closed to the client (a good rule beside them still opens
    what it says: the positive control)."""
    nad, namespace = unique("bad"), unique("bad-policies")
    with scene(kube, node, tmp_path) as made:
        made.nad(manifest_nad(nad, "10.63.0.0/24"))
        made.namespace(manifest_namespace(namespace))
        for name, rule in bad_rules():
            made.policy(manifest_policy(name, namespace, f"default/{nad}", {
                "podSelector": {"matchLabels": {"role": "server"}}, "ingress": [rule]}))
        made.policy(manifest_policy("good", namespace, f"default/{nad}", {
            "podSelector": {"matchLabels": {"role": "server"}},
            "ingress": [{"ports": [{"port": 6666}]}]}))
        made.pod(manifest_pod("client", namespace, {"role": "client"}, f"default/{nad}"))
        made.pod(manifest_pod("server", namespace, {"role": "server"}, f"default/{nad}",
                              listen=(("tcp", 5555), ("tcp", 6666), ("udp", 5555)),
                              ports=(("web", 7777),)))
        src, dst = (namespace, "client"), (namespace, "server")
        wait_until("the good rule's port to open", lambda: made.reaches(
            src, dst, "tcp", 6666, timeout=0.5), SETTLE_S)
        assert not made.reaches(src, dst, "tcp", 5555)
        assert not made.reaches(src, dst, "udp", 5555)


@pytest.mark.both_paths
def test_a_policy_record_of_a_newer_release_stops_the_adds_a_policy_selects(
        kube: Kube, node: PolicyNode, tmp_path: Path) -> None:
    """SPEC §18: after a rollback past a format change, a policy record is of a newer format
    than this release reads. An ADD that reads the records (a policy selects its Pod, whose
    peers they hold) refuses with code 108 naming the file, and leaves nothing; once the record
    is of this release's format again, the next Pod's ADD reads it (the positive control)."""
    nad, namespace = unique("newer"), unique("newer-format")
    with scene(kube, node, tmp_path) as made:
        made.nad(manifest_nad(nad, "10.68.0.0/24"))
        made.namespace(manifest_namespace(namespace))
        made.policy(manifest_policy("deny-all", namespace, f"default/{nad}", DENY_ALL))
        first = made.pod(manifest_pod("first", namespace, {}, f"default/{nad}"))
        [record] = node.lock_dir.glob(f"policy/{first.netns}-*.json")
        current = record.read_text()
        newer = json.loads(current)["formatVersion"] + 1
        record.write_text(json.dumps({**json.loads(current), "formatVersion": newer}))
        with pytest.raises(AddRefused) as refused:
            made.pod(manifest_pod("second", namespace, {}, f"default/{nad}"))
        answer = refused.value.answer
        assert answer.code == 108, answer.body
        assert str(record) in answer.body["msg"] and f"formatVersion {newer}" in \
            answer.body["msg"], answer.body
        second = made.pods[(namespace, "second")]
        assert links_in(second.netns) == {"lo"}, "the refused ADD left a link"
        assert list(node.lock_dir.glob(f"policy/{second.netns}-*")) == []
        record.write_text(current)
        made.pod(manifest_pod("third", namespace, {}, f"default/{nad}"))
        assert record.read_text() == current, "a reader rewrote the record"


def bad_rules() -> list[tuple[str, dict[str, Any]]]:
    """(policy name, an ingress rule each part of which a typo broke)."""
    return [("unknown-protocol", {"ports": [{"protocol": "ICMP", "port": 5555}]}),
            ("malformed-cidr", {"from": [{"ipBlock": {"cidr": "10.63.0.0/33"}}]}),
            ("malformed-except", {"from": [{"ipBlock": {"cidr": "10.63.0.0/24",
                                                        "except": ["10.63.0/25"]}}]}),
            ("unresolvable-named-port", {"ports": [{"port": "web-missing"}]})]


def events_about(kube: Kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The Events on an object, by reason (read with the admin's client)."""
    return [e for e in kube.list(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
            if (e.get("regarding") or {}).get("name") == name and e.get("reason") == reason]


def wait_for_event(kube: Kube, namespace: str, name: str, reason: str) -> dict[str, Any]:
    """The first Event of `reason` on the object, once there is one."""
    wait_until(f"the {reason} Event on {name}", lambda: bool(
        events_about(kube, namespace, name, reason)), EVENT_S)
    return events_about(kube, namespace, name, reason)[0]


def test_bad_policies_are_named_in_an_event_on_each(kube: Kube, agent_node: PolicyNode,
                                                    tmp_path: Path) -> None:
    nad, namespace = unique("bad-events"), unique("bad-events")
    with scene(kube, agent_node, tmp_path) as made:
        made.nad(manifest_nad(nad, "10.64.0.0/24"))
        made.namespace(manifest_namespace(namespace))
        for name, rule in bad_rules()[:3]:
            made.policy(manifest_policy(name, namespace, f"default/{nad}", {
                "podSelector": {}, "ingress": [rule]}))
        for name, needle in (("unknown-protocol", "unknown protocol 'ICMP'"),
                             ("malformed-cidr", "10.63.0.0/33"),
                             ("malformed-except", "10.63.0/25")):
            event = wait_for_event(kube, namespace, name, "PolicyInvalid")
            assert event["type"] == "Warning" and needle in event["note"], event
            assert event["reportingController"] == "vpc-attach.datum.net/agent"


def test_the_agent_restarted_keeps_the_rules_then_reconciles(
        kube: Kube, agent_node: PolicyNode, tmp_path: Path) -> None:
    assert agent_node.agent is not None
    nad, namespace = unique("restart"), unique("restart")
    with scene(kube, agent_node, tmp_path) as made:
        made.nad(manifest_nad(nad, "10.65.0.0/24"))
        made.namespace(manifest_namespace(namespace))
        path = made.policy(manifest_policy("deny-all", namespace, f"default/{nad}", DENY_ALL))
        client_ns = unique("restart-client")
        made.namespace(manifest_namespace(client_ns))
        made.pod(manifest_pod("client", client_ns, {}, f"default/{nad}"))
        made.pod(manifest_pod("server", namespace, {}, f"default/{nad}"))
        src, dst = (client_ns, "client"), (namespace, "server")
        assert made.reaches(dst, src, "tcp", 5555), "positive control: the datapath works"
        assert not made.reaches(src, dst, "tcp", 5555)
        agent_node.agent.stop()
        assert not made.reaches(src, dst, "tcp", 5555), "the rules stay without the agent"
        kube.delete(path)  # a change nobody follows yet
        assert not made.reaches(src, dst, "tcp", 5555)
        agent_node.agent.start()
        wait_until("the restarted agent to open the server", lambda: made.reaches(
            src, dst, "tcp", 5555, timeout=0.5), SETTLE_S)


def test_a_policy_selecting_a_tap_is_enforced_or_reported_never_silent(
        kube: Kube, agent_node: PolicyNode, tmp_path: Path) -> None:
    """A VM (stand-in: e2e/harness/tapguest.py) on a tap a deny-all selects. On a kernel
    without stateful tc (this machine's, natively), or while this release leaves taps
    unfiltered (`TAPS_FILTERED`), the client still reaches the VM, and the agent says so in a
    Warning Event on the policy, the gauge and doctor. Where taps are filtered the client does
    not reach it."""
    from cni_plugin.doctor.policy import TC_MODULES, _module_available
    from cni_plugin.policy.enforce import NO_STATEFUL_TC, TAPS_FILTERED, TAPS_NOT_YET
    filters_taps = TAPS_FILTERED and all(_module_available(module) for module in TC_MODULES)
    nad, tap_nad, namespace, client_ns = (unique("tap-peer"), unique("tap"), unique("tap"),
                                          unique("tap-client"))
    with scene(kube, agent_node, tmp_path) as made:
        for name in (namespace, client_ns):
            made.namespace(manifest_namespace(name))
        made.policy(manifest_policy("deny-all", namespace, f"default/{tap_nad}", DENY_ALL))
        made.nad(manifest_nad(nad, "10.66.0.0/24"))
        made.nad(manifest_nad(tap_nad, "10.66.1.0/24"), attachment="tap")
        made.pod(manifest_pod("client", client_ns, {}, f"default/{nad}"))
        made.pod(manifest_pod("vm", namespace, {}, f"default/{tap_nad}", listen=()))
        with made.guest(namespace, "vm") as guest:
            ear = made.guest_listener(guest, "tcp", 5555)
            reached = made.reaches_address((client_ns, "client"), guest.ip(4), ear, "tcp",
                                           5555)
            if filters_taps:
                assert not reached, "the deny-all let the client reach the VM"
                assert not events_about(kube, namespace, "deny-all", "PolicyNotEnforced")
                return
            assert reached, "positive control: nothing filters the tap"
            event = wait_for_event(kube, namespace, "deny-all", "PolicyNotEnforced")
            reason = NO_STATEFUL_TC if TAPS_FILTERED else TAPS_NOT_YET
            assert reason in event["note"] and f"Pod {namespace}/vm" in event["note"]
            wait_until("the gauge to count the tap", lambda: scrape(agent_node).get(
                "vpc_attach_policy_unenforced", 0) >= 1, EVENT_S)
            checks = doctor(agent_node)
            assert checks["policy.unenforced"]["status"] == "warn"
            assert f"Pod {namespace}/vm" in checks["policy.unenforced"]["detail"]
            assert checks["policy.kernel"]["status"] == ("ok" if not TAPS_FILTERED else "warn")


def doctor(node: PolicyNode) -> dict[str, dict[str, str]]:
    """`vpc-attach doctor --json` on the node: its findings by check."""
    done = subprocess.run(in_netns(node.netns, str(node.plugin.cni_bin / "vpc-attach"),
                                   "doctor", "--json"), capture_output=True, text=True,
                          timeout=120, env={**os.environ, **node.environ,
                                            "VPC_ATTACH_AGENT_SOCKET": node.plugin.agent_socket})
    return {f["check"]: f for f in json.loads(done.stdout)["checks"]}


@pytest.fixture(scope="module")
def enforcing_node(cluster: Any, cni_bin: Path, own_agents: OwnAgents,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyNode]:
    """A node whose host setting `networkPolicy` is `enforce`."""
    with policy_node(cluster, cni_bin, tmp_path_factory.mktemp("policy-np-node"), own_agents,
                     via_agent=VIA_AGENT,
                     extra_env={"VPC_ATTACH_NETWORK_POLICY": "enforce"}) as made:
        yield made


@pytest.mark.both_paths
@pytest.mark.parametrize("enforcing", [True, False], ids=["enforce", "off"])
def test_network_policy_holds_on_the_conflist_attachment_only_where_the_node_enforces_it(
        kube: Kube, node: PolicyNode, enforcing_node: PolicyNode, tmp_path: Path,
        enforcing: bool) -> None:
    """A NetworkPolicy denying the server's ingress: enforced on its conflist attachment (the
    Pod's eth0) where the node says `enforce`, left to another component where it says
    `off`; a MultiNetworkPolicy denying everything in the namespace never applies to it."""
    where = enforcing_node if enforcing else node
    namespace, client_ns = unique("np"), unique("np-client")
    with scene(kube, where, tmp_path) as made:
        for name in (namespace, client_ns):
            made.namespace(manifest_namespace(name))
        made.policy(manifest_policy("deny", namespace, None, DENY_ALL, kind="NetworkPolicy"))
        made.policy(manifest_policy("deny-nad", namespace, "default/any-nad", {
            "podSelector": {}, "policyTypes": ["Ingress", "Egress"]}))
        conflist = primary_conflist(tmp_path / "ipam", "10.67.0.0/24")
        made.pod(manifest_pod("client", client_ns, {}, ""), conflist=conflist)
        made.pod(manifest_pod("server", namespace, {}, ""), conflist=conflist)
        src, dst = (client_ns, "client"), (namespace, "server")
        assert made.reaches(dst, src, "tcp", 5555, ifname="eth0"), \
            "positive control: the server's egress is open (only the MNP would close it)"
        assert made.reaches(src, dst, "tcp", 5555, ifname="eth0") is not enforcing


def primary_conflist(data_dir: Path, subnet: str) -> dict[str, Any]:
    """The node's conflist for Pods' primary network (vpc-attach first, as the runtime runs
    it on eth0), its Pods choosing their attachment."""
    return {"cniVersion": "1.0.0", "name": "primary", "type": "vpc-attach", "vpcFromPod": True,
            "isolation": "table",
            "publish": {"bgp": False, "endpointSlice": True,
                        "endpointSliceFamilies": ["IPv6", "IPv4"]},
            "ipam": {"type": "host-local", "subnet": subnet, "dataDir": str(data_dir)}}


def test_a_port_range_opens_each_of_its_ports_and_no_other(
        kube: Kube, enforcing_node: PolicyNode, tmp_path: Path) -> None:
    """`endPort` (SPEC §17), both directions, its ends included: the server admits 5500-5700,
    the client sends to 5600-5800; a port only one of them allows stays closed. NetworkPolicy
    (on the conflist attachment, where the node enforces it); a MultiNetworkPolicy's range is
    upstream's iptables/port-range (the upstream cases' module); one compiler serves both."""
    namespace, client_ns = unique("range"), unique("range-client")
    ports = {5550: False, 5600: True, 5650: True, 5700: True, 5750: False}
    with scene(kube, enforcing_node, tmp_path) as made:
        for name in (namespace, client_ns):
            made.namespace(manifest_namespace(name))
        made.policy(manifest_policy("server-in", namespace, None, {
            "podSelector": {}, "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": 5500, "endPort": 5700}]}]},
            kind="NetworkPolicy"))
        made.policy(manifest_policy("client-out", client_ns, None, {
            "podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"protocol": "TCP", "port": 5600, "endPort": 5800}]}]},
            kind="NetworkPolicy"))
        conflist = primary_conflist(tmp_path / "ipam", "10.67.2.0/24")
        made.pod(manifest_pod("client", client_ns, {}, ""), conflist=conflist)
        made.pod(manifest_pod("server", namespace, {}, "",
                              listen=tuple(("tcp", port) for port in ports)),
                 conflist=conflist)
        src, dst = (client_ns, "client"), (namespace, "server")
        seen: dict[int, bool] = {}

        def all_hold() -> bool:
            seen.update({port: made.reaches(src, dst, "tcp", port, ifname="eth0", timeout=0.5)
                         for port in ports})
            return seen == ports

        wait_until("each port of the ranges to be open or closed as they say", all_hold,
                   SETTLE_S, interval=0.1, detail=lambda: f"connected {seen}, expected {ports}")
