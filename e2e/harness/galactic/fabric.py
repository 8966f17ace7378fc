"""One galactic-router per simulated node, and a gobgpd collector peered with all of them.

Each router runs inside its node's network namespace (whatever it does to the kernel stays
there), reaching the API server through the node's forwarder (``e2e.harness.nodes``) and the
collector over a veth into a private fabric namespace, where gobgpd listens. Node ``i``
(1-based) speaks BGP from ``192.0.2.(4i+2)`` to the collector at ``192.0.2.(4i+1)``; that
address is also its EVPN next hop. All addresses live in namespaces of ours only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import json
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cni_plugin.publish.resources import GROUP, VERSION
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.rib import EvpnRoute, parse_rib
from e2e.harness.kernel import run_ip
from e2e.harness.kube import Kube, crd_established
from e2e.harness.nodes import in_node
from e2e.harness.wait import wait_until

ASN = 65000
SESSION_ESTABLISHED = 6  # gobgp's api.PeerState.SessionState, as ``gobgp neighbor -j`` prints it
BGP_PORT = 179  # gobgpd's default; a BGPPeer without remotePort means galactic's 1790
COLLECTOR_ID = "192.0.2.1"
COLLECTOR_API = "127.0.0.1:50051"  # inside the fabric namespace: no clash with the host
EVPN = {"afi": "l2vpn", "safi": "evpn"}
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
BGP_PEERS = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/bgppeers"
# The kinds galactic-router watches that vpc-attach does not ship (its RBAC pre-flight list).
# Only those: others of galactic's CRDs do not even load here (bgpcommunitysets' CEL rule is
# refused by this API server).
ROUTER_WATCHES = ("bgppeers", "bgppolicies", "servicevipbindings")
STOP_TIMEOUT_S = 15.0
PR_SET_PDEATHSIG = 1


def collector_address(index: int) -> str:
    """The collector's end of node ``index``'s link."""
    return str(ipaddress.IPv4Address("192.0.2.0") + 4 * index + 1)


def router_address(index: int) -> str:
    """Node ``index``'s BGP address (its router's local address and EVPN next hop)."""
    return str(ipaddress.IPv4Address("192.0.2.0") + 4 * index + 2)


def collector_config(nodes: int) -> str:
    """gobgpd's TOML: iBGP, l2vpn-evpn only, one neighbor per node's router."""
    lines = ["[global.config]", f"  as = {ASN}", f'  router-id = "{COLLECTOR_ID}"', ""]
    for index in range(1, nodes + 1):
        lines += [
            "[[neighbors]]",
            "  [neighbors.config]",
            f'    neighbor-address = "{router_address(index)}"',
            f"    peer-as = {ASN}",
            "  [[neighbors.afi-safis]]",
            "    [neighbors.afi-safis.config]",
            '      afi-safi-name = "l2vpn-evpn"',
            "",
        ]
    return "\n".join(lines)


def apply_galactic_crds(kube: Kube, crd_dir: Path) -> list[str]:
    """Create the CRDs galactic-router watches beyond ours (ROUTER_WATCHES), from galactic's
    ``config/crd/``; ours from ``packaging/`` stay as they are. Returns the names created, once
    Established."""
    created = []
    for plural in ROUTER_WATCHES:
        name = f"{plural}.{GROUP}"
        manifest = yaml.safe_load((crd_dir / f"{GROUP}_{plural}.yaml").read_text())
        if kube.get(f"{CRDS}/{name}") is None:
            kube.create(CRDS, manifest)
            created.append(name)
    for name in created:
        wait_until(f"CRD {name} established", functools.partial(crd_established, kube, name))
    return created


def _die_with_parent() -> None:
    # A router or collector must not outlive the test process, however it ends.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Child:
    """A process of the fabric, its output in a log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> None:
        """Raise (with the log's tail) if the process has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        """The last lines of its log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (a router then sends a Cease to its peers), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_child(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
    """Start ``argv`` with its output appended to ``log``, killed if this process dies."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent)
    return Child(name, proc, log)


@dataclass
class Fabric:
    """The collector in its namespace, and the routers attached so far (by node index)."""

    build: GalacticBuild
    directory: Path
    nodes: int
    netns: str = field(default_factory=lambda: f"vpa-fabric-{secrets.token_hex(3)}")
    collector: Child | None = None
    routers: dict[int, Child] = field(default_factory=dict)

    def start_collector(self) -> None:
        """The fabric namespace and gobgpd in it, waiting until its API answers."""
        run_ip("netns", "add", self.netns)
        run_ip("-n", self.netns, "link", "set", "lo", "up")
        config = self.directory / "collector.toml"
        config.write_text(collector_config(self.nodes))
        self.collector = start_child("gobgpd", [*in_node(self.netns), str(self.build.gobgpd),
                                           "-f", str(config), "-t", "toml",
                                           "--api-hosts", COLLECTOR_API],
                                self.directory / "gobgpd.log")
        wait_until("the collector's API", lambda: self._gobgp("neighbor") is not None,
                   alive=self.collector.alive)

    def link(self, index: int, node_netns: str) -> str:
        """A veth from node ``index``'s namespace to the fabric; returns its BGP address."""
        inside, outside = "bgp0", f"node{index}"
        run_ip("-n", node_netns, "link", "add", inside, "type", "veth", "peer", "name", outside,
               "netns", self.netns)
        run_ip("-n", node_netns, "addr", "add", f"{router_address(index)}/30", "dev", inside)
        run_ip("-n", self.netns, "addr", "add", f"{collector_address(index)}/30", "dev", outside)
        run_ip("-n", node_netns, "link", "set", inside, "up")
        run_ip("-n", self.netns, "link", "set", outside, "up")
        return router_address(index)

    def start_router(self, index: int, node_netns: str, node_name: str,
                     kubeconfig: Path) -> Child:
        """galactic-router for ``node_name`` in its namespace, speaking BGP from its link."""
        router = start_child(f"galactic-router {node_name}",
                             [*in_node(node_netns), str(self.build.router)],
                             self.directory / f"router-{index}.log",
                             router_env(node_name, kubeconfig, router_address(index)))
        self.routers[index] = router
        return router

    def alive(self) -> None:
        """Raise if the collector or any router has exited."""
        for child in (self.collector, *self.routers.values()):
            if child is not None:
                child.alive()

    def rib(self) -> list[EvpnRoute]:
        """The collector's EVPN routes (``gobgp global rib -a evpn -j``)."""
        text = self._gobgp("global", "rib", "-a", "evpn")
        return parse_rib(text or "{}")

    def established(self) -> set[str]:
        """Addresses of the routers whose session with the collector is Established."""
        neighbors = json.loads(self._gobgp("neighbor") or "[]")
        return {n["state"]["neighbor_address"] for n in neighbors
                if n.get("state", {}).get("session_state") == SESSION_ESTABLISHED}

    def _gobgp(self, *args: str) -> str | None:
        result = subprocess.run([*in_node(self.netns), str(self.build.gobgp),
                                 "-u", COLLECTOR_API.split(":")[0],
                                 "-p", COLLECTOR_API.split(":")[1], *args, "-j"],
                                capture_output=True, text=True, timeout=30, check=False)
        return result.stdout if result.returncode == 0 else None

    def close(self) -> None:
        """Stop every process, then remove the fabric namespace (and its veth ends)."""
        for router in self.routers.values():
            router.stop()
        if self.collector is not None:
            self.collector.stop()
        run_ip("netns", "del", self.netns, check=False)


@contextlib.contextmanager
def running_fabric(build: GalacticBuild, directory: Path, nodes: int) -> Iterator[Fabric]:
    """A collector ready for ``nodes`` routers; everything stopped and removed after."""
    fabric = Fabric(build, directory, nodes)
    try:
        fabric.start_collector()
        yield fabric
    finally:
        fabric.close()


def router_env(node_name: str, kubeconfig: Path, local_address: str) -> dict[str, str]:
    """galactic-router's environment: its node, the API server, its BGP (and next-hop) address."""
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "GALACTIC_ROUTER_NODE_NAME": node_name,
            "KUBECONFIG": str(kubeconfig),
            "GALACTIC_ROUTER_BGP_LOCAL_ADDRESS": local_address,
            # Its own namespace: the default ports cannot clash; GC only at start.
            "GALACTIC_ROUTER_GC_INTERVAL": "24h"}


def create_peer(kube: Kube, namespace: str, router: str, index: int) -> str:
    """A BGPPeer pointing ``router`` at the collector (iBGP, EVPN); returns its path."""
    return create_bgp_peer(kube, namespace, f"collector-{router}", router,
                           collector_address(index))


def create_bgp_peer(kube: Kube, namespace: str, name: str, router: str, address: str) -> str:
    """A BGPPeer ``name``: ``router`` opens an iBGP EVPN session to ``address`` port 179 (without
    ``remotePort`` galactic dials 1790); returns its path."""
    collection = BGP_PEERS.format(namespace=namespace)
    kube.create(collection, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPPeer", "metadata": {"name": name},
        "spec": {"routerRef": {"name": router}, "peerASN": ASN, "address": address,
                 "remotePort": BGP_PORT, "addressFamilies": [EVPN]}})
    return f"{collection}/{name}"


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind`` of an object, if any."""
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def is_true(read: Callable[[], dict[str, Any] | None], kind: str) -> Callable[[], bool]:
    """A condition for ``wait_until``: ``read()``'s condition ``kind`` has status True."""
    def check() -> bool:
        found = condition(read(), kind)
        return found is not None and found.get("status") == "True"
    return check
