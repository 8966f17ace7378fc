"""Two nodes, one VPC, packets over SRv6: each node a network namespace running vpc-attach
(its own node name, lock dir and IPAM dir) against one control plane, joined by an IPv6
underlay. Each node answers its SID (vpc-attach); the routes to the other node's prefixes are
what galactic-router would install, written here from what the other node published."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.endpointslice import slice_name
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.nodes import api_port, in_node, node_namespace
from e2e.harness.plugin import Plugin, base_conf, host_local, random_vpc
from e2e.harness.publishing import Node, advertisement, create_pod, endpoint_slice, make_node
from e2e.harness.tenancy import bound

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel]
SID_ANNOTATION = "galactic.datum.net/srv6-sid"
TCP_PORT = 7070
PROCESS_TIMEOUT = 60


@dataclass
class SrNode:
    """A node namespace with vpc-attach and its BGPRouter (locator, node ID)."""

    netns: str
    node: Node
    underlay: str  # its end of the underlay veth
    ipam_dir: Path


@dataclass
class Pod:
    """An attached Pod: its netns and addresses."""

    netns: str
    v4: str
    v6: str
    vpc: str
    att: str
    name: str
    node: str  # the node it runs on


@pytest.fixture
def nodes(kube: Kube, cluster: Any, cni_bin: Path, tmp_path: Path) -> Iterator[list[SrNode]]:
    """Nodes A and B, locators 2001:db8:a::/48 and 2001:db8:b::/48, joined by fd00:5e7::/64."""
    port = api_port(cluster.server)
    with node_namespace(port) as ns_a, node_namespace(port) as ns_b:
        run_ip("link", "add", "vpa-ul-a", "netns", ns_a, "type", "veth", "peer", "name",
               "vpa-ul-b", "netns", ns_b)
        made = []
        for index, (ns, link) in enumerate(((ns_a, "vpa-ul-a"), (ns_b, "vpa-ul-b")), start=1):
            run_ip("-n", ns, "addr", "add", f"fd00:5e7::{index}/64", "dev", link, "nodad")
            run_ip("-n", ns, "link", "set", link, "up")
            other = "b" if index == 1 else "a"
            run_ip("-n", ns, "-6", "route", "add", f"2001:db8:{other}::/48",
                   "via", f"fd00:5e7::{3 - index}")
            locks = tmp_path / f"locks-{index}"
            locks.mkdir()
            plugin = Plugin(cni_bin, locks, prefix=in_node(ns))
            node = make_node(kube, cluster, plugin, locator=f"2001:db8:{'ab'[index - 1]}::/48",
                             node_id=index)
            made.append(SrNode(ns, node, link, tmp_path / f"ipam-{index}"))
        yield made


@contextlib.contextmanager
def attached(kube: Kube, at: SrNode, vpc: str, att: str, v6: str, v4: str) -> Iterator[Pod]:
    """A Pod on node ``at`` in (vpc, att), published; DEL afterwards."""
    pod = f"sr-{att}-{os.urandom(2).hex()}"
    uid = create_pod(kube, pod, at.node.name)
    args = at.node.cni_args(pod, uid)
    conf = base_conf(vpc, att, isolation="vrf", ipam=host_local(at.ipam_dir, v6, v4),
                     publish={"bgp": True, "endpointSlice": True})
    with temporary_netns("vpa-srpod") as netns:
        result = at.node.plugin.ok("ADD", conf, container_id=f"ctr-{pod}", netns=netns,
                                   CNI_ARGS=args)
        four, six = (ip["address"].split("/")[0] for ip in
                     sorted(result["ips"], key=lambda ip: ":" in ip["address"]))
        try:
            yield Pod(os.path.basename(netns), four, six, vpc, att, pod, at.node.name)
        finally:
            at.node.plugin.ok("DEL", conf, container_id=f"ctr-{pod}", netns=netns,
                              CNI_ARGS=args)


def write_routes(kube: Kube, into: SrNode, published: Pod) -> list[str]:
    """What galactic-router would do on ``into``: the other node's prefixes of the Pod's
    attachment (its BGPAdvertisement) encapsulated to its SID (its EndpointSlice), in the
    VPC's VRF table. Returns the routes as `ip` prints them."""
    adv = advertisement(kube, naming.advertisement_name(published.vpc, published.att,
                                                    published.node))
    eps = endpoint_slice(kube, slice_name(published.name, published.vpc, published.att, "IPv6"))
    assert adv is not None and eps is not None
    sid = eps["metadata"]["annotations"][SID_ANNOTATION]
    vrf = naming.vrf_name(published.vpc)
    table = run_ip("-n", into.netns, "-d", "link", "show", vrf).split("vrf table ")[1].split()[0]
    for prefix in adv["spec"]["prefixes"]:
        run_ip("-n", into.netns, "route", "add", prefix, "encap", "seg6", "mode", "encap",
               "segs", sid, "dev", into.underlay, "table", table)
    # The encapsulated packet is routed again from the VRF the Pod's packet came in on, so the
    # way to the other node's locator (the underlay) is in the VPC's table too.
    locator = ipaddress.ip_network(f"{sid}/48", strict=False)
    shown = run_ip("-n", into.netns, "-6", "route", "show", "table", "main", str(locator))
    peer = shown.split(" via ")[1].split()[0]
    run_ip("-n", into.netns, "-6", "route", "add", str(locator), "via", peer, "dev",
           into.underlay, "table", table)
    return [line for family in ("-4", "-6") for line in run_ip(
        "-n", into.netns, family, "route", "show", "table", table).splitlines() if "seg6" in line]


def pings(src: Pod, dst: str) -> bool:
    """One ping from the Pod's netns reaches ``dst`` and is answered."""
    return subprocess.run(["ip", "netns", "exec", src.netns, "ping", "-c", "1", "-W", "3", dst],
                          capture_output=True, timeout=PROCESS_TIMEOUT).returncode == 0


def tcp_echo(client: Pod, server: Pod, address: str) -> bool:
    """A TCP connection from ``client`` to ``server`` at ``address`` carries an echo."""
    family = "AF_INET6" if ":" in address else "AF_INET"
    serve = (f"import socket; s = socket.socket(socket.{family}); "
             # An earlier case's connection to this address may still be in TIME_WAIT.
             "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             f"s.bind(({address!r}, {TCP_PORT})); s.listen(1); s.settimeout(30); "
             "print('listening', flush=True); c, _ = s.accept(); c.sendall(c.recv(64))")
    talk = (f"import socket; c = socket.create_connection(({address!r}, {TCP_PORT}), "
            "timeout=10); c.sendall(b'vpc'); print(c.recv(64).decode())")
    with subprocess.Popen(["ip", "netns", "exec", server.netns, sys.executable, "-c", serve],
                          stdout=subprocess.PIPE, text=True) as listener:
        try:
            assert listener.stdout is not None
            assert listener.stdout.readline().strip() == "listening"
            answer = subprocess.run(["ip", "netns", "exec", client.netns, sys.executable, "-c",
                                     talk], capture_output=True, text=True,
                                    timeout=PROCESS_TIMEOUT)
            return answer.returncode == 0 and answer.stdout.strip() == "vpc"
        finally:
            listener.kill()


def test_two_pods_of_one_vpc_on_two_nodes_talk_over_srv6_and_other_vpcs_do_not(
        kube: Kube, nodes: list[SrNode], vpc: str) -> None:
    node_a, node_b = nodes
    other_vpc = random_vpc()  # its kernel state lives in node B's namespace, gone with it
    with attached(kube, node_a, vpc, "1", "fd00:d1:1::/64", "10.211.1.0/24") as pod_a, \
            attached(kube, node_b, vpc, "2", "fd00:d1:2::/64", "10.211.2.0/24") as pod_b, \
            bound(kube, other_vpc), \
            attached(kube, node_b, other_vpc, "3", "fd00:d1:3::/64", "10.211.3.0/24") as stranger:
        routes = {"A": write_routes(kube, node_a, pod_b), "B": write_routes(kube, node_b, pod_a)}
        print(f"\nroutes written (galactic-router's part): {routes}")
        table = []
        for src, dst, name in ((pod_a, pod_b, "A->B"), (pod_b, pod_a, "B->A")):
            for family, address in (("v4", dst.v4), ("v6", dst.v6)):
                table.append((name, family, pings(src, address), tcp_echo(src, dst, address)))
        for src, dst, name in ((pod_a, stranger, "A->other VPC on B"),
                               (stranger, pod_a, "other VPC on B->A"),
                               (stranger, pod_b, "other VPC on B->B")):
            for family, address in (("v4", dst.v4), ("v6", dst.v6)):
                table.append((name, family, pings(src, address), tcp_echo(src, dst, address)))
        print("\n| path | family | ping | TCP |\n|---|---|---|---|")
        for name, family, ping_ok, tcp_ok in table:
            print(f"| {name} | {family} | {'ok' if ping_ok else 'no'} | "
                  f"{'ok' if tcp_ok else 'no'} |")
        assert all(p and t for name, _, p, t in table if "other" not in name), table
        assert not any(p or t for name, _, p, t in table if "other" in name), table
