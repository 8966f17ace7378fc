"""Nodes without galactic's datapath, joined by kernel SRv6 (SPEC §15: where galactic's pins
do not exist, the node answers its SIDs with kernel End.DT46).

Each node is a `datapath_node` (its namespace with the API server forwarded into it, a bpffs of
its own holding no pins, its BGPRouter with an SRv6 locator and node ID), the two joined by one
IPv6 underlay veth (`link_underlay`), IPv6 forwarding on as a node's operator sets it. No
galactic-cni, no galactic-router: vpc-attach finds no pins and answers each VPC's SID with
`seg6local End.DT46` into the VPC's VRF. Nothing in such a cluster writes the sending side:
galactic-router writes only into galactic's eBPF map, never `encap seg6` routes into the kernel
(CVE-2026-31668), so `route_toward` stands in for whatever SRv6 source would: a hand-made
`encap seg6` route in the VPC's VRF table per remote address, toward the SID the other node
answers for the VPC.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

from cni_plugin.core import naming
from e2e.harness.cluster import Cluster
from e2e.harness.galactic.datapath import DatapathNode, datapath_node, link_underlay
from e2e.harness.kernel import run_ip
from e2e.harness.kube import Kube
from e2e.harness.packets import in_netns


@contextlib.contextmanager
def kernel_nodes(kube: Kube, cluster: Cluster, work: Path,
                 indices: tuple[int, int] = (1, 2)) -> Iterator[list[DatapathNode]]:
    """Two nodes (their own BGPRouters, locators and underlay; IPv6 forwarding on), no
    galactic-cni, no galactic-router: vpc-attach finds no pins. Removed afterwards."""
    first, second = indices
    with datapath_node(kube, cluster, work, first) as one, \
            datapath_node(kube, cluster, work, second) as other:
        link_underlay(one, other)
        for node in (one, other):  # the outer packets are forwarded (galactic's nodes: too)
            subprocess.run(in_netns(node.netns, "sysctl", "-qw",
                                    "net.ipv6.conf.all.forwarding=1"), check=True, timeout=30)
        yield [one, other]


def vrf_table(node: DatapathNode, vpc: str) -> int:
    """The Linux table of the VPC's VRF on the node."""
    shown = json.loads(run_ip("-n", node.netns, "-d", "-j", "link", "show",
                              naming.vrf_name(vpc)))
    return int(shown[0]["linkinfo"]["info_data"]["table"])


def end_dt46_sid(node: DatapathNode, table: int) -> str:
    """The SID the node answers with End.DT46 into `table` (the route vpc-attach made)."""
    for line in run_ip("-n", node.netns, "-6", "route", "show").splitlines():
        if f"action End.DT46 vrftable {table} " in line + " ":
            return line.split()[0].split("/")[0]
    raise RuntimeError(f"no End.DT46 route into table {table} on {node.name}: "
                       f"{run_ip('-n', node.netns, '-6', 'route', 'show')}")


def route_toward(node: DatapathNode, other: DatapathNode, vpc: str,
                 addresses: Iterable[str]) -> None:
    """On `node`, the VPC's traffic to `addresses` (on `other`) encapsulated toward the SID
    `other` answers for the VPC (encap.red: one segment, no SRH, 40 bytes), and `other`'s
    locator reachable from the VPC's table (the outer packet is looked up in the VRF it
    left). Both VRFs must exist (a workload of the VPC on each node)."""
    table = str(vrf_table(node, vpc))
    sid = end_dt46_sid(other, vrf_table(other, vpc))
    run_ip("-n", node.netns, "-6", "route", "replace", other.locator, "via",
           other.underlay_address, "dev", node.underlay_link, "table", table)
    for address in addresses:
        run_ip("-n", node.netns, "route", "replace", f"{address}/32", "encap", "seg6", "mode",
               "encap.red", "segs", sid, "dev", node.underlay_link, "table", table)
