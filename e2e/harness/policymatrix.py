"""Reachability matrices for policy scenes: veth Pods and VMs on taps (stand-in:
e2e/harness/tapguest.py) as `Workload`s, each listening on two TCP ports, and `settle`, which
asks a list of (from, to, port, expected) rows with real connections until every row holds,
then prints the matrix as a table (the issue's closing note quotes it); `dropped_where`
shows which hook refused a denied row (the counter of the Pod's netns table or of the tap's
drop filter grows while it is asked again).

The two scenes across two nodes (`veth_pods_and_a_remote_label_change`,
`vms_and_pods_both_ways`) are shared by every datapath between nodes (galactic's eBPF path,
kernel SRv6): `join` makes the workloads reach each other where the datapath needs a hand
(kernel SRv6: the sending node's routes), the rows and policies are the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cni_plugin.kernel.flower import ETH_P_IP
from cni_plugin.policy import nft, tc
from e2e.harness.kube import Kube
from e2e.harness.pace import Bound
from e2e.harness.packets import Listener, in_netns, listener, send
from e2e.harness.plugin import random_vpc
from e2e.harness.policyscene import (
    PolicyNode,
    Scene,
    manifest_nad,
    manifest_namespace,
    manifest_pod,
    manifest_policy,
)
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

ALLOWED, DENIED = 5555, 6666
Row = tuple[str, str, int, bool]  # from, to, port, connects
# A denied row and the hook that must refuse it: (from, to, port), (workload, its direction).
DropSite = tuple[tuple[str, str, int], tuple[str, str]]
# What carries the scene's VPC between the nodes where the datapath needs a hand: (vpc, the
# workloads) -> None, called once every workload is attached.
Join = Callable[[str, dict[str, "Workload"]], None]
VETH_IFNAME = "net1"  # a scene's Pod on one NAD: its first network element


@dataclass
class Workload:
    """A veth Pod or a VM: where its packets start, its address, its listeners, its node."""

    name: str
    kind: str  # veth or tap
    netns: str
    address: str
    ears: dict[int, Listener]
    node: str
    host_link: str = ""  # a VM's tap (on its node), where its filters are
    prefix: list[str] = field(default_factory=list)  # runs a process of its node


@contextlib.contextmanager
def workload(scene: Scene, namespace: str, name: str, kind: str, labels: dict[str, str],
             nad: str, node: PolicyNode | None = None,
             networks: str | None = None) -> Iterator[Workload]:
    """A Pod on `nad` (veth) or a VM on its tap, listening on ALLOWED and DENIED; `networks`:
    its networks annotation as written (e.g. with `ips`), else `default/<nad>`."""
    node = node or scene.node
    pod = scene.pod(manifest_pod(name, namespace, labels, networks or f"default/{nad}",
                                 listen=(("tcp", ALLOWED), ("tcp", DENIED))
                                 if kind == "veth" else ()), node=node)
    if kind == "veth":
        yield Workload(name, kind, pod.netns, scene.address(namespace, name),
                       {port: pod.ears[("tcp", port)] for port in (ALLOWED, DENIED)},
                       node.name)
        return
    tap = pod.attached[0].result["interfaces"][0]["name"]
    with scene.guest(namespace, name) as guest, contextlib.ExitStack() as ears:
        yield Workload(name, kind, guest.netns, guest.ip(4), {
            port: ears.enter_context(listener(guest.netns, "tcp", port, scene.work))
            for port in (ALLOWED, DENIED)}, node.name, tap, node.prefix)


def connects(src: Workload, dst: Workload, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection from src reaches dst's listener and carries a payload."""
    payload = f"{src.name}-{dst.name}-{port}-{secrets.token_hex(3)}"
    if not send(src.netns, "tcp", dst.address, port, payload, timeout=timeout):
        return False
    try:
        wait_until("the payload", lambda: payload in dst.ears[port].payloads(), timeout,
                   interval=0.05)
    except TimeoutError:
        return False
    return True


def settle(workloads: dict[str, Workload], rows: list[Row], what: str,
           bound_s: float | Bound) -> None:
    """Until every row holds (the agent enforces a change within about a second; routes
    between nodes may come first); then the matrix, printed."""
    seen: dict[tuple[str, str, int], bool] = {}

    def holds() -> bool:
        for src, dst, port, _ in rows:
            seen[(src, dst, port)] = connects(workloads[src], workloads[dst], port)
        return all(seen[(s, d, p)] == expected for s, d, p, expected in rows)

    wait_until(f"{what} to hold", holds, bound_s, interval=0.5,
               detail=lambda: "\n".join([f"{s}->{d}:{p} connected {seen.get((s, d, p))}, "
                                         f"expected {e}" for s, d, p, e in rows] +
                                        [tap_filters(w) for w in workloads.values()
                                         if w.host_link]))
    print(f"\n{what}:\n| from | to | port | connects (expected) |\n|---|---|---|---|")
    for src, dst, port, expected in rows:
        a, b = workloads[src], workloads[dst]
        print(f"| {src} ({a.kind}, {a.node}) | {dst} ({b.kind}, {b.node}) | {port} | "
              f"{seen[(src, dst, port)]} ({expected}) |")


def tap_filters(vm: Workload) -> str:
    """What a VM's tap carries, with each filter's counters (a failure's evidence)."""
    shown = [f"{vm.name}'s tap {vm.host_link} on {vm.node}:"]
    for hook in ("ingress", "egress"):
        done = subprocess.run([*vm.prefix, "tc", "-s", "filter", "show", "dev", vm.host_link,
                               hook], capture_output=True, text=True, timeout=60)
        shown.append(f"tc {hook}:\n{done.stdout}{done.stderr}")
    return "\n".join(shown)


def drops(vm_or_pod: Workload, direction: str) -> int:
    """Packets the policy dropped in one direction of a workload: a veth Pod's netns table's
    `<direction>_dropped` counter; a VM's tap drop filter (IPv4) on the hook of that direction
    (the VM's ingress leaves the tap's TC egress, its egress enters the tap's TC ingress)."""
    if vm_or_pod.kind == "veth":
        done = subprocess.run(in_netns(vm_or_pod.netns, "nft", "-j", "list", "counters",
                                       "table", nft.FAMILY, nft.table_name(VETH_IFNAME)),
                              capture_output=True, text=True, timeout=60, check=True)
        return sum(int(item["counter"]["packets"]) for item in json.loads(done.stdout)["nftables"]
                   if item.get("counter", {}).get("name") == f"{direction}_dropped")
    hook = "egress" if direction == "ingress" else "ingress"
    done = subprocess.run([*vm_or_pod.prefix, "tc", "-s", "-j", "filter", "show", "dev",
                           vm_or_pod.host_link, hook], capture_output=True, text=True,
                          timeout=60, check=True)
    return sum(int(action.get("stats", {}).get("packets", 0))
               for shown in json.loads(done.stdout or "[]")
               if shown.get("pref") == tc.DROP_PRIORITY[ETH_P_IP]
               for action in shown.get("options", {}).get("actions", []))


def dropped_where(workloads: dict[str, Workload], sites: list[DropSite], what: str) -> None:
    """Each denied row asked again: it does not connect, and the counter of the hook named
    for it grows (the mechanism that refuses it, not a route that is missing); printed."""
    print(f"\n{what}, where denied rows are dropped:\n| from | to | port | dropped by | "
          "packets dropped there while asked |\n|---|---|---|---|---|")
    for (src, dst, port), (name, direction) in sites:
        before = drops(workloads[name], direction)
        assert not connects(workloads[src], workloads[dst], port), f"{src}->{dst}:{port}"
        after = drops(workloads[name], direction)
        where = f"{name}'s {direction} " + (
            "(its netns table)" if workloads[name].kind == "veth" else "(its tap's TC filters)")
        assert after > before, f"{src}->{dst}:{port} was not dropped by {where}"
        print(f"| {src} | {dst} | {port} | {where} | {after - before} |")


def veth_pods_and_a_remote_label_change(kube: Kube, nodes: list[PolicyNode], work: Path,
                                        what: str, subnet: str, join: Join,
                                        bound_s: float | Bound) -> None:
    """A VPC of veth Pods on two nodes: b (node 2) admits clients on ALLOWED only; a (node 1)
    is a client, o (node 1) is not. Then o gets the label the policy on node 2 admits: node
    2's agent follows it (the Pod from the API, its addresses from the EndpointSlice node 1
    published)."""
    node1, node2 = nodes
    namespace, vpc = f"policy-x-veth-{os.urandom(2).hex()}", random_vpc()
    nad = f"px-veth-{os.urandom(2).hex()}"
    with bound(kube, vpc), contextlib.ExitStack() as stack:
        scene = Scene(kube, node1, vpc, work, isolation="vrf", bgp=True)
        stack.callback(scene.close)
        scene.namespace(manifest_namespace(namespace))
        scene.nad(manifest_nad(nad, subnet))
        scene.policy(manifest_policy("server", namespace, f"default/{nad}", {
            "podSelector": {"matchLabels": {"role": "server"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                         "ports": [{"port": ALLOWED}]}]}))
        workloads = {name: stack.enter_context(workload(scene, namespace, name, "veth",
                                                        {"role": role}, nad, node))
                     for name, role, node in (("a", "client", node1), ("o", "other", node1),
                                              ("b", "server", node2))}
        join(vpc, workloads)
        settle(workloads, [("a", "b", ALLOWED, True), ("a", "b", DENIED, False),
                           ("o", "b", ALLOWED, False), ("b", "a", ALLOWED, True)],
               f"a VPC of veth Pods across two nodes ({what})", bound_s)
        dropped_where(workloads, [(("a", "b", DENIED), ("b", "ingress")),
                                  (("o", "b", ALLOWED), ("b", "ingress"))], what)
        kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/o",
                     {"metadata": {"labels": {"role": "client"}}},
                     content_type="application/merge-patch+json")
        settle(workloads, [("o", "b", ALLOWED, True), ("o", "b", DENIED, False),
                           ("a", "b", ALLOWED, True)],
               f"o on node 1 labelled a client ({what})", bound_s)


def vms_and_pods_both_ways(kube: Kube, nodes: list[PolicyNode], work: Path, what: str,
                           subnets: tuple[str, str], join: Join,
                           bound_s: float | Bound) -> None:
    """Servers on node 2 (a veth Pod b, a VM u) admit clients on ALLOWED only and send only
    to clients (a veth Pod a and a VM t on node 1), never to c (node 1, no policy): every
    pair of kinds both ways, and where each denied row is dropped; then c gets the label the
    policy on node 2 admits, and node 2's agent follows it on both kinds."""
    node1, node2 = nodes
    namespace, vpc = f"policy-x-{os.urandom(2).hex()}", random_vpc()
    tag = os.urandom(2).hex()
    nads = {"veth": f"px-veth-{tag}", "tap": f"px-tap-{tag}"}
    with bound(kube, vpc), contextlib.ExitStack() as stack:
        scene = Scene(kube, node1, vpc, work, isolation="vrf", bgp=True)
        stack.callback(scene.close)
        scene.namespace(manifest_namespace(namespace))
        scene.nad(manifest_nad(nads["veth"], subnets[0]))
        scene.nad(manifest_nad(nads["tap"], subnets[1]), attachment="tap")
        scene.policy(manifest_policy("servers", namespace,
                                     f"default/{nads['veth']},default/{nads['tap']}", {
            "podSelector": {"matchLabels": {"role": "server"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                         "ports": [{"port": ALLOWED}]}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}))
        workloads = {}
        for name, kind, role, node in (("a", "veth", "client", node1),
                                       ("t", "tap", "client", node1),
                                       ("c", "veth", "other", node1),
                                       ("b", "veth", "server", node2),
                                       ("u", "tap", "server", node2)):
            workloads[name] = stack.enter_context(workload(
                scene, namespace, name, kind, {"role": role}, nads[kind], node))
        join(vpc, workloads)
        settle(workloads, [
            ("a", "b", ALLOWED, True), ("a", "b", DENIED, False),
            ("a", "u", ALLOWED, True), ("a", "u", DENIED, False),
            ("t", "b", ALLOWED, True), ("t", "b", DENIED, False),
            ("t", "u", ALLOWED, True), ("t", "u", DENIED, False),
            ("b", "a", ALLOWED, True), ("b", "t", ALLOWED, True),
            ("u", "a", ALLOWED, True), ("u", "t", ALLOWED, True),
            ("b", "c", ALLOWED, False), ("u", "c", ALLOWED, False),
            ("c", "b", ALLOWED, False), ("c", "u", ALLOWED, False)],
            f"VMs and veth Pods across two nodes ({what})", bound_s)
        dropped_where(workloads, [
            (("a", "b", DENIED), ("b", "ingress")), (("a", "u", DENIED), ("u", "ingress")),
            (("t", "b", DENIED), ("b", "ingress")), (("t", "u", DENIED), ("u", "ingress")),
            (("c", "b", ALLOWED), ("b", "ingress")), (("c", "u", ALLOWED), ("u", "ingress")),
            (("b", "c", ALLOWED), ("b", "egress")), (("u", "c", ALLOWED), ("u", "egress"))],
            what)
        # c (node 1) becomes a client: node 2's agent opens b's netns and u's tap to it, both
        # ways (their ingress from it, their egress to it), from the label change alone.
        kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/c",
                     {"metadata": {"labels": {"role": "client"}}},
                     content_type="application/merge-patch+json")
        settle(workloads, [("c", "b", ALLOWED, True), ("c", "b", DENIED, False),
                           ("c", "u", ALLOWED, True), ("c", "u", DENIED, False),
                           ("b", "c", ALLOWED, True), ("u", "c", ALLOWED, True)],
               f"c on node 1 labelled a client ({what})", bound_s)
