"""The upstream MultiNetworkPolicy end-to-end cases (SPEC §17's acceptance):
k8snetworkplumbingwg/multi-networkpolicy-iptables' e2e/tests (and the cases
multi-networkpolicy-nftables adds), their manifests as e2e/fixtures/multinetworkpolicy holds
them, each check of their .bats file transcribed below as a `Check`, and `run_case`, which
creates a case's objects on a `PolicyNode` and asks its checks with real packets until all hold.

Multus does not run here: the scene (e2e/harness/policyscene.py) writes the Pods and their
`k8s.v1.cni.cncf.io/networks` annotation as the manifests say and calls the plugin for each
element as Multus would. Where upstream's check is `nc` exiting 0 or 1, here a TCP connection or
a UDP datagram reaches the listener the Pod's container runs, or does not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.kube import Kube
from e2e.harness.plugin import random_vpc
from e2e.harness.policyscene import FIXTURES, PolicyNode, Scene, agentless_order, load_case
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

SETTLE_S = 60.0


@dataclass(frozen=True)
class Check:
    """`kubectl -n <namespace> exec <pod> -- nc <dst's net1 address> <port>`, expected to
    connect (True) or not."""

    namespace: str
    pod: str
    dst_namespace: str
    dst: str
    kind: str
    port: int
    connects: bool
    version: int = 4

    def __str__(self) -> str:
        arrow = "->" if self.connects else "-x"
        return (f"{self.namespace}/{self.pod} {arrow} {self.dst_namespace}/{self.dst} "
                f"{self.kind}/{self.port} IPv{self.version}")


# Transcribed from each case's .bats, one check a line: "<pod> -> <pod> tcp/5555" connects,
# "-x" does not (nc exits 1), "v6": to the destination's IPv6 address; a pod outside the case's
# home namespace is "<namespace>/<pod>".
CASES: dict[str, tuple[str, list[str]]] = {
    "iptables/simple-v4-ingress": ("test-simple-v4-ingress", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -x pod-server tcp/5555",
        "pod-server -> pod-client-a tcp/5555",
        "pod-server -> pod-client-b tcp/5555",
    ]),
    "iptables/simple-v4-ingress-list": ("test-simple-v4-ingress-list", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -x pod-server tcp/5555",
        "pod-client-c -> pod-server tcp/5555",
        "pod-server -> pod-client-a tcp/5555",
        "pod-server -> pod-client-b tcp/5555",
        "pod-server -> pod-client-c tcp/5555",
    ]),
    "iptables/simple-v4-egress": ("test-simple-v4-egress", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-server -> pod-client-a tcp/5555",
        "pod-server -x pod-client-b tcp/5555",
    ]),
    # multi-networkpolicy-nftables' copy of the case: its policy says `policyTypes: [Egress]`,
    # which iptables' copy leaves out (see the upstream module's DIVERGES).
    "nftables/simple-v4-egress": ("test-simple-v4-egress", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-server -> pod-client-a tcp/5555",
        "pod-server -x pod-client-b tcp/5555",
    ]),
    "iptables/simple-v4-egress-list": ("test-simple-v4-egress-list", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-client-c -> pod-server tcp/5555",
        "pod-server -> pod-client-a tcp/5555",
        "pod-server -x pod-client-b tcp/5555",
        "pod-server -> pod-client-c tcp/5555",
    ]),
    "iptables/simple-v6-ingress": ("test-simple-v6-ingress", [
        "pod-client-a -> pod-server tcp/5555 v6",
        "pod-client-b -x pod-server tcp/5555 v6",
        "pod-server -> pod-client-a tcp/5555 v6",
        "pod-server -> pod-client-b tcp/5555 v6",
    ]),
    "iptables/simple-v6-ingress-list": ("test-simple-v6-ingress-list", [
        "pod-client-a -> pod-server tcp/5555 v6",
        "pod-client-b -x pod-server tcp/5555 v6",
        "pod-client-c -> pod-server tcp/5555 v6",
        "pod-server -> pod-client-a tcp/5555 v6",
        "pod-server -> pod-client-b tcp/5555 v6",
        "pod-server -> pod-client-c tcp/5555 v6",
    ]),
    "iptables/ipblock": ("test-ipblock", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-client-c -x pod-server tcp/5555",
    ]),
    "iptables/ipblock-list": ("test-ipblock-list", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-client-c -x pod-server tcp/5555",
    ]),
    "iptables/ipblock-stacked": ("test-ipblock-stacked", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-client-c -x pod-server tcp/5555",
    ]),
    "iptables/stacked": ("test-stacked", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-client-c -x pod-server tcp/5555",
    ]),
    "iptables/port-range": ("test-port-range", [
        "pod-a -> pod-b tcp/5555",
        "pod-a -x pod-b tcp/6666",
        "pod-b -x pod-a tcp/5555",
        "pod-b -> pod-a tcp/6666",
    ]),
    "iptables/protocol-only-ports": ("test-protocol-only-ports", [
        "pod-a -> pod-b tcp/5555",
        "pod-a -x pod-b udp/6666",
        "pod-b -x pod-a tcp/5555",
        "pod-b -> pod-a udp/6666",
    ]),
    "iptables/ingress-ns-selector-no-pods": ("test-ingress-ns-selector-no-pods", [
        "pod-client-a -x pod-server tcp/5555",
        "test-ingress-ns-selector-no-pods-blue/pod-client-b -x pod-server tcp/5555",
        "pod-server -> pod-client-a tcp/5555",
        "pod-server -> test-ingress-ns-selector-no-pods-blue/pod-client-b tcp/5555",
    ]),
    "nftables/multi-namespace-multinet": ("test-namespace-a", [
        "test-namespace-b/pod-1 -> pod-1 tcp/5555",
        "pod-1 -> test-namespace-b/pod-2 tcp/5555",
        "pod-1 -x pod-2 tcp/5555",
        "pod-1 -x test-namespace-b/pod-1 tcp/5555",
        "pod-1 -x test-namespace-c/pod-1 tcp/5555",
        "pod-1 -x test-namespace-c/pod-2 tcp/5555",
        "pod-2 -x pod-1 tcp/5555",
        "test-namespace-b/pod-2 -x pod-1 tcp/5555",
        "test-namespace-c/pod-1 -x pod-1 tcp/5555",
        "test-namespace-c/pod-2 -x pod-1 tcp/5555",
        "pod-2 -> test-namespace-b/pod-1 tcp/5555",
        "pod-2 -> test-namespace-b/pod-2 tcp/5555",
        "pod-2 -> test-namespace-c/pod-1 tcp/5555",
        "pod-2 -> test-namespace-c/pod-2 tcp/5555",
        "test-namespace-b/pod-1 -> pod-2 tcp/5555",
        "test-namespace-b/pod-1 -> test-namespace-b/pod-2 tcp/5555",
        "test-namespace-b/pod-1 -> test-namespace-c/pod-1 tcp/5555",
        "test-namespace-b/pod-1 -> test-namespace-c/pod-2 tcp/5555",
    ]),
    "nftables/accept-all-with-specific-allow": ("test-accept-all", [
        "pod-client-a -> pod-server tcp/80",
        "pod-client-a -> pod-server tcp/8080",
        "pod-client-b -> pod-server tcp/80",
        "pod-client-b -> pod-server tcp/8080",
        "pod-client-c -> pod-server tcp/80",
        "pod-client-c -> pod-server tcp/8080",
    ]),
    "nftables/advanced-ipblock-scenarios": ("test-advanced-ipblock", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -> pod-server tcp/5555",
        "pod-client-c -x pod-server tcp/5555",
        "pod-client-d -> pod-server tcp/5555",
        "pod-server -> pod-client-a tcp/5555",
        "pod-server -x pod-client-c tcp/5555",
    ]),
    "nftables/complex-port-specifications": ("test-complex-ports", [
        "pod-client-a -> pod-server tcp/80",
        "pod-client-a -> pod-server tcp/443",
        "pod-client-a -> pod-server tcp/22",
        "pod-client-a -> pod-server udp/53",
        "pod-client-a -x pod-server tcp/8080",
        "pod-client-b -x pod-server tcp/80",
        "pod-client-c -> pod-server tcp/80",
        "pod-server -> pod-client-a tcp/80",
        "pod-server -x pod-client-b tcp/80",
    ]),
    "nftables/deny-all-with-specific-allow": ("test-deny-all", [
        "pod-client-a -> pod-server tcp/80",
        "pod-client-a -x pod-server tcp/8080",
        "pod-client-b -x pod-server tcp/80",
        "pod-client-b -x pod-server tcp/8080",
        "pod-client-c -x pod-server tcp/80",
        "pod-client-c -x pod-server tcp/8080",
    ]),
    "nftables/mixed-selector-policies": ("test-mixed-selectors", [
        "pod-client-a -> pod-server tcp/5555",
        "pod-client-b -x pod-server tcp/5555",
        "test-mixed-selectors-blue/pod-client-c -> pod-server tcp/5555",
        "test-mixed-selectors-blue/pod-client-d -> pod-server tcp/5555",
        "test-mixed-selectors-blue/pod-client-e -> pod-server tcp/5555",
        "pod-server -x pod-client-a tcp/5555",
        "pod-server -x pod-client-b tcp/5555",
        "pod-server -> test-mixed-selectors-blue/pod-client-c tcp/5555",
        "pod-server -x test-mixed-selectors-blue/pod-client-d tcp/5555",
        "pod-server -x test-mixed-selectors-blue/pod-client-e tcp/5555",
    ]),
    # Upstream's .bats runs the two pod-external checks as `kubectl -n test-production exec
    # pod-external`, a Pod that namespace lacks (kubectl fails, the check passes whatever the
    # policy): transcribed as meant, from test-external's pod-external.
    "nftables/production-like-scenarios": ("test-production", [
        "pod-frontend -> pod-backend tcp/80",
        "pod-frontend -> pod-backend tcp/443",
        "pod-frontend -x pod-backend tcp/22",
        "pod-backend -> pod-database tcp/3306",
        "pod-frontend -x pod-database tcp/3306",
        "pod-monitoring -> pod-backend tcp/8080",
        "pod-monitoring -x pod-database tcp/3306",
        "test-external/pod-external -x pod-frontend tcp/80",
        "pod-backend -x test-external/pod-external tcp/80",
        "pod-monitoring -x pod-frontend tcp/80",
        "pod-frontend -x pod-monitoring tcp/8080",
        "pod-database -x pod-backend tcp/80",
        "test-external/pod-external -x pod-backend tcp/80",
    ]),
    "nftables/edge-cases-validation": ("test-edge-cases", [
        "pod-client-a -x pod-server tcp/5555",
        "pod-client-b -x pod-server tcp/5555",
        "pod-server -x pod-client-a tcp/5555",
        "pod-server -x pod-client-b tcp/5555",
        "pod-client-a -x pod-server tcp/9999",
        "pod-client-a -x pod-server tcp/5555",
    ]),
}


def checks_of(case: str) -> list[Check]:
    """The case's checks, parsed."""
    home, lines = CASES[case]
    found = []
    for line in lines:
        src, arrow, dst, port, *v6 = line.split()
        kind, number = port.split("/")
        (namespace, pod), (dst_namespace, dst_pod) = (
            (part.split("/") if "/" in part else (home, part)) for part in (src, dst))
        found.append(Check(namespace, pod, dst_namespace, dst_pod, kind, int(number),
                           arrow == "->", 6 if v6 else 4))
    return found


def run_case(kube: Kube, node: PolicyNode, case: str, work: Path) -> list[str]:
    """Create the case's objects, attach its Pods, create its policies (without an agent: the
    policies first, the Pods in `agentless_order`); until every check holds, ask them all; the
    last answers, one line per check."""
    manifests = load_case(FIXTURES / f"{case}.yml")
    checks = checks_of(case)
    policies = [m for m in manifests if m["kind"] in ("MultiNetworkPolicy", "NetworkPolicy")]
    pods = [m for m in manifests if m["kind"] == "Pod"] if node.agent is not None \
        else agentless_order(manifests)
    assert pods is not None, f"{case} has no order an agentless node can enforce"
    vpc = random_vpc()
    with bound(kube, vpc):
        scene = Scene(kube, node, vpc, work)
        try:
            for manifest in manifests:
                if manifest["kind"] == "Namespace":
                    scene.namespace(manifest)
                elif manifest["kind"] == "NetworkAttachmentDefinition":
                    scene.nad(manifest)
            for manifest in [] if node.agent is not None else policies:
                scene.policy(manifest)
            for manifest in pods:
                scene.pod(manifest)
            for check in checks:  # e.g. edge-cases' tcp/9999, which no container listens on
                scene.listen((check.dst_namespace, check.dst), check.kind, check.port)
            created = time.monotonic()
            for manifest in policies if node.agent is not None else []:
                scene.policy(manifest)
            seen: dict[Check, bool] = {}

            def all_hold() -> bool:
                for check in checks:
                    seen[check] = scene.reaches(
                        (check.namespace, check.pod), (check.dst_namespace, check.dst),
                        check.kind, check.port, check.version, timeout=0.5)
                return all(seen[c] == c.connects for c in checks)

            wait_until(f"every check of {case} to hold", all_hold, SETTLE_S, interval=0.1,
                       detail=lambda: "\n".join(f"{c}: connected {seen.get(c)}"
                                                for c in checks))
            print(f"\n{case}: all {len(checks)} checks hold "
                  f"{time.monotonic() - created:.1f} s after its "
                  f"{'policies were created' if node.agent else 'Pods were attached'}")
            return [f"{c}: {seen[c]}" for c in checks]
        finally:
            scene.close()


def agentless_cases() -> list[str]:
    """The cases a node without an agent can enforce: an order of ADDs exists in which each
    Pod's peers are attached before it."""
    return sorted(case for case in CASES
                  if agentless_order(load_case(FIXTURES / f"{case}.yml")) is not None)
