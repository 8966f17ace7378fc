"""galactic's eBPF uSID datapath on simulated nodes: galactic-cni and galactic-router per node.

Node ``i`` (1-based) is a network namespace (``e2e.harness.nodes.node_namespace``: the API
server is forwarded into it) with its own bpffs instance, mounted at ``<directory>/bpffs`` in
this process's mount namespace. Every process of the node runs through ``DatapathNode.prefix``:
in its namespace, with that bpffs bind-mounted at ``/sys/fs/bpf`` in the process's own mount
namespace, so galactic's pins are at ``/sys/fs/bpf/galactic`` for it and at
``DatapathNode.pin_dir`` for the test. Two nodes share an IPv6 underlay veth
(``fd00:5e7::i/64``); each has its default route and a route to the other's SRv6 locator
(``locator(i)``, node ID ``i``) via the other: the underlay's own addresses and routes are the
only kernel state this module writes on a node. galactic-cni (``run``) loads and pins the
datapath and attaches ``usid_ingress`` on the link of the default route, as its DaemonSet does;
galactic-router speaks BGP from the node's underlay address to every other node's router
(BGPPeer objects, full mesh), so the sessions keep the underlay neighbours resolved, which its
``egress_route_table`` writes need.

galactic-router, as seen here, imports a BGPVRFInstance created after its start only on the
next change of its peers, advertisements or policies (its config hash leaves VRF instances
out), as when a node's BGPAdvertisement is written after the instance. By its code, its one GC
pass (at start: the interval is 24 h here; right after its caches sync, well before its
sessions come up) deletes ``G…V`` VRF devices of VPCs the node advertises nothing in.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_plugin.publish.resources import ROUTERS
from e2e.harness.bpf import mounted_bpffs
from e2e.harness.cluster import Cluster
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import Child, create_bgp_peer, router_env, start_child
from e2e.harness.galactic.maps import (
    EgressRoute,
    MapEntry,
    TcFilter,
    decode_egress_route,
    parse_map_dump,
    parse_tc_filters,
)
from e2e.harness.kube import Kube
from e2e.harness.nodes import api_port, in_node, node_namespace
from e2e.harness.pace import Bound, pace
from e2e.harness.publishing import BGP_NS, create_router
from e2e.harness.wait import wait_until

PIN_SUBDIR = "galactic"  # galactic's attach.PinDir is /sys/fs/bpf/galactic
# What galactic-cni pins (attach.Load): the maps, then usid_egress's program last.
PINS = ("locator_table", "function_table", "vrf_table", "ifindex_vrf_table",
        "egress_route_table", "node_src_addr_table", "public_uplink_table", "usid_egress_prog")
INGRESS_FILTER = "galactic_usid_ingress"  # attach.filterName
UNDERLAY_LINK = "vpa-ul{index}"
# Each node is its own network namespace: galactic's default ports cannot clash.
CNI_HEALTH_PORT, CNI_METRICS_PORT = 5180, 9180
SESSION_ESTABLISHED = "Established"
# Bounds in the plugin's cold starts measured on this machine (`e2e.harness.pace`; 8 s in the
# emulated VM at a busy moment): galactic-cni's start loads and verifies its eBPF programs, CPU
# work that slows down with the machine (both nodes ready in 44 s in the VM, quiet).
START_STARTS = 25
# The router writes a BGPPeer's status every STATUS_REFRESH_S (galactic's own interval), so a
# session Established just after a write shows one period later; plus the sessions' own
# exchange (OPEN, KEEPALIVE) on the emulated CPU.
STATUS_REFRESH_S = 30.0
SESSION_STARTS = 30  # with gobgp's connect retries when the first OPEN finds no peer yet
RUN_STARTS = 15  # one short-lived command of a node (bpftool, tc, ip; galactic's own tools)
# The node's processes see its bpffs at /sys/fs/bpf (``ip netns exec`` gave them a fresh
# sysfs in their own mount namespace; nothing propagates back). $1: the bpffs directory.
BIND_BPFFS = 'mount --bind "$1" /sys/fs/bpf && shift && exec "$@"'


def underlay_address(index: int) -> str:
    """Node ``index``'s underlay address (also its BGP address and EVPN next hop)."""
    return f"fd00:5e7::{index:x}"


def locator(index: int) -> str:
    """Node ``index``'s SRv6 locator: 2001:db8:a::/48 for node 1, b for node 2, ..."""
    return f"2001:db8:{0xa + index - 1:x}::/48"


def router_id(index: int) -> str:
    """Node ``index``'s BGPRouter routerID (iBGP peers need distinct ones)."""
    return f"198.51.100.{index}"


def _run(argv: list[str], timeout: float | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True,
                            timeout=timeout or pace().starts(RUN_STARTS).seconds, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): "
                           f"{result.stderr.strip()}")
    return result.stdout


@dataclass
class DatapathNode:
    """A simulated node: its names, namespace, bpffs, underlay and the processes it runs."""

    index: int
    name: str  # the Node name its BGPRouter targets
    router: str  # its BGPRouter
    netns: str
    bpffs: Path  # its bpffs, as this process sees it
    directory: Path  # its files: process logs
    children: dict[str, Child] = field(default_factory=dict)

    @property
    def pin_dir(self) -> Path:
        """galactic's pin directory (``/sys/fs/bpf/galactic`` for the node's processes)."""
        return self.bpffs / PIN_SUBDIR

    @property
    def underlay_link(self) -> str:
        """Its end of the underlay veth."""
        return UNDERLAY_LINK.format(index=self.index)

    @property
    def underlay_address(self) -> str:
        """Its underlay IPv6 address."""
        return underlay_address(self.index)

    @property
    def locator(self) -> str:
        """Its BGPRouter's SRv6 locator (/48)."""
        return locator(self.index)

    @property
    def node_id(self) -> int:
        """Its BGPRouter's node ID."""
        return self.index

    @property
    def prefix(self) -> list[str]:
        """argv prefix running a program as a process of this node: in its network namespace,
        with its bpffs at /sys/fs/bpf (e.g. ``Plugin(prefix=node.prefix)``)."""
        return [*in_node(self.netns), "sh", "-c", BIND_BPFFS, "node-bpffs", str(self.bpffs)]

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        """Start a long-running process of this node, its output in ``<directory>/<name>.log``."""
        child = start_child(f"{name} on {self.name}", [*self.prefix, *argv],
                            self.directory / f"{name}.log", env)
        self.children[name] = child
        return child

    def run(self, argv: list[str], env: dict[str, str] | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run a short-lived process of this node to its end."""
        return subprocess.run([*self.prefix, *argv], capture_output=True, text=True, env=env,
                              timeout=timeout or pace().starts(RUN_STARTS).seconds, check=False)

    def alive(self) -> None:
        """Raise (with its log's tail) if a process of this node has exited."""
        for child in self.children.values():
            child.alive()

    def logs(self) -> str:
        """The tail of every process log of this node, for a failure message."""
        return "\n".join(f"--- {child.name} ({child.log}):\n{child.tail()}"
                         for child in self.children.values())

    def pins(self) -> set[str]:
        """Names pinned in galactic's pin directory."""
        return {entry.name for entry in self.pin_dir.iterdir()} if self.pin_dir.is_dir() \
            else set()

    def dump_map(self, name: str) -> list[MapEntry]:
        """A pinned map's entries, read by ``bpftool`` (not by galactic's code)."""
        return parse_map_dump(_run(["bpftool", "-j", "map", "dump", "pinned",
                                    str(self.pin_dir / name)]))

    def egress_routes(self) -> list[EgressRoute]:
        """The rows of its ``egress_route_table``."""
        return [decode_egress_route(entry) for entry in self.dump_map("egress_route_table")]

    def ingress_filters(self, link: str | None = None) -> list[TcFilter]:
        """The tc filters on the ingress hook of ``link`` (default: its underlay link)."""
        return parse_tc_filters(_run(["tc", "-n", self.netns, "-j", "filter", "show", "dev",
                                      link or self.underlay_link, "ingress"]))

    def map_id(self, name: str) -> int:
        """The kernel's id of a pinned map (``bpftool map show``)."""
        shown: dict[str, Any] = json.loads(_run(["bpftool", "-j", "map", "show", "pinned",
                                                 str(self.pin_dir / name)]))
        return int(shown["id"])

    def link(self, name: str | None = None) -> dict[str, Any]:
        """``ip -j link show`` of a link of this node (default: its underlay link)."""
        shown: list[dict[str, Any]] = json.loads(_run(["ip", "-n", self.netns, "-j", "link",
                                                       "show", name or self.underlay_link]))
        return shown[0]


@contextlib.contextmanager
def datapath_node(kube: Kube, cluster: Cluster, directory: Path, index: int) -> Iterator[
        DatapathNode]:
    """Node ``index``: its namespace, its bpffs and its BGPRouter (locator, node ID, router ID);
    all removed afterwards. No process runs yet."""
    node_dir = directory / f"node-{index}"
    node_dir.mkdir(parents=True)
    with node_namespace(api_port(cluster.server)) as netns, \
            mounted_bpffs(node_dir / "bpffs") as bpffs:
        name = f"dp{index}-{secrets.token_hex(3)}"
        router = create_router(kube, name, locator=locator(index), node_id=index,
                               router_id=router_id(index))
        try:
            yield DatapathNode(index, name, router, netns, bpffs, node_dir)
        finally:
            kube.delete(ROUTERS.path(BGP_NS, router))


def link_underlay(first: DatapathNode, second: DatapathNode) -> None:
    """One veth between the two nodes: addresses (no DAD), each node's default route and a
    route to the other's locator via the other. Gone with the namespaces."""
    _run(["ip", "link", "add", first.underlay_link, "netns", first.netns, "type", "veth",
          "peer", "name", second.underlay_link, "netns", second.netns])
    for node, other in ((first, second), (second, first)):
        ip = ["ip", "-n", node.netns]
        _run([*ip, "addr", "add", f"{node.underlay_address}/64", "dev", node.underlay_link,
              "nodad"])
        _run([*ip, "link", "set", node.underlay_link, "up"])
        _run([*ip, "-6", "route", "add", "default", "via", other.underlay_address, "dev",
              node.underlay_link])
        _run([*ip, "-6", "route", "add", other.locator, "via", other.underlay_address, "dev",
              node.underlay_link])


def start_cni(node: DatapathNode, build: GalacticBuild, underlay_by_env: bool = False) -> Child:
    """``galactic-cni run`` on the node. By default it finds its links itself, as its DaemonSet
    does: every link of an IPv6 default route in any table, re-evaluated on every link or
    route change (so also ``lo`` once a table holds ``unreachable default``, as vpc-attach's VRF
    tables do); ``underlay_by_env`` names the underlay link in GALACTIC_CNI_EBPF_INTERFACES."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if underlay_by_env:
        env["GALACTIC_CNI_EBPF_INTERFACES"] = node.underlay_link
    return node.start("galactic-cni", [str(build.cni), "run",
                                       "--grpc-health-port", str(CNI_HEALTH_PORT),
                                       "--metrics-port", str(CNI_METRICS_PORT)], env)


def cni_ready(node: DatapathNode) -> bool:
    """galactic-cni has pinned its datapath and attached ``usid_ingress`` on the underlay."""
    return set(PINS) <= node.pins() and any(
        f.name == INGRESS_FILTER for f in node.ingress_filters())


def wait_cni_ready(node: DatapathNode) -> None:
    """Wait until ``cni_ready``; raise with galactic-cni's log if it exits or times out."""
    wait_until(f"galactic-cni on {node.name} to pin its datapath and attach usid_ingress on "
               f"{node.underlay_link}", lambda: cni_ready(node), pace().starts(START_STARTS),
               interval=0.5, alive=node.alive, detail=node.logs)


def stop_cni(node: DatapathNode) -> None:
    """Stop galactic-cni and remove its pins (it leaves them, and its tc filters, behind; a
    new galactic-cni reuses the pinned maps with their rows and replaces the programs)."""
    node.children["galactic-cni"].stop()
    if node.pin_dir.exists():
        shutil.rmtree(node.pin_dir)


def start_router(node: DatapathNode, build: GalacticBuild, kubeconfig: Path) -> Child:
    """galactic-router on the node, speaking BGP from its underlay address; it writes what it
    learns into this node's ``egress_route_table`` (its bpffs is the node's)."""
    return node.start("galactic-router", [str(build.router)],
                      router_env(node.name, kubeconfig, node.underlay_address))


def create_mesh_peers(stack: contextlib.ExitStack, kube: Kube,
                      nodes: list[DatapathNode]) -> list[str]:
    """A BGPPeer from every node's router to every other node's underlay address (iBGP full
    mesh, EVPN), each deleted when ``stack`` closes; returns their paths."""
    peers = []
    for node in nodes:
        for other in nodes:
            if other is not node:
                peers.append(create_bgp_peer(kube, BGP_NS, f"{node.router}-to-{other.index}",
                                             node.router, other.underlay_address))
                stack.callback(kube.delete, peers[-1])
    return peers


def session_state(kube: Kube, peer: str) -> str | None:
    """A BGPPeer's session state as its router last reported it (``status.sessionState``)."""
    return str(((kube.get(peer) or {}).get("status") or {}).get("sessionState") or "") or None


@dataclass
class Datapath:
    """The nodes, their BGPPeers, and how long each phase of the start took (seconds)."""

    nodes: list[DatapathNode]
    peers: list[str]
    timings: dict[str, float] = field(default_factory=dict)

    def alive(self) -> None:
        """Raise if a process of any node has exited."""
        for node in self.nodes:
            node.alive()

    def logs(self) -> str:
        """Every node's process logs (tails)."""
        return "\n".join(node.logs() for node in self.nodes)

    def wait(self, what: str, condition: Callable[[], bool], timeout: float | Bound,
             detail: Callable[[], str] | None = None) -> None:
        """``wait_until`` with the nodes' processes checked; on a timeout their logs, after
        what ``detail`` says."""
        wait_until(what, condition, timeout, interval=0.5, alive=self.alive,
                   detail=lambda: "\n".join(((detail or str)(), self.logs())))

    def wait_sessions_established(self, kube: Kube) -> None:
        """Wait until every BGPPeer's router reports its session Established."""
        self.wait("every router's sessions Established",
                  lambda: all(session_state(kube, peer) == SESSION_ESTABLISHED
                              for peer in self.peers),
                  pace().plus(SESSION_STARTS, 2 * STATUS_REFRESH_S,
                              "two of the router's status refresh periods"),
                  detail=lambda: self.peer_statuses(kube))

    def peer_statuses(self, kube: Kube) -> str:
        """Each BGPPeer's status as its router last wrote it, for a failure message."""
        statuses = []
        for peer in self.peers:
            try:
                status = (kube.get(peer) or {}).get("status")
            except Exception as exc:  # what was seen is said, never a second failure
                status = f"unread: {exc}"
            statuses.append(f"{peer.rsplit('/', 1)[-1]}: {status}")
        return "BGPPeers' status as last written: " + "; ".join(statuses)


@contextlib.contextmanager
def galactic_datapath(kube: Kube, cluster: Cluster, build: GalacticBuild, directory: Path,
                      underlay_by_env: bool = False) -> Iterator[Datapath]:
    """Two nodes on one underlay, each running galactic-cni (datapath pinned, usid_ingress
    attached; ``underlay_by_env``: see ``start_cni``) and galactic-router (sessions Established
    with the other). Everything started is stopped and everything created removed afterwards,
    also on failure."""
    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        nodes = [stack.enter_context(datapath_node(kube, cluster, directory, index))
                 for index in (1, 2)]
        link_underlay(*nodes)
        datapath = Datapath(nodes, [])
        for node in nodes:
            start_cni(node, build, underlay_by_env)
            stack.callback(stop_cni, node)
        for node in nodes:
            wait_cni_ready(node)
        datapath.timings["galactic-cni ready"] = time.monotonic() - started
        for node in nodes:
            stack.callback(start_router(node, build, cluster.admin_kubeconfig).stop)
        datapath.peers = create_mesh_peers(stack, kube, nodes)
        datapath.wait_sessions_established(kube)
        datapath.timings["sessions Established"] = time.monotonic() - started
        yield datapath
