"""The policy compiler (cni_plugin/policy): parsing, the compiled rules against a reference
reading of NetworkPolicy's semantics, and the nftables rendering's structure (pure)."""

from __future__ import annotations

import ipaddress
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_plugin.kube.networks import NetworkName
from cni_plugin.policy.compile import (
    PRIMARY,
    Compiled,
    Compiler,
    Endpoint,
    NetworkRef,
    PodFacts,
    PortRange,
    Target,
    World,
    compile_target,
)
from cni_plugin.policy.model import MULTI, NETWORK_POLICY, parse_policy, subtract
from cni_plugin.policy.nft import merged_ranges, render, table_name

NAD_A, NAD_B = NetworkName("default", "net-a"), NetworkName("other", "net-b")
LABELS = ("web", "db", "cache")
ADDRESSES = [f"10.9.0.{i}" for i in range(1, 5)] + [f"fd00:9::{i}" for i in range(1, 3)]


def mnp(name: str, spec: dict[str, Any], networks: str = "default/net-a",
        namespace: str = "ns1") -> dict[str, Any]:
    return {"kind": MULTI, "metadata": {
        "name": name, "namespace": namespace, "uid": f"uid-{name}",
        "annotations": {"k8s.v1.cni.cncf.io/policy-for": networks}}, "spec": spec}


def test_unknown_protocol_malformed_cidr_and_bad_end_port_match_nothing_and_are_named() -> None:
    policy = parse_policy(mnp("bad", {
        "podSelector": {},
        "ingress": [
            {"ports": [{"protocol": "ICMP", "port": 1}]},
            {"from": [{"ipBlock": {"cidr": "10.0.0/33"}}]},
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["nonsense"]}}]},
            {"ports": [{"port": 90, "endPort": 80}]},
        ]}))
    assert len(policy.problems) == 4, policy.problems
    assert "unknown protocol 'ICMP'" in policy.problems[0]
    world = _world([policy.__class__(**{**policy.__dict__})], pods={"a": {}, "b": {}},
                   endpoints={"b": ["10.9.0.2"]})
    compiled = compile_target(world, Target("ns1", "a", NAD_A, "v1"))
    assert compiled.ingress.isolated
    # Nothing opened: the malformed peers match nobody, the bad ports no port.
    assert all(allow.peers == () for allow in compiled.ingress.allows), compiled


def test_a_policy_without_policy_for_applies_to_no_network() -> None:
    obj = mnp("nofor", {"podSelector": {}, "ingress": []})
    del obj["metadata"]["annotations"]
    policy = parse_policy(obj)
    assert policy.networks == () and "policy-for" in policy.problems[0]
    world = _world([policy], pods={"a": {}})
    assert not compile_target(world, Target("ns1", "a", NAD_A, "v1")).enforced


def test_policy_for_without_namespace_is_the_policys() -> None:
    policy = parse_policy(mnp("p", {"podSelector": {}}, networks="net-a, other/net-b",
                              namespace="default"))
    assert policy.networks == (NAD_A, NAD_B)


def test_policy_types_default_as_network_policys() -> None:
    ingress_only = parse_policy(mnp("p", {"podSelector": {}}))
    with_egress = parse_policy(mnp("p", {"podSelector": {}, "egress": [{}]}))
    egress_only = parse_policy(mnp("p", {"podSelector": {}, "policyTypes": ["Egress"]}))
    assert (ingress_only.isolates_ingress, ingress_only.isolates_egress) == (True, False)
    assert (with_egress.isolates_ingress, with_egress.isolates_egress) == (True, True)
    assert (egress_only.isolates_ingress, egress_only.isolates_egress) == (False, True)


def test_kinds_keep_to_their_networks() -> None:
    multi = parse_policy(mnp("m", {"podSelector": {}}))
    plain = parse_policy({"kind": NETWORK_POLICY, "metadata": {"name": "n", "namespace": "ns1"},
                          "spec": {"podSelector": {}}})
    for network_policy in (False, True):
        world = _world([multi, plain], pods={"a": {}}, network_policy=network_policy)
        on_nad = compile_target(world, Target("ns1", "a", NAD_A, "v1"))
        on_conflist = compile_target(world, Target("ns1", "a", PRIMARY, "v1"))
        assert on_nad.policies == ("MultiNetworkPolicy ns1/m",)
        assert on_conflist.policies == (("NetworkPolicy ns1/n",) if network_policy else ())


def test_peers_of_another_vpc_with_the_same_addresses_are_never_allowed() -> None:
    policy = parse_policy(mnp("p", {"podSelector": {"matchLabels": {"app": "db"}},
                                    "ingress": [{"from": [{"podSelector": {}}]}]}))
    world = World([policy], {("ns1", "db"): PodFacts("ns1", "db", {"app": "db"}),
                             ("ns1", "web"): PodFacts("ns1", "web", {"app": "web"})},
                  {"ns1": {}},
                  [Endpoint("ns1", "web", NAD_A, "other-vpc", (ipaddress.ip_address("10.9.0.1"),))])
    compiled = compile_target(world, Target("ns1", "db", NAD_A, "v1"))
    assert compiled.ingress.isolated and compiled.ingress.allows[0].peers == ()


def test_named_ports_resolve_on_the_pod_that_owns_them_and_fail_closed() -> None:
    policy = parse_policy(mnp("p", {
        "podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"ports": [{"port": "sql"}]}, {"ports": [{"port": "missing"}]}],
        "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "http"}]}]}))
    pods = {("ns1", "db"): PodFacts("ns1", "db", {"app": "db"}, {("sql", "TCP"): 5432}),
            ("ns1", "web"): PodFacts("ns1", "web", {"app": "web"}, {("http", "TCP"): 8080}),
            ("ns1", "api"): PodFacts("ns1", "api", {"app": "api"}, {("http", "TCP"): 9090}),
            ("ns1", "udp"): PodFacts("ns1", "udp", {"app": "udp"}, {("http", "UDP"): 80})}
    endpoints = [Endpoint("ns1", name, NAD_A, "v1", (ipaddress.ip_address(f"10.9.0.{i}"),))
                 for i, (_, name) in enumerate(pods, start=1)]
    compiled = compile_target(World([policy], pods, {"ns1": {}}, endpoints),
                              Target("ns1", "db", NAD_A, "v1"))
    assert [(a.peers, a.ports) for a in compiled.ingress.allows] == [
        (None, ((_tcp(5432)),))]
    assert sorted((str(a.peers[0]), a.ports[0].first) for a in compiled.egress.allows
                  if a.peers and a.ports) == [("10.9.0.2/32", 8080), ("10.9.0.3/32", 9090)]


def test_an_egress_named_port_resolves_on_the_pods_an_ip_block_holds_and_only_their_addresses_in_it(
) -> None:
    # The case hypothesis found: a Pod at 10.9.0.1 naming 7001 "http" is reached through an
    # ipBlock; its IPv6 address outside the block is not, and a Pod at an excepted address is not.
    policy = parse_policy(mnp("p", {
        "podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.9.0.0/29", "except": ["10.9.0.2/31"]}}],
                    "ports": [{"port": "http"}]}]}))
    pods = {("ns1", "db"): PodFacts("ns1", "db", {"app": "db"}),
            ("ns1", "web"): PodFacts("ns1", "web", {"app": "web"}, {("http", "TCP"): 7001}),
            ("ns1", "cut"): PodFacts("ns1", "cut", {"app": "cut"}, {("http", "TCP"): 7002})}
    endpoints = [Endpoint("ns1", "web", NAD_A, "v1", (ipaddress.ip_address("10.9.0.1"),
                                                      ipaddress.ip_address("fd00::1"))),
                 Endpoint("ns1", "cut", NAD_A, "v1", (ipaddress.ip_address("10.9.0.2"),))]
    compiled = compile_target(World([policy], pods, {"ns1": {}}, endpoints),
                              Target("ns1", "db", NAD_A, "v1"))
    assert [(tuple(map(str, a.peers or ())), a.ports) for a in compiled.egress.allows] == [
        (("10.9.0.1/32",), (_tcp(7001),))]


def _tcp(port: int) -> Any:
    from cni_plugin.policy.compile import PortRange
    return PortRange("TCP", port, port)


@given(st.lists(st.integers(0, 32), max_size=4), st.integers(8, 24))
def test_subtract_leaves_exactly_the_cidr_less_its_excepts(cuts: list[int], length: int) -> None:
    cidr = ipaddress.ip_network(f"10.0.0.0/{length}")
    excepts = [ipaddress.ip_network(f"10.0.{cut}.0/{max(length, 24)}", strict=False)
               for cut in cuts]
    kept = subtract(cidr, excepts)
    for net in kept:
        assert net.subnet_of(cidr) and not any(net.overlaps(cut) for cut in excepts)  # type: ignore[arg-type]
    for first, second in itertools.pairwise(kept):
        assert not first.overlaps(second)
    covered = sum(net.num_addresses for net in kept)
    cut_away = {cut for cut in excepts if cut.subnet_of(cidr)}  # type: ignore[arg-type]
    assert covered == cidr.num_addresses - sum(c.num_addresses for c in _disjoint(cut_away))


def _disjoint(nets: set[Any]) -> list[Any]:
    return list(ipaddress.collapse_addresses(nets))


@given(st.lists(st.tuples(st.integers(1, 200), st.integers(0, 20)), min_size=1, max_size=8))
def test_merged_port_ranges_cover_the_same_ports(spans: list[tuple[int, int]]) -> None:
    from cni_plugin.policy.compile import PortRange
    ranges = [PortRange("TCP", first, first + extra) for first, extra in spans]
    merged = merged_ranges(ranges)
    wanted = {p for r in ranges for p in range(r.first or 0, (r.last or 0) + 1)}
    assert {p for first, last in merged for p in range(first, last + 1)} == wanted
    assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(merged))


# A reference reading of the semantics, straight from the policy objects, against which the
# compiled allows are checked for random policies, Pods and packets.

def _reference_allows(world: World, target: Target, direction: str, peer: str, protocol: str,
                      port: int) -> bool:
    address = ipaddress.ip_address(peer)
    isolating = [p for p in world.policies if p.namespace == target.namespace
                 and target.network in p.networks and p.pod_selector is not None
                 and p.pod_selector.matches(world.pods[(target.namespace, target.pod)].labels)
                 and (p.isolates_ingress if direction == "ingress" else p.isolates_egress)]
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy.ingress if direction == "ingress" else policy.egress:
            peer_pods = _pods_at(world, target, policy, address)
            if rule.peers is not None and not any(
                    _peer_matches(world, policy, item, address, peer_pods) for item in rule.peers):
                continue
            if rule.ports is None:
                return True
            for spec in rule.ports:
                if spec.never or spec.protocol != protocol:
                    continue
                if spec.port is None:
                    return True
                if isinstance(spec.port, int):
                    if spec.port <= port <= (spec.end_port or spec.port):
                        return True
                    continue
                owners = [(target.namespace, target.pod)] if direction == "ingress" \
                    else peer_pods
                if any(world.pods[owner].named_ports.get((spec.port, protocol)) == port
                       for owner in owners):
                    return True
    return False


def _pods_at(world: World, target: Target, policy: Any, address: Any) -> list[tuple[str, str]]:
    return [(e.namespace, e.pod) for e in world.endpoints if e.vpc == target.vpc
            and e.network in policy.networks and address in e.addresses]


def _peer_matches(world: World, policy: Any, peer: Any, address: Any,
                  pods: list[tuple[str, str]]) -> bool:
    if peer.never:
        return False
    if peer.ip_block is not None:
        return any(address in net for net in peer.ip_block)
    for namespace, name in pods:
        in_namespace = namespace == policy.namespace if peer.namespace_selector is None \
            else peer.namespace_selector.matches(world.namespaces[namespace])
        if in_namespace and (peer.pod_selector is None or
                             peer.pod_selector.matches(world.pods[(namespace, name)].labels)):
            return True
    return False


def _compiled_allows(compiled: Compiled, direction: str, peer: str, protocol: str,
                     port: int) -> bool:
    chosen = compiled.ingress if direction == "ingress" else compiled.egress
    if not chosen.isolated:
        return True
    address = ipaddress.ip_address(peer)
    for allow in chosen.allows:
        if allow.peers is not None and not any(address in net for net in allow.peers):
            continue
        if allow.ports is None or any(
                r.protocol == protocol and (r.first is None or r.first <= port <= (r.last or 0))
                for r in allow.ports):
            return True
    return False


selectors = st.one_of(st.just({}), st.builds(lambda v: {"matchLabels": {"app": v}},
                                             st.sampled_from(LABELS)),
                      st.builds(lambda vs: {"matchExpressions": [
                          {"key": "app", "operator": "In", "values": vs}]},
                          st.lists(st.sampled_from(LABELS), min_size=1, max_size=2)))
ports = st.one_of(st.integers(1, 6).map(lambda p: {"port": 7000 + p}),
                  st.builds(lambda p, e: {"port": 7000 + p, "endPort": 7000 + p + e},
                            st.integers(1, 4), st.integers(0, 3)),
                  st.sampled_from([{"port": "http"}, {"port": "sql"}, {"protocol": "UDP"},
                                   {"protocol": "SCTP", "port": 7001}, {"port": "nope"}]))
peers = st.one_of(
    st.builds(lambda s: {"podSelector": s}, selectors),
    st.builds(lambda n: {"namespaceSelector": n}, selectors),
    st.builds(lambda s, n: {"podSelector": s, "namespaceSelector": n}, selectors, selectors),
    st.sampled_from([{"ipBlock": {"cidr": "10.9.0.0/29", "except": ["10.9.0.2/31"]}},
                     {"ipBlock": {"cidr": "fd00:9::/126"}}, {"ipBlock": {"cidr": "bad"}}]))
rules = st.builds(lambda p, q: {k: v for k, v in (("from", p), ("ports", q)) if v is not None},
                  st.one_of(st.none(), st.lists(peers, max_size=3)),
                  st.one_of(st.none(), st.lists(ports, max_size=3)))
specs = st.builds(
    lambda sel, types, ingress, egress: {k: v for k, v in (
        ("podSelector", sel), ("policyTypes", types), ("ingress", ingress),
        ("egress", [{("to" if k == "from" else k): v for k, v in r.items()} for r in egress]
         if egress is not None else None)) if v is not None},
    selectors, st.one_of(st.none(), st.sampled_from([["Ingress"], ["Egress"],
                                                     ["Ingress", "Egress"]])),
    st.one_of(st.none(), st.lists(rules, max_size=3)),
    st.one_of(st.none(), st.lists(rules, max_size=3)))


# Policies as a test makes them: (spec, namespace, the networks it is for).
MADE_POLICIES = st.lists(st.tuples(specs, st.sampled_from(["ns1", "ns2"]),
                                   st.sampled_from(["default/net-a", "other/net-b"])),
                         min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(MADE_POLICIES,
       st.lists(st.tuples(st.sampled_from(LABELS), st.sampled_from(["ns1", "ns2"]),
                          st.sampled_from([NAD_A, NAD_B]), st.sampled_from(["v1", "v2"]),
                          st.sampled_from(ADDRESSES), st.integers(7001, 7006)),
                min_size=1, max_size=6))
def test_compiled_allows_match_networkpolicy_semantics(
        made: list[tuple[dict[str, Any], str, str]],
        others: list[tuple[str, str, NetworkRef, str, str, int]]) -> None:
    policies = [parse_policy(mnp(f"p{i}", spec, networks, namespace))
                for i, (spec, namespace, networks) in enumerate(made)]
    pods = {("ns1", "target"): PodFacts("ns1", "target", {"app": "db"},
                                        {("sql", "TCP"): 7003})}
    endpoints = []
    for i, (label, namespace, network, vpc, address, http) in enumerate(others):
        pods[(namespace, f"pod{i}")] = PodFacts(namespace, f"pod{i}", {"app": label},
                                                {("http", "TCP"): http})
        endpoints.append(Endpoint(namespace, f"pod{i}", network, vpc,
                                  (ipaddress.ip_address(address),)))
    world = World(policies, pods, {"ns1": {"app": "web"}, "ns2": {"app": "db"}}, endpoints)
    target = Target("ns1", "target", NAD_A, "v1")
    compiled = compile_target(world, target)
    for direction in ("ingress", "egress"):
        for peer in (*ADDRESSES, "192.0.2.1"):
            for protocol in ("TCP", "UDP", "SCTP"):
                for port in range(7000, 7009):
                    assert _compiled_allows(compiled, direction, peer, protocol, port) == \
                        _reference_allows(world, target, direction, peer, protocol, port), \
                        (direction, peer, protocol, port, compiled)
    if compiled.enforced:  # and the rendering keeps one set per rule and family
        table = render("net1", compiled)
        assert table.name == table_name("net1")
        assert all(name in table.structure for name in table.elements)


@settings(max_examples=150, deadline=None)
@given(MADE_POLICIES,
       st.lists(st.tuples(st.sampled_from(LABELS), st.sampled_from(["ns1", "ns2"]),
                          st.sampled_from([NAD_A, NAD_B]), st.sampled_from(["v1", "v2"]),
                          st.sampled_from(ADDRESSES)),
                min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_one_compiler_for_every_attachment_compiles_each_as_if_alone(
        made: list[tuple[dict[str, Any], str, str]],
        others: list[tuple[str, str, NetworkRef, str, str]], order: Any) -> None:
    """The agent's pass shares one Compiler (its memo) across the node's attachments: what it
    gives each must be what a compiler of that attachment alone gives."""
    policies = [parse_policy(mnp(f"p{i}", spec, networks, namespace))
                for i, (spec, namespace, networks) in enumerate(made)]
    pods, endpoints, targets = {}, [], []
    for i, (label, namespace, network, vpc, address) in enumerate(others):
        port = 7001 + i  # each Pod names its own
        pods[(namespace, f"pod{i}")] = PodFacts(namespace, f"pod{i}", {"app": label},
                                                {("http", "TCP"): port, ("sql", "TCP"): port})
        endpoints.append(Endpoint(namespace, f"pod{i}", network, vpc,
                                  (ipaddress.ip_address(address),)))
        # Every Pod as the target on both networks in both VPCs (attachments of one Pod).
        targets += [Target(namespace, f"pod{i}", on, in_vpc)
                    for on in (NAD_A, NAD_B) for in_vpc in ("v1", "v2")]
    world = World(policies, pods, {"ns1": {"app": "web"}, "ns2": {"app": "db"}}, endpoints)
    order.shuffle(targets)
    shared = Compiler(world)
    for target in targets:
        assert shared.compile(target) == Compiler(world).compile(target), target


def test_one_compiler_keeps_each_attachments_vpc_and_named_ports_its_own() -> None:
    policy = parse_policy(mnp("p", {"podSelector": {}, "ingress": [
        {"from": [{"podSelector": {}}], "ports": [{"port": "http"}]}]}))
    pods = {("ns1", name): PodFacts("ns1", name, {}, {("http", "TCP"): port})
            for name, port in (("a", 8080), ("b", 9090))}
    world = World([policy], pods, {"ns1": {}},
                  [Endpoint("ns1", "a", NAD_A, "v1", (ipaddress.ip_address("10.9.0.1"),)),
                   Endpoint("ns1", "b", NAD_A, "v2", (ipaddress.ip_address("10.9.0.1"),)),
                   Endpoint("ns1", "b", NAD_A, "v1", (ipaddress.ip_address("10.9.0.2"),))])
    compiler = Compiler(world)
    in_v1, in_v2 = (compiler.compile(Target("ns1", "b", NAD_A, vpc)) for vpc in ("v1", "v2"))
    a_in_v1 = compiler.compile(Target("ns1", "a", NAD_A, "v1"))
    assert [[str(net) for net in allow.peers or ()]
            for allow in (*in_v1.ingress.allows, *in_v2.ingress.allows)] == \
        [["10.9.0.1/32", "10.9.0.2/32"], ["10.9.0.1/32"]]  # each VPC's peers alone
    assert [allow.ports for allow in (*in_v1.ingress.allows, *a_in_v1.ingress.allows)] == \
        [(PortRange("TCP", 9090, 9090),), (PortRange("TCP", 8080, 8080),)]  # each Pod's port


def test_one_compiler_keeps_each_pod_selectors_pods_its_own() -> None:
    policies = [parse_policy(mnp(name, {"podSelector": {"matchLabels": {"app": "db"}},
                                        "ingress": [{"from": [{"podSelector": peers}],
                                                     "ports": [{"port": port}]}]}))
                for name, peers, port in (
                    ("from-web", {"matchLabels": {"app": "web"}}, 80),
                    ("from-cache", {"matchExpressions": [
                        {"key": "app", "operator": "In", "values": ["cache"]}]}, 81),
                    ("from-any", {}, 82))]
    world = _world(policies, pods={"db": {"app": "db"}, "web": {"app": "web"},
                                   "cache": {"app": "cache"}},
                   endpoints={"web": ["10.9.0.1"], "cache": ["10.9.0.2"], "db": ["10.9.0.3"]})
    compiled = Compiler(world).compile(Target("ns1", "db", NAD_A, "v1"))
    assert {allow.origin: [str(net) for net in allow.peers or ()]
            for allow in compiled.ingress.allows} == {
        "ns1/from-any ingress[0]": ["10.9.0.1/32", "10.9.0.2/32", "10.9.0.3/32"],
        "ns1/from-cache ingress[0]": ["10.9.0.2/32"],
        "ns1/from-web ingress[0]": ["10.9.0.1/32"]}


def test_peers_changing_rewrite_sets_not_rules() -> None:
    policy = parse_policy(mnp("p", {"podSelector": {"matchLabels": {"app": "db"}},
                                    "ingress": [{"from": [{"podSelector": {}}],
                                                 "ports": [{"port": 5432}]}]}))
    before = _world([policy], pods={"db": {"app": "db"}, "web": {}},
                    endpoints={"web": ["10.9.0.1"]})
    after = _world([policy], pods={"db": {"app": "db"}, "web": {}, "api": {}},
                   endpoints={"web": ["10.9.0.1"], "api": ["10.9.0.2", "fd00:9::2"]})
    target = Target("ns1", "db", NAD_A, "v1")
    old, new = (render("net1", compile_target(w, target)) for w in (before, after))
    update = new.update_from(old)
    assert update == ("flush set inet vpc_attach_policy_net1 i0_4\n"
                      "add element inet vpc_attach_policy_net1 i0_4 { 10.9.0.1/32, 10.9.0.2/32 }\n"
                      "flush set inet vpc_attach_policy_net1 i0_6\n"
                      "add element inet vpc_attach_policy_net1 i0_6 { fd00:9::2/128 }\n")
    assert new.update_from(new) == ""


@pytest.mark.parametrize("ifname, table", [("net1", "vpc_attach_policy_net1"),
                                           ("eth-0", "vpc_attach_policy_xa9d1c7c8c0b4")])
def test_table_names_are_identifiers(ifname: str, table: str) -> None:
    assert table_name(ifname)[:len(table) - 12] == table[:len(table) - 12]


def _world(policies: list[Any], *, pods: dict[str, dict[str, str]],
           endpoints: dict[str, list[str]] | None = None, network_policy: bool = False) -> World:
    return World(policies, {("ns1", name): PodFacts("ns1", name, labels)
                            for name, labels in pods.items()}, {"ns1": {}},
                 [Endpoint("ns1", name, NAD_A, "v1",
                           tuple(ipaddress.ip_address(a) for a in addresses))
                  for name, addresses in (endpoints or {}).items()], network_policy)
