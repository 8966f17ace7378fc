"""One compiler for both kinds (pure): the policies, Pods, namespaces and attachments the node
knows → what one attachment allows in each direction.

Kubernetes NetworkPolicy's semantics: an attachment is isolated for a direction once a policy
selecting its Pod (in the policy's namespace) lists that direction, and it then allows the
union of what every such policy allows. A MultiNetworkPolicy applies to attachments made from
the networks it is for, a NetworkPolicy only to the node's conflist attachment (where the node
enforces them). Pod peers resolve to the addresses of the selected Pods' attachments on the
policy's networks, in the attachment's own VPC only (two VPCs may share subnets). A named port
resolves on the Pod that owns it (ingress: the attachment's Pod; egress: each peer Pod); one
that does not resolve matches nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cni_plugin.policy.model import MULTI, Network, Peer, Policy, PortSpec, Rule
from cni_plugin.policy.networks import PRIMARY, NetworkRef
from cni_plugin.tenancy.bindings import Selector

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
__all__ = ["PRIMARY", "NetworkRef"]  # the compiler's names for them too


@dataclass(frozen=True)
class PodFacts:
    """What the compiler reads of a Pod: labels and named container ports."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    # (port name, protocol) -> container port
    named_ports: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Endpoint:
    """An attachment anywhere in the cluster whose addresses are known."""

    namespace: str
    pod: str
    network: NetworkRef
    vpc: str
    addresses: tuple[Address, ...]


@dataclass(frozen=True)
class Target:
    """The local attachment the rules are for."""

    namespace: str
    pod: str
    network: NetworkRef
    vpc: str


@dataclass(frozen=True)
class World:
    """Everything the node knows that a policy can refer to."""

    policies: Sequence[Policy]
    pods: Mapping[tuple[str, str], PodFacts]
    namespaces: Mapping[str, Mapping[str, str]]  # name -> labels
    endpoints: Sequence[Endpoint]
    network_policy: bool = False  # the node enforces NetworkPolicy on conflist attachments


@dataclass(frozen=True, order=True)
class PortRange:
    """A protocol and a port range; first None = every port of the protocol."""

    protocol: str
    first: int | None = None
    last: int | None = None


@dataclass(frozen=True)
class Allow:
    """Traffic one rule allows: from/to `peers` (None: anywhere; () matches nothing yet, its
    set is kept for peers to come) on `ports` (None: every protocol and port)."""

    peers: tuple[Network, ...] | None
    ports: tuple[PortRange, ...] | None
    origin: str  # "namespace/policy ingress[0]": rule comments and counters name it


@dataclass(frozen=True)
class Direction:
    """One direction of an attachment: isolated or not, and what it allows then."""

    isolated: bool = False
    allows: tuple[Allow, ...] = ()


@dataclass(frozen=True)
class Compiled:
    """What an attachment enforces; `policies` names those selecting it."""

    ingress: Direction = Direction()
    egress: Direction = Direction()
    policies: tuple[str, ...] = ()

    @property
    def enforced(self) -> bool:
        """Whether anything is enforced at all (no policy selects it: nothing to write)."""
        return self.ingress.isolated or self.egress.isolated


def selecting(world: World, target: Target) -> list[Policy]:
    """The policies that apply to the target, sorted by namespace and name."""
    return Compiler(world).selecting(target)


def applies_to_network(policy: Policy, network: NetworkRef, network_policy: bool) -> bool:
    """A MultiNetworkPolicy for the attachment's network; a NetworkPolicy for the conflist's,
    where the node enforces them."""
    if policy.kind == MULTI:
        return network is not None and network in policy.networks
    return network is None and network_policy


def compile_target(world: World, target: Target) -> Compiled:
    """What the target attachment allows in each direction."""
    return Compiler(world).compile(target)


# A rule's allows for the targets of one VPC (and one Pod, where ingress names ports).
_RuleKey = tuple[int, str, int, str, tuple[str, str] | None]


class Compiler:
    """`compile_target` for every attachment of a node against one world: what targets share
    is worked out once per world, not once per target — the policies a set of labels selects,
    the Pods a pod selector selects in a namespace, each rule's allows in a VPC, each peer's
    networks (per target, 100 Pods under 100 policies spent most of an agent pass there).
    `world.policies` keeps every policy alive as long as the compiler: their ids are keys."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._selections: dict[tuple[str, NetworkRef, frozenset[tuple[str, str]]],
                               list[Policy]] = {}
        self._for_network: dict[tuple[str, NetworkRef], list[Policy]] = {}
        self._rules: dict[_RuleKey, list[Allow]] = {}
        self._pods_in: dict[str, list[tuple[tuple[str, str], PodFacts]]] = {}
        self._selected: dict[tuple[str, Hashable], list[tuple[str, str]]] = {}
        for key, pod in world.pods.items():
            self._pods_in.setdefault(key[0], []).append((key, pod))
        self._in_vpc: dict[str, list[tuple[Endpoint, tuple[Network, ...]]]] = {}
        for endpoint in world.endpoints:
            self._in_vpc.setdefault(endpoint.vpc, []).append(
                (endpoint, tuple(ipaddress.ip_network(a) for a in endpoint.addresses)))

    def selecting(self, target: Target) -> list[Policy]:
        """The policies that apply to the target, sorted by namespace and name."""
        pod = self.world.pods.get((target.namespace, target.pod))
        labels = pod.labels if pod is not None else {}
        key = (target.namespace, target.network, frozenset(labels.items()))
        found = self._selections.get(key)
        if found is None:
            found = [policy for policy in self._candidates(target.namespace, target.network)
                     if policy.pod_selector is not None and policy.pod_selector.matches(labels)]
            self._selections[key] = found
        return found

    def _candidates(self, namespace: str, network: NetworkRef) -> list[Policy]:
        """The policies of a namespace for a network, sorted, whatever they select."""
        found = self._for_network.get((namespace, network))
        if found is None:
            found = sorted((policy for policy in self.world.policies
                            if policy.namespace == namespace and applies_to_network(
                                policy, network, self.world.network_policy)),
                           key=lambda policy: (policy.namespace, policy.name, policy.kind))
            self._for_network[(namespace, network)] = found
        return found

    def compile(self, target: Target) -> Compiled:
        """What the target attachment allows in each direction."""
        policies = self.selecting(target)
        if not policies:
            return Compiled()
        ingress: list[Allow] = []
        egress: list[Allow] = []
        for policy in policies:
            if policy.isolates_ingress:
                for index, rule in enumerate(policy.ingress):
                    ingress.extend(self._rule(target, policy, rule, "ingress", index))
            if policy.isolates_egress:
                for index, rule in enumerate(policy.egress):
                    egress.extend(self._rule(target, policy, rule, "egress", index))
        return Compiled(
            Direction(any(p.isolates_ingress for p in policies), tuple(ingress)),
            Direction(any(p.isolates_egress for p in policies), tuple(egress)),
            tuple(f"{p.kind} {p.namespace}/{p.name}" for p in policies))

    def _rule(self, target: Target, policy: Policy, rule: Rule, direction: str,
              index: int) -> list[Allow]:
        """A rule's allows depend on the target only by its VPC, and by its Pod where ingress
        names ports (resolved on the target's own Pod)."""
        named_here = direction == "ingress" and rule.ports is not None and any(
            isinstance(spec.port, str) and not spec.never for spec in rule.ports)
        key = (id(policy), direction, index, target.vpc,
               (target.namespace, target.pod) if named_here else None)
        found = self._rules.get(key)
        if found is None:
            found = self._allows(target, policy, rule, direction, index)
            self._rules[key] = found
        return found

    def _allows(self, target: Target, policy: Policy, rule: Rule, direction: str,
                index: int) -> list[Allow]:
        origin = f"{policy.namespace}/{policy.name} {direction}[{index}]"
        if rule.peers is None:
            peer_pods: list[tuple[Endpoint, tuple[Network, ...]]] = []
            blocks: list[Network] | None = None
        else:
            peer_pods = self._peer_endpoints(target, policy, rule.peers)
            blocks = [net for peer in rule.peers if peer.ip_block and not peer.never
                      for net in peer.ip_block]
        if rule.ports is None:
            return [Allow(_peer_networks(peer_pods, blocks), None, origin)]
        numbered = [_range(spec) for spec in rule.ports if not spec.never and
                    not isinstance(spec.port, str)]
        named = [spec for spec in rule.ports if not spec.never and isinstance(spec.port, str)]
        allows = []
        if numbered:
            allows.append(Allow(_peer_networks(peer_pods, blocks),
                                tuple(sorted(set(numbered))), origin))
        if named and direction == "ingress":
            resolved = _resolve(self.world.pods.get((target.namespace, target.pod)), named)
            if resolved:
                allows.append(Allow(_peer_networks(peer_pods, blocks), resolved, origin))
        elif named:
            # Egress: the port is the destination's, named on each Pod the rule reaches: the
            # Pods its selectors select, and those whose addresses an ipBlock holds (only the
            # addresses inside it); an address no Pod of the VPC holds has no ports to name.
            if rule.peers is None:
                reached = [(endpoint, endpoint.addresses) for endpoint, _ in
                           self._endpoints_on(target, _networks_of(policy), None)]
            else:
                reached = [(endpoint, endpoint.addresses) for endpoint, _ in peer_pods]
                reached += self._endpoints_in(target, policy, blocks or [])
            by_ports: dict[tuple[PortRange, ...], set[Network]] = {}
            for endpoint, addresses in reached:
                resolved = _resolve(self.world.pods.get((endpoint.namespace, endpoint.pod)),
                                    named)
                if resolved:
                    by_ports.setdefault(resolved, set()).update(
                        ipaddress.ip_network(address) for address in addresses)
            for ports, networks in sorted(by_ports.items()):
                allows.append(Allow(_sorted_networks(networks), ports, origin))
        return allows  # ports listed, none usable: [] (the rule matches nothing)

    def _peer_endpoints(self, target: Target, policy: Policy, peers: Sequence[Peer]
                        ) -> list[tuple[Endpoint, tuple[Network, ...]]]:
        """The attachments, on the policy's networks and in the target's VPC, of every Pod a
        selector peer selects."""
        selected: set[tuple[str, str]] = set()
        for peer in peers:
            if peer.never or peer.ip_block is not None:
                continue
            if peer.namespace_selector is None:
                namespaces = [policy.namespace]
            else:
                selector = peer.namespace_selector
                namespaces = [name for name, labels in self.world.namespaces.items()
                              if selector.matches(labels)]
            for namespace in namespaces:
                selected.update(self._selected_in(namespace, peer.pod_selector))
        return self._endpoints_on(target, _networks_of(policy), selected)

    def _selected_in(self, namespace: str, selector: Selector | None) -> list[tuple[str, str]]:
        """The Pods of a namespace a pod selector selects (None: every Pod)."""
        key = (namespace, None if selector is None else (
            tuple(sorted(selector.match_labels.items())), selector.requirements))
        found = self._selected.get(key)
        if found is None:
            found = [pod_key for pod_key, pod in self._pods_in.get(namespace, ())
                     if selector is None or selector.matches(pod.labels)]
            self._selected[key] = found
        return found

    def _endpoints_on(self, target: Target, networks: Sequence[NetworkRef],
                      pods: set[tuple[str, str]] | None
                      ) -> list[tuple[Endpoint, tuple[Network, ...]]]:
        return [(endpoint, nets) for endpoint, nets in self._in_vpc.get(target.vpc, ())
                if endpoint.network in networks and
                (pods is None or (endpoint.namespace, endpoint.pod) in pods)]

    def _endpoints_in(self, target: Target, policy: Policy, blocks: Sequence[Network]
                      ) -> list[tuple[Endpoint, tuple[Address, ...]]]:
        """The attachments on the policy's networks in the target's VPC with addresses inside
        the blocks (their excepts already cut out), each with just those addresses."""
        found = []
        for endpoint, _ in self._endpoints_on(target, _networks_of(policy), None):
            inside = tuple(address for address in endpoint.addresses
                           if any(address in block for block in blocks))
            if inside:
                found.append((endpoint, inside))
        return found


def _range(spec: PortSpec) -> PortRange:
    if spec.port is None:
        return PortRange(spec.protocol)
    assert isinstance(spec.port, int)
    return PortRange(spec.protocol, spec.port, spec.end_port or spec.port)


def _resolve(pod: PodFacts | None, named: Iterable[PortSpec]) -> tuple[PortRange, ...]:
    if pod is None:
        return ()
    found = {PortRange(spec.protocol, number, number) for spec in named
             if (number := pod.named_ports.get((str(spec.port), spec.protocol))) is not None}
    return tuple(sorted(found))


def _networks_of(policy: Policy) -> tuple[NetworkRef, ...]:
    return policy.networks if policy.kind == MULTI else (PRIMARY,)


def _peer_networks(endpoints: Sequence[tuple[Endpoint, tuple[Network, ...]]],
                   blocks: Sequence[Network] | None) -> tuple[Network, ...] | None:
    if blocks is None:
        return None
    found: set[Network] = set(blocks)
    for _, networks in endpoints:
        found.update(networks)
    return _sorted_networks(found)


def _sorted_networks(networks: Iterable[Network]) -> tuple[Network, ...]:
    return tuple(sorted(networks, key=lambda net: (net.version, int(net.network_address),
                                                   net.prefixlen)))
