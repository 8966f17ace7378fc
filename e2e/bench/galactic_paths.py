"""TCP across two nodes (issue 37 item 2): each path a client and a server netns, measured in
one VM boot, the order rotated every round; each measurement with iperf3's retransmissions
and the underlay's `tx_dropped` delta on both nodes.

Paths: one veth pair in the same VM; plain routing over the two nodes' underlay (no SRv6);
galactic's eBPF path with Pods attached by vpc-attach, their offloads as galactic-bgp leaves
them (`galacticOffloads: on`) and as vpc-attach sets them (default `off`); knobs tried on the
first pair side by side (generic segmentation off too, `gso_max_segs 1`, a smaller Pod MTU,
GRO on the receiving node's underlay); and kernel End.DT46 (two nodes without galactic's
pins: vpc-attach answers the SIDs with seg6local End.DT46, and a hand-made kernel `encap seg6`
route on the sending node stands in for an encapsulating sender, which no galactic component
writes into the kernel).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.bench.stats import median
from e2e.harness import srv6_nodes
from e2e.harness.cluster import Cluster
from e2e.harness.galactic.datapath import Datapath, DatapathNode
from e2e.harness.galactic.transfer import claimed_drops, offloads, set_offloads, transfer
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.packets import in_netns
from e2e.harness.plugin import Plugin, base_conf, host_local, random_vpc, with_prev
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

POD_MTU = 1460  # vpc-attach's Pod MTU on a galactic node (room for the 40-byte outer header)
REACH_TIMEOUT_S = 180.0


@dataclass
class TcpPath:
    """One row: where the client and the server run, and what a round changes before and
    after measuring it."""

    key: str
    label: str
    client: str  # netns name
    server: str
    address: str  # the server's address
    nodes: list[str]  # netns of the nodes whose underlay links are counted
    underlays: list[str]
    pin_dirs: list[Path]  # galactic's pins on the nodes (where usid_* count their drops)
    before: Callable[[], object] | None = None
    after: Callable[[], object] | None = None
    offloads: str = ""  # the client's segmentation offloads as `ethtool -k` shows them
    unavailable: str = ""  # why the kernel refused this path's change (then not measured)
    rates: list[float] = field(default_factory=list)
    retransmits: list[int] = field(default_factory=list)
    drops: list[tuple[int, ...]] = field(default_factory=list)
    claimed: list[int] = field(default_factory=list)  # dropped by galactic's programs


def measure(path: TcpPath, seconds: int) -> None:
    """One round of one path: its changes, iperf3, the underlays' drops, its changes undone
    (a change the kernel refuses: the path is reported as unavailable, not measured)."""
    if path.unavailable:
        return
    if path.before is not None:
        try:
            path.before()
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            path.unavailable = str(exc).strip().splitlines()[-1][:160]
            return
    try:
        path.offloads = segmentation_state(path.client)
        claimed = sum(claimed_drops(pins) for pins in path.pin_dirs)
        done = transfer(path.client, path.server, path.address, seconds,
                        list(zip(path.nodes, path.underlays, strict=True)))
        path.claimed.append(sum(claimed_drops(pins) for pins in path.pin_dirs) - claimed)
        path.drops.append(done.drops)
        path.rates.append(done.gbits)
        path.retransmits.append(done.retransmits)
    finally:
        if path.after is not None:
            path.after()


def measure_all(paths: list[TcpPath], seconds: int, rounds: int) -> None:
    """`rounds` rounds, every path once per round, the order rotated by one each round."""
    for index in range(rounds):
        shift = index % len(paths)
        for path in paths[shift:] + paths[:shift]:
            measure(path, seconds)
        print(f"tcp round {index + 1}/{rounds}", file=sys.stderr, flush=True)


def segmentation_state(netns: str, link: str = "eth0") -> str:
    """What `ethtool -k` says of the client's TSO, USO and GSO (the measured path's sender)."""
    found = offloads(netns, link)
    return ", ".join(f"{name.replace('-offload', '')} {found[name]}" for name in (
        "tcp-segmentation-offload", "tx-udp-segmentation", "generic-segmentation-offload")
        if name in found) or "?"


def ethtool_set(netns: str, *features: str, link: str = "eth0") -> None:
    """`ethtool -K link feature on|off ...` in netns."""
    set_offloads(netns, *features, link=link)


# The paths --------------------------------------------------------------------------------

@contextlib.contextmanager
def veth_pair() -> Iterator[tuple[str, str, str]]:
    """Two netns joined by one veth pair: (client netns, server netns, server address)."""
    suffix = secrets.token_hex(3)
    left, right = f"vpa-vl-{suffix}", f"vpa-vr-{suffix}"
    for name in (left, right):
        run_ip("netns", "add", name)
    try:
        run_ip("-n", left, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
               "netns", right)
        for name, address in ((left, "10.192.0.1/24"), (right, "10.192.0.2/24")):
            run_ip("-n", name, "addr", "add", address, "dev", "eth0")
            run_ip("-n", name, "link", "set", "eth0", "up")
        yield left, right, "10.192.0.2"
    finally:
        for name in (left, right):
            run_ip("netns", "del", name, check=False)


@contextlib.contextmanager
def routed_host(node: DatapathNode, index: int) -> Iterator[tuple[str, str]]:
    """A netns behind `node` by a veth in the node's main table, no VRF, no SRv6: (netns,
    address 10.194.<index>.2). Its MTU is the Pods' (room for the encapsulation)."""
    name = f"vpa-pl{index}-{secrets.token_hex(3)}"
    host_end, address = f"vpa-pl{index}h", f"10.194.{index}.2"
    run_ip("netns", "add", name)
    try:
        run_ip("-n", node.netns, "link", "add", host_end, "mtu", str(POD_MTU), "type", "veth",
               "peer", "name", "eth0", "mtu", str(POD_MTU), "netns", name)
        run_ip("-n", node.netns, "addr", "add", f"10.194.{index}.1/24", "dev", host_end)
        run_ip("-n", node.netns, "link", "set", host_end, "up")
        run_ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
        run_ip("-n", name, "link", "set", "eth0", "up")
        run_ip("-n", name, "route", "add", "default", "via", f"10.194.{index}.1")
        subprocess.run(in_netns(node.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"),
                       check=True, timeout=30)
        yield name, address
    finally:
        run_ip("netns", "del", name, check=False)
        run_ip("-n", node.netns, "link", "del", host_end, check=False)


@contextlib.contextmanager
def plain_routing(first: DatapathNode, second: DatapathNode) -> Iterator[tuple[str, str, str]]:
    """Plain IPv4 routing over the nodes' IPv6 underlay (RFC 5549 next hops): (client netns
    behind `first`, server netns behind `second`, server address)."""
    with routed_host(first, 1) as (client, _), routed_host(second, 2) as (server, address):
        routes = [(first, "10.194.2.0/24", second), (second, "10.194.1.0/24", first)]
        for node, prefix, other in routes:
            run_ip("-n", node.netns, "route", "add", prefix, "via", "inet6",
                   other.underlay_address, "dev", node.underlay_link)
        try:
            yield client, server, address
        finally:
            for node, prefix, _ in routes:
                run_ip("-n", node.netns, "route", "del", prefix, check=False)


@dataclass
class Attached:
    """A Pod attached by vpc-attach on a node: its netns name and IPv4 address."""

    netns: str
    address: str
    node: DatapathNode


@contextlib.contextmanager
def attached_pod(node: DatapathNode, cluster: Cluster, cni_bin: Path, work: Path, vpc: str,
                 att: str, subnet: str, environ: dict[str, str] | None = None,
                 mtu: int | None = None) -> Iterator[Attached]:
    """A Pod of `vpc` on `node` attached by vpc-attach in-process (host settings from
    `environ`), publishing its BGP objects; DEL afterwards."""
    directory = work / f"pod-{node.name}-{vpc}-{att}"
    (directory / "locks").mkdir(parents=True)
    plugin = Plugin(cni_bin, directory / "locks", {
        "VPC_ATTACH_NODE_NAME": node.name, "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
        "VPC_ATTACH_LOCK_DIR": str(directory / "locks"),
        "VPC_ATTACH_HOST_CONFIG": str(directory / "absent-host.json"), **(environ or {})},
        prefix=node.prefix)
    conf = base_conf(vpc, att, isolation="vrf", ipam=host_local(directory / "ipam", subnet),
                     publish={"bgp": True, "endpointSlice": False},
                     **({"mtu": mtu} if mtu is not None else {}))
    container = f"tcp-{att}-{secrets.token_hex(3)}"
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={container}"
    with temporary_netns("vpa-tcp") as netns:
        result = plugin.ok("ADD", conf, container_id=container, netns=netns, CNI_ARGS=args)
        try:
            yield Attached(os.path.basename(netns), result["ips"][0]["address"].split("/")[0],
                           node)
        finally:
            plugin.ok("DEL", with_prev(conf, result), container_id=container, netns=netns,
                      CNI_ARGS=args)


def reachable(client: str, address: str) -> bool:
    """One ping from client answered."""
    return subprocess.run(in_netns(client, "ping", "-c", "1", "-W", "1", address),
                          capture_output=True, check=False, timeout=30).returncode == 0


@contextlib.contextmanager
def galactic_pair(datapath: Datapath, cluster: Cluster, kube: Kube, cni_bin: Path, work: Path,
                  offloads: str, index: int) -> Iterator[tuple[Attached, Attached]]:
    """Two Pods of a fresh VPC through galactic's datapath (node 1 → node 2), the node's
    `galacticOffloads` host setting as given; once they reach each other."""
    vpc = random_vpc()
    environ = {"VPC_ATTACH_GALACTIC_OFFLOADS": offloads}
    first, second = datapath.nodes
    with bound(kube, vpc), \
            attached_pod(first, cluster, cni_bin, work, vpc, "1", f"10.195.{index}.0/25",
                         environ) as client, \
            attached_pod(second, cluster, cni_bin, work, vpc, "2", f"10.195.{index}.128/25",
                         environ) as server:
        datapath.wait(f"Pods of VPC {vpc} to reach each other through galactic",
                      lambda: reachable(client.netns, server.address), REACH_TIMEOUT_S)
        yield client, server


def gro(sender: DatapathNode, receiver: DatapathNode, on: bool) -> None:
    """GRO on the receiver's underlay as a NIC does it. A veth merges only what its peer hands
    it unsegmented (Linux's veth_skb_is_eligible_for_gro: a peer with TSO passes its packets
    by), so the sender's underlay has TSO off meanwhile; off: both as the harness made them."""
    set_offloads(sender.netns, "tso", "off" if on else "on", link=sender.underlay_link)
    set_offloads(receiver.netns, "gro", "on" if on else "off", link=receiver.underlay_link)


# Kernel End.DT46 mode: two more nodes, no galactic ---------------------------------------

def kernel_nodes(kube: Kube, cluster: Cluster, work: Path
                 ) -> contextlib.AbstractContextManager[list[DatapathNode]]:
    """Nodes 3 and 4 (nodes 1 and 2 are galactic's in the same run): e2e/harness/srv6_nodes."""
    return srv6_nodes.kernel_nodes(kube, cluster, work, (3, 4))


@contextlib.contextmanager
def kernel_pair(nodes: list[DatapathNode], cluster: Cluster, kube: Kube, cni_bin: Path,
                work: Path) -> Iterator[tuple[Attached, Attached]]:
    """Two Pods of a fresh VPC on nodes without galactic, and each node's hand-made `encap
    seg6` route toward the other's Pod (in the VPC's VRF table, with the other node's locator
    reachable from there too: the outer packet is looked up in the VRF it left). Their MTU
    leaves the 40 bytes too (on a node without galactic's pins vpc-attach does not know the
    packets will be encapsulated: the stanza's `mtu`)."""
    vpc = random_vpc()
    first, second = nodes
    with bound(kube, vpc), \
            attached_pod(first, cluster, cni_bin, work, vpc, "1", "10.196.1.0/24",
                         mtu=POD_MTU) as client, \
            attached_pod(second, cluster, cni_bin, work, vpc, "2", "10.196.2.0/24",
                         mtu=POD_MTU) as server:
        for node, pod, other in ((first, server, second), (second, client, first)):
            srv6_nodes.route_toward(node, other, vpc, [pod.address])
        wait_until(f"Pods of VPC {vpc} to reach each other through kernel SRv6",
                   lambda: reachable(client.netns, server.address), REACH_TIMEOUT_S)
        yield client, server


def summary(path: TcpPath, base: TcpPath) -> str:
    """One markdown row: against the veth pair's median, and round by round (each round's rate
    over the veth pair's in the same round: the host's load drifts between rounds)."""
    if path.unavailable or not path.rates:
        return f"| {path.label} | n/a: {path.unavailable or 'not measured'} |||||||||"
    drops = list(zip(*path.drops, strict=True)) if path.drops else []
    dropped = " / ".join(f"{int(median(list(d)))} ({max(d)})" for d in drops)
    claimed = f"{int(median(path.claimed))} ({max(path.claimed)})" if path.pin_dirs else "-"
    paired = [rate / ref for rate, ref in zip(path.rates, base.rates, strict=False) if ref]
    return (f"| {path.label} | {path.offloads} | {len(path.rates)} | "
            f"{median(path.rates):.3f} | {min(path.rates):.3f} | {max(path.rates):.3f} | "
            f"{median(path.rates) / median(base.rates):.2f}x | {median(paired):.2f}x "
            f"({min(paired):.2f}-{max(paired):.2f}) | {int(median(path.retransmits))} "
            f"({min(path.retransmits)}-{max(path.retransmits)}) | {dropped} | {claimed} |")


def table(paths: list[TcpPath]) -> list[str]:
    """The markdown table of every path, in the order given."""
    base = next(p for p in paths if p.key == "veth")
    return ["| TCP, 1 stream, node 1 → node 2 | client's offloads | rounds | median Gbit/s | "
            "min | max | x veth pair (medians) | x veth pair, same round: median (min-max) | "
            "retransmits median (min-max) | underlay tx_dropped node 1 / node 2 median (max) "
            "| dropped by usid_egress/usid_ingress median (max) |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
            *(summary(path, base) for path in paths)]


def describe(environ: dict[str, Any]) -> str:
    """How the setting was given (for the report)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(environ.items()))
