"""Reachability matrices for policy scenes: veth Pods and VMs on taps (stand-in:
e2e/harness/tapguest.py) as `Workload`s, each listening on two TCP ports, and `settle`, which
asks a list of (from, to, port, expected) rows with real connections until every row holds,
then prints the matrix as a table (the issue's closing note quotes it).
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

from e2e.harness.packets import Listener, listener, send
from e2e.harness.policyscene import PolicyNode, Scene, manifest_pod
from e2e.harness.wait import wait_until

ALLOWED, DENIED = 5555, 6666
Row = tuple[str, str, int, bool]  # from, to, port, connects


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


def settle(workloads: dict[str, Workload], rows: list[Row], what: str, bound_s: float) -> None:
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
