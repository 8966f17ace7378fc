"""MultiNetworkPolicy and NetworkPolicy as read from the API server, typed (pure).

Both kinds share Kubernetes NetworkPolicy's spec; a MultiNetworkPolicy also names the networks
it is for (`k8s.v1.cni.cncf.io/policy-for`). Parsing never fails a whole policy for a bad part:
a part that cannot be read matches nothing and is named in `Policy.problems` (what the agent's
Event says), so a typo never opens traffic (an unknown protocol, a malformed CIDR or `except`,
an `endPort` below its port) and what the rest of the policy says still holds.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cni_plugin.kube.networks import NetworkName
from cni_plugin.tenancy.bindings import MalformedBinding, Selector

MULTI = "MultiNetworkPolicy"
NETWORK_POLICY = "NetworkPolicy"
POLICY_FOR_ANNOTATION = "k8s.v1.cni.cncf.io/policy-for"
PROTOCOLS = ("TCP", "UDP", "SCTP")
MAX_PORT = 65535

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PortSpec:
    """One `ports` entry: a protocol and a port (a number, a container port's name, or None
    for every port), up to `end_port`; `never` when it could not be read (matches nothing)."""

    protocol: str
    port: int | str | None
    end_port: int | None = None
    never: bool = False


@dataclass(frozen=True)
class Peer:
    """One `from`/`to` entry. With both selectors, a Pod must match both (AND); `ip_block` is
    the CIDR with its `except`s taken out, as disjoint networks; `never`: unreadable."""

    pod_selector: Selector | None = None
    namespace_selector: Selector | None = None
    ip_block: tuple[Network, ...] | None = None
    never: bool = False


@dataclass(frozen=True)
class Rule:
    """An ingress or egress rule: `peers` None = every peer, `ports` None = every port."""

    peers: tuple[Peer, ...] | None
    ports: tuple[PortSpec, ...] | None


@dataclass(frozen=True)
class Policy:
    """A policy of either kind, as the compiler reads it."""

    kind: str
    namespace: str
    name: str
    uid: str
    networks: tuple[NetworkName, ...]  # policy-for (MultiNetworkPolicy); () for NetworkPolicy
    pod_selector: Selector | None  # None: unreadable, selects no Pod
    isolates_ingress: bool
    isolates_egress: bool
    ingress: tuple[Rule, ...]
    egress: tuple[Rule, ...]
    problems: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        """`Kind namespace/name`, how logs and Events name it."""
        return f"{self.kind} {self.namespace}/{self.name}"


def parse_policy(obj: Mapping[str, Any], kind: str | None = None) -> Policy:
    """A MultiNetworkPolicy or NetworkPolicy object as a Policy (never raises for its
    content: what cannot be read is in `problems` and matches nothing). `kind` names it where
    the object does not (the items of a LIST carry no kind)."""
    meta = obj.get("metadata") or {}
    kind = kind or str(obj.get("kind") or NETWORK_POLICY)
    namespace = str(meta.get("namespace") or "")
    found = obj.get("spec")
    spec: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    problems: list[str] = []
    networks: tuple[NetworkName, ...] = ()
    if kind == MULTI:
        networks = _policy_for(meta.get("annotations") or {}, namespace, problems)
    selector = _selector(spec.get("podSelector", {}), "podSelector", problems)
    ingress = _rules(spec.get("ingress"), "ingress", "from", problems)
    egress = _rules(spec.get("egress"), "egress", "to", problems)
    isolates_ingress, isolates_egress = _policy_types(spec, problems)
    return Policy(kind, namespace, str(meta.get("name") or ""), str(meta.get("uid") or ""),
                  networks, selector, isolates_ingress, isolates_egress, ingress, egress,
                  tuple(problems))


def _policy_for(annotations: Mapping[str, Any], namespace: str,
                problems: list[str]) -> tuple[NetworkName, ...]:
    value = str(annotations.get(POLICY_FOR_ANNOTATION) or "")
    names = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        nad_namespace, slash, name = item.partition("/")
        if not slash:
            nad_namespace, name = namespace, item
        if not name or "/" in name:
            problems.append(f"{POLICY_FOR_ANNOTATION}: {item!r} names no network")
            continue
        names.append(NetworkName(nad_namespace, name))
    if not names:
        problems.append(f"no {POLICY_FOR_ANNOTATION} annotation: the policy applies to no "
                        "network")
    return tuple(names)


def _policy_types(spec: Mapping[str, Any], problems: list[str]) -> tuple[bool, bool]:
    """As NetworkPolicy defaults them: Ingress always, Egress when there are egress rules."""
    types = spec.get("policyTypes")
    if not types:
        return True, bool(spec.get("egress"))
    if not isinstance(types, list):
        problems.append("policyTypes is not a list")
        return True, bool(spec.get("egress"))
    unknown = [t for t in types if t not in ("Ingress", "Egress")]
    if unknown:
        problems.append(f"policyTypes: unknown {unknown!r} ignored")
    return "Ingress" in types, "Egress" in types


def _selector(data: Any, where: str, problems: list[str]) -> Selector | None:
    try:
        return Selector.parse(data if data is not None else {})
    except MalformedBinding as exc:
        problems.append(f"{where}: {exc.args[0].replace('namespaceSelector', 'selector')}")
        return None


def _rules(data: Any, direction: str, peer_key: str, problems: list[str]) -> tuple[Rule, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        problems.append(f"{direction} is not a list")
        return ()
    rules = []
    for index, item in enumerate(data):
        where = f"{direction}[{index}]"
        if not isinstance(item, Mapping):
            problems.append(f"{where} is not an object")
            continue
        rules.append(Rule(_peers(item.get(peer_key), f"{where}.{peer_key}", problems),
                          _ports(item.get("ports"), f"{where}.ports", problems)))
    return tuple(rules)


def _peers(data: Any, where: str, problems: list[str]) -> tuple[Peer, ...] | None:
    if not data:
        return None  # absent or empty: every peer
    if not isinstance(data, list):
        problems.append(f"{where} is not a list: matches nothing")
        return (Peer(never=True),)
    return tuple(_peer(item, f"{where}[{index}]", problems) for index, item in enumerate(data))


def _peer(item: Any, where: str, problems: list[str]) -> Peer:
    if not isinstance(item, Mapping):
        problems.append(f"{where} is not an object: matches nothing")
        return Peer(never=True)
    block = item.get("ipBlock")
    if block is not None:
        if "podSelector" in item or "namespaceSelector" in item:
            problems.append(f"{where}: ipBlock with a selector: matches nothing")
            return Peer(never=True)
        return _ip_block(block, where, problems)
    if "podSelector" not in item and "namespaceSelector" not in item:
        problems.append(f"{where}: neither podSelector, namespaceSelector nor ipBlock: "
                        "matches nothing")
        return Peer(never=True)
    pods = _selector(item["podSelector"], f"{where}.podSelector", problems) \
        if "podSelector" in item else None
    spaces = _selector(item["namespaceSelector"], f"{where}.namespaceSelector", problems) \
        if "namespaceSelector" in item else None
    if ("podSelector" in item and pods is None) or \
            ("namespaceSelector" in item and spaces is None):
        return Peer(never=True)
    return Peer(pod_selector=pods, namespace_selector=spaces)


def _ip_block(block: Any, where: str, problems: list[str]) -> Peer:
    if not isinstance(block, Mapping):
        problems.append(f"{where}.ipBlock is not an object: matches nothing")
        return Peer(never=True)
    try:
        cidr = ipaddress.ip_network(str(block.get("cidr")), strict=False)
        excepts = [ipaddress.ip_network(str(e), strict=False)
                   for e in (block.get("except") or [])]
    except ValueError as exc:
        problems.append(f"{where}.ipBlock: {exc}: matches nothing")
        return Peer(never=True)
    return Peer(ip_block=subtract(cidr, excepts))


def subtract(cidr: Network, excepts: Sequence[Network]) -> tuple[Network, ...]:
    """`cidr` less every network of `excepts`, as the fewest disjoint networks, sorted."""
    remaining: list[Network] = [cidr]
    for cut in excepts:
        if cut.version != cidr.version:
            continue
        kept: list[Network] = []
        for net in remaining:
            if not net.overlaps(cut):
                kept.append(net)
            elif not cut.supernet_of(net):  # type: ignore[arg-type]
                kept.extend(net.address_exclude(cut))  # type: ignore[arg-type]
        remaining = kept
    return tuple(sorted(remaining, key=lambda net: (int(net.network_address),
                                                    net.prefixlen)))


def _ports(data: Any, where: str, problems: list[str]) -> tuple[PortSpec, ...] | None:
    if not data:
        return None  # absent or empty: every port
    if not isinstance(data, list):
        problems.append(f"{where} is not a list: matches nothing")
        return (PortSpec("TCP", None, never=True),)
    return tuple(_port(item, f"{where}[{index}]", problems) for index, item in enumerate(data))


def _port(item: Any, where: str, problems: list[str]) -> PortSpec:
    if not isinstance(item, Mapping):
        problems.append(f"{where} is not an object: matches nothing")
        return PortSpec("TCP", None, never=True)
    protocol = item.get("protocol") or "TCP"
    port, end_port = item.get("port"), item.get("endPort")
    if protocol not in PROTOCOLS:
        problems.append(f"{where}: unknown protocol {protocol!r}: matches nothing")
        return PortSpec(str(protocol), None, never=True)
    if isinstance(port, str) and port.isdigit():
        port = int(port)  # int-or-string as a string of digits: the number
    if not _is_port(port):
        problems.append(f"{where}: port {port!r} is not a port: matches nothing")
        return PortSpec(protocol, None, never=True)
    if end_port is not None and not (isinstance(port, int) and _is_port(end_port) and
                                     port <= end_port):
        problems.append(f"{where}: endPort {end_port!r} with port {port!r}: matches nothing")
        return PortSpec(protocol, None, never=True)
    return PortSpec(protocol, port, end_port)


def _is_port(value: Any) -> bool:
    """None (every port), a port number, or a container port's name."""
    if value is None:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 1 <= value <= MAX_PORT
    return isinstance(value, str) and bool(value)
