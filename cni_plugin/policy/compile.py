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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cni_plugin.policy.model import MULTI, Network, Peer, Policy, PortSpec, Rule
from cni_plugin.policy.networks import PRIMARY, NetworkRef

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
    pod = world.pods.get((target.namespace, target.pod))
    labels = pod.labels if pod is not None else {}
    found = [policy for policy in world.policies
             if policy.namespace == target.namespace and applies_to_network(
                 policy, target.network, world.network_policy)
             and policy.pod_selector is not None and policy.pod_selector.matches(labels)]
    return sorted(found, key=lambda policy: (policy.namespace, policy.name, policy.kind))


def applies_to_network(policy: Policy, network: NetworkRef, network_policy: bool) -> bool:
    """A MultiNetworkPolicy for the attachment's network; a NetworkPolicy for the conflist's,
    where the node enforces them."""
    if policy.kind == MULTI:
        return network is not None and network in policy.networks
    return network is None and network_policy


def compile_target(world: World, target: Target) -> Compiled:
    """What the target attachment allows in each direction."""
    policies = selecting(world, target)
    if not policies:
        return Compiled()
    ingress: list[Allow] = []
    egress: list[Allow] = []
    for policy in policies:
        if policy.isolates_ingress:
            for index, rule in enumerate(policy.ingress):
                ingress.extend(_allows(world, target, policy, rule, "ingress", index))
        if policy.isolates_egress:
            for index, rule in enumerate(policy.egress):
                egress.extend(_allows(world, target, policy, rule, "egress", index))
    return Compiled(
        Direction(any(p.isolates_ingress for p in policies), tuple(ingress)),
        Direction(any(p.isolates_egress for p in policies), tuple(egress)),
        tuple(f"{p.kind} {p.namespace}/{p.name}" for p in policies))


def _allows(world: World, target: Target, policy: Policy, rule: Rule, direction: str,
            index: int) -> list[Allow]:
    origin = f"{policy.namespace}/{policy.name} {direction}[{index}]"
    if rule.peers is None:
        peer_pods: list[Endpoint] = []
        blocks: list[Network] | None = None
    else:
        peer_pods = _peer_endpoints(world, target, policy, rule.peers)
        blocks = [net for peer in rule.peers if peer.ip_block and not peer.never
                  for net in peer.ip_block]
    if rule.ports is None:
        return [Allow(_peer_networks(peer_pods, blocks), None, origin)]
    numbered = [_range(spec) for spec in rule.ports if not spec.never and
                not isinstance(spec.port, str)]
    named = [spec for spec in rule.ports if not spec.never and isinstance(spec.port, str)]
    allows = []
    if numbered:
        allows.append(Allow(_peer_networks(peer_pods, blocks), tuple(sorted(set(numbered))),
                            origin))
    if named and direction == "ingress":
        resolved = _resolve(world.pods.get((target.namespace, target.pod)), named)
        if resolved:
            allows.append(Allow(_peer_networks(peer_pods, blocks), resolved, origin))
    elif named:
        # Egress: the port is the destination's, named on each Pod the rule reaches: the Pods
        # its selectors select, and those whose addresses an ipBlock holds (only the addresses
        # inside it); an address no Pod of the VPC holds has no container ports to name.
        if rule.peers is None:
            reached = [(endpoint, endpoint.addresses) for endpoint
                       in _endpoints_on(world, target, _networks_of(policy), None)]
        else:
            reached = [(endpoint, endpoint.addresses) for endpoint in peer_pods]
            reached += _endpoints_in(world, target, policy, blocks or [])
        by_ports: dict[tuple[PortRange, ...], set[Network]] = {}
        for endpoint, addresses in reached:
            resolved = _resolve(world.pods.get((endpoint.namespace, endpoint.pod)), named)
            if resolved:
                by_ports.setdefault(resolved, set()).update(
                    ipaddress.ip_network(address) for address in addresses)
        for ports, networks in sorted(by_ports.items()):
            allows.append(Allow(_sorted_networks(networks), ports, origin))
    if not allows:  # ports listed, none of them usable: the rule matches nothing
        return []
    return allows


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


def _peer_endpoints(world: World, target: Target, policy: Policy,
                    peers: Sequence[Peer]) -> list[Endpoint]:
    """The attachments, on the policy's networks and in the target's VPC, of every Pod a
    selector peer selects."""
    selected: set[tuple[str, str]] = set()
    for peer in peers:
        if peer.never or peer.ip_block is not None:
            continue
        if peer.namespace_selector is None:
            namespaces = {policy.namespace}
        else:
            selector = peer.namespace_selector
            namespaces = {name for name, labels in world.namespaces.items()
                          if selector.matches(labels)}
        for (namespace, name), pod in world.pods.items():
            if namespace in namespaces and (
                    peer.pod_selector is None or peer.pod_selector.matches(pod.labels)):
                selected.add((namespace, name))
    return _endpoints_on(world, target, _networks_of(policy), selected)


def _endpoints_on(world: World, target: Target, networks: Sequence[NetworkRef],
                  pods: set[tuple[str, str]] | None) -> list[Endpoint]:
    return [endpoint for endpoint in world.endpoints
            if endpoint.vpc == target.vpc and endpoint.network in networks and
            (pods is None or (endpoint.namespace, endpoint.pod) in pods)]


def _endpoints_in(world: World, target: Target, policy: Policy, blocks: Sequence[Network]
                  ) -> list[tuple[Endpoint, tuple[Address, ...]]]:
    """The attachments on the policy's networks in the target's VPC with addresses inside the
    blocks (their excepts already cut out), each with just those addresses."""
    found = []
    for endpoint in _endpoints_on(world, target, _networks_of(policy), None):
        inside = tuple(address for address in endpoint.addresses
                       if any(address in block for block in blocks))
        if inside:
            found.append((endpoint, inside))
    return found


def _peer_networks(endpoints: Sequence[Endpoint], blocks: Sequence[Network] | None
                   ) -> tuple[Network, ...] | None:
    if blocks is None:
        return None
    found: set[Network] = set(blocks)
    for endpoint in endpoints:
        found.update(ipaddress.ip_network(address) for address in endpoint.addresses)
    return _sorted_networks(found)


def _sorted_networks(networks: Iterable[Network]) -> tuple[Network, ...]:
    return tuple(sorted(networks, key=lambda net: (net.version, int(net.network_address),
                                                   net.prefixlen)))
