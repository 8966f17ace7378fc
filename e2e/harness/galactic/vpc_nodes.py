"""vpc-attach on galactic's datapath nodes (`e2e.harness.galactic.datapath`): each node's plugin
(and its agent in the agent pass) installed beside galactic-cni and galactic-router, Pods of a
VPC attached there with `isolation: vrf` and published, and what a test reads back: the routes
galactic-router wrote into `egress_route_table`, galactic's maps decoded, which Pod a packet
reached. Nothing here writes a route, a neighbour or a map row on a node."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cni_plugin.core import naming
from cni_plugin.galactic import layout
from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.datapath import STATUS_REFRESH_S, Datapath, DatapathNode
from e2e.harness.galactic.maps import EgressRoute
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.pace import Bound, pace
from e2e.harness.packets import listener, send
from e2e.harness.plugin import VIA_AGENT, Plugin, base_conf, host_local, with_prev
from e2e.harness.publishing import create_pod, delete_pod

# Until galactic-router on a node has written what it learned from another: two of the router's
# status refresh periods (its reconcile) and the CPU work of both routers and their BGP exchange
# on the emulated vCPU, in the plugin's cold starts measured in the guest (120 s at the quiet
# pace of 5 s; a cross-node ping of a busy run, guest cold start 18 s, waited longer than the
# old fixed 120 s).
ROUTE_STARTS = 12
PORT = 7070
UNDERLAY_MTU = 1500  # the harness's underlay veth
POD_MTU = UNDERLAY_MTU - 40  # room for usid_egress's outer IPv6 header
# Two VPCs with the same subnets on the same nodes: per node, one v6 and one v4 pool.
SUBNETS = {1: ("fd00:d1:1::/64", "10.211.1.0/24"), 2: ("fd00:d1:2::/64", "10.211.2.0/24")}


@dataclass
class VpcAttachNode:
    """A galactic datapath node (`DatapathNode`) running vpc-attach: its runner, IPAM and lock
    dirs."""

    galactic: DatapathNode
    plugin: Plugin
    directory: Path

    @property
    def name(self) -> str:
        """Its node name."""
        return self.galactic.name

    def ipam(self, vpc: str) -> dict[str, Any]:
        """host-local over the node's pools (the same subnets for every VPC)."""
        return host_local(self.directory / "ipam", *SUBNETS[self.galactic.index])

    def table_of(self, vpc: str) -> int | None:
        """The Linux table of the VPC's VRF on this node (None: no VRF)."""
        shown = subprocess.run(["ip", "-n", self.galactic.netns, "-d", "-j", "link", "show",
                                naming.vrf_name(vpc)], capture_output=True, text=True,
                               timeout=30, check=False)
        if shown.returncode != 0:
            return None
        return int(json.loads(shown.stdout)[0]["linkinfo"]["info_data"]["table"])

    def rows(self) -> dict[str, dict[str, str]]:
        """Every galactic map vpc-attach writes, as bpftool reads it: {map: {key: value}}."""
        return {m.name: {e.key.hex(): e.value.hex() for e in self.galactic.dump_map(m.name)}
                for m in layout.MAPS}


@dataclass
class DatapathPod:
    """An attached Pod: its netns (name, and path for CNI_NETNS), addresses and what ADD
    answered."""

    netns: str
    path: str
    v4: str
    v6: str
    vpc: str
    att: str
    name: str
    node: VpcAttachNode
    conf: dict[str, Any]
    result: dict[str, Any]
    container: str
    cni_args: str
    deleted: bool = field(default=False)

    def delete(self) -> None:
        """The runtime's DEL, once."""
        if not self.deleted:
            self.node.plugin.ok("DEL", with_prev(self.conf, self.result),
                                container_id=self.container, netns=self.path,
                                CNI_ARGS=self.cni_args)
            self.deleted = True


@contextlib.contextmanager
def vpc_attach_nodes(datapath: Datapath, cluster: Any, cni_bin: Path,
                     own_agents: OwnAgents) -> Iterator[list[VpcAttachNode]]:
    """vpc-attach on each node of the datapath (its node agent too, in the agent pass), with
    the node's name, the plugin's kubeconfig, and a lock dir and log of its own."""
    with contextlib.ExitStack() as stack:
        made = []
        for galactic_node in datapath.nodes:
            directory = galactic_node.directory / "vpc-attach"
            (directory / "locks").mkdir(parents=True)
            environ = {"VPC_ATTACH_NODE_NAME": galactic_node.name,
                       "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
                       "VPC_ATTACH_LOCK_DIR": str(directory / "locks"),
                       "VPC_ATTACH_LOG_FILE": str(directory / "vpc-attach.log"),
                       "VPC_ATTACH_HOST_CONFIG": str(directory / "absent-host.json")}
            runner = Plugin(cni_bin, directory / "locks", dict(environ),
                            prefix=galactic_node.prefix)
            if VIA_AGENT:
                (directory / "agent").mkdir()
                agent = own_agents.enter(stack, directory / "agent",
                                         prefix=galactic_node.prefix, env=environ)
                runner.agent_socket = str(agent.socket)
            made.append(VpcAttachNode(galactic_node, runner, directory))
        yield made


@contextlib.contextmanager
def attached(kube: Kube, node: VpcAttachNode, vpc: str, att: str, *,
             ipam: dict[str, Any] | None = None, environ: dict[str, str] | None = None,
             **conf: Any) -> Iterator[DatapathPod]:
    """A Pod on `node` in (vpc, att), published (BGP and slices); DEL afterwards. `ipam`
    instead of the node's pools; `environ`: host settings of this ADD alone (e.g.
    `VPC_ATTACH_GALACTIC_OFFLOADS`), as a runtime's environment would carry them."""
    name = f"dp-{att}-{os.urandom(2).hex()}"
    uid = create_pod(kube, name, node.name)
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID={uid}"
    stanza = base_conf(vpc, att, isolation="vrf", ipam=ipam or node.ipam(vpc),
                       publish={"bgp": True, "endpointSlice": True}, **conf)
    with temporary_netns("vpa-dppod") as netns:
        result = node.plugin.ok("ADD", stanza, container_id=f"ctr-{name}", netns=netns,
                                CNI_ARGS=args, **(environ or {}))
        four, six = (ip["address"].split("/")[0] for ip in
                     sorted(result["ips"], key=lambda ip: ":" in ip["address"]))
        pod = DatapathPod(os.path.basename(netns), netns, four, six, vpc, att, name, node,
                          stanza, result, f"ctr-{name}", args)
        try:
            yield pod
        finally:
            pod.delete()
            delete_pod(kube, name)


def host_prefixes(pod: DatapathPod) -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """What the Pod is advertised as (host-local returns the /64's address: its network)."""
    return {ipaddress.ip_network(f"{pod.v6}/64", strict=False),
            ipaddress.ip_network(f"{pod.v4}/32")}


def routes_to(reader: VpcAttachNode, pod: DatapathPod) -> list[EgressRoute]:
    """`reader`'s egress_route_table rows for the Pod's prefixes, in its VPC's table."""
    table = reader.table_of(pod.vpc)
    return [route for route in reader.galactic.egress_routes()
            if route.table_id == table and route.prefix in host_prefixes(pod)]


def wait_routes(datapath: Datapath, reader: VpcAttachNode, pod: DatapathPod,
                present: bool = True) -> None:
    """Until galactic-router on `reader` has written (or removed) the Pod's prefixes."""
    datapath.wait(f"galactic-router on {reader.name} to {'write' if present else 'remove'} "
                  f"the routes to {pod.name}",
                  lambda: (len(routes_to(reader, pod)) == 2) == present, route_bound(),
                  detail=lambda: f"egress_route_table: {reader.galactic.egress_routes()}")


def route_bound() -> Bound:
    """How long galactic-router may take to write (or remove) a route it learned, here."""
    return pace().plus(ROUTE_STARTS, 2 * STATUS_REFRESH_S, "two of the router's status "
                       "refresh periods")


def routes_of(nodes: Sequence[VpcAttachNode]) -> str:
    """Each node's egress_route_table, for a failure message about reachability."""
    return "\n".join(f"{node.name} egress_route_table: {node.galactic.egress_routes()}"
                      for node in nodes)


class NamedPod(Protocol):
    """A Pod as `answered_by` reads it, whoever attached it: its name and netns."""

    @property
    def name(self) -> str: ...

    @property
    def netns(self) -> str: ...  # name or path


def answered_by(src: NamedPod, dst: str, servers: Sequence[NamedPod], work: Path) -> list[str]:
    """Which of `servers` (TCP listeners on PORT) received a connection from `src` to `dst`."""
    with contextlib.ExitStack() as stack:
        heard = {pod.name: stack.enter_context(listener(pod.netns, "tcp", PORT, work))
                 for pod in servers}
        send(src.netns, "tcp", dst, PORT, f"from-{src.name}", timeout=5.0)
        return sorted(name for name, ear in heard.items() if f"from-{src.name}" in ear.payloads())


def ping_mtu(src: DatapathPod, dst: str, size: int) -> subprocess.CompletedProcess[str]:
    """One ping of `size` bytes in all (IP header included), never fragmented."""
    overhead = 48 if ":" in dst else 28
    return subprocess.run(["ip", "netns", "exec", src.netns, "ping", "-n", "-c", "1", "-W", "3",
                           "-M", "do", "-s", str(size - overhead), dst],
                          capture_output=True, text=True, timeout=30, check=False)




def decoded_rows(node: VpcAttachNode) -> list[str]:
    """The node's galactic rows vpc-attach wrote or relies on, one line each (for the report)."""
    lines = []
    for map_name, rows in node.rows().items():
        for key, value in sorted(rows.items()):
            described = _describe(map_name, bytes.fromhex(key), bytes.fromhex(value))
            lines.append(f"| {map_name} | {described} |")
    return lines


def _describe(map_name: str, key: bytes, value: bytes) -> str:
    if map_name == layout.EGRESS_ROUTE_TABLE.name:
        table, prefix = layout.decode_route_key(key)
        route = layout.EgressRoute.decode(value)
        target = "pass-through (local)" if route.link_ifindex == 0 else \
            f"encap to {route.sid} via ifindex {route.link_ifindex} {route.smac}->{route.dmac}"
        return f"table {table} {prefix} | {target}"
    if map_name == layout.VRF_TABLE.name:
        block, argument = layout.decode_vrf_key(key)
        row = layout.VrfRow.decode(value)
        return (f"block {block:#x} argument {argument} | table {row.table_id} kind "
                f"{row.egress_kind} packets {row.packets} generation {row.generation}")
    if map_name == layout.IFINDEX_VRF_TABLE.name:
        block, argument = layout.decode_ifindex_value(value)
        return f"ifindex {layout.decode_ifindex_key(key)} | block {block:#x} argument {argument}"
    return f"{key.hex()} | {value.hex()}"
