"""Policy across two nodes WITHOUT galactic (SPEC §17: "on two nodes with galactic's datapath
(§15) and without it"), in the full-kernel VM: two nodes without galactic's pins, where
vpc-attach answers each VPC's SID with kernel `seg6local End.DT46` into the VPC's VRF
(e2e/harness/srv6_nodes.py). Nothing in such a cluster writes the sending side into the kernel
(galactic-router writes only galactic's eBPF map): a hand-made `encap seg6` route per remote
address in the VPC's VRF table stands in for any SRv6 source, as in
e2e/test_kernel_decap_with_a_hand_made_sender.py and the bench's kernel path.

On this path every packet between the nodes passes the host's forwarding: End.DT46 hands the
inner packet to the VPC's VRF, which routes it out of the workload's host link (into a veth
Pod's netns, or out of a VM's tap through its TC egress); a workload's packets enter the node
on the host link (a VM's through its tap's TC ingress) and are encapsulated by the VRF's route.
So a veth Pod is guarded in its own netns and a VM on its tap's TC hooks, as on one node: the
same reachability matrix as through galactic's datapath (e2e/harness/policymatrix.py, shared
with e2e/test_policy_galactic.py), plus, for each denied row, the counter of the hook that
refused it. `table` isolation carries nothing between nodes (no SID answered, and host
protection lets a table-mode VPC's packets leave only through vpc-attach links): shown here
too, so there is no path of that mode to enforce.

Run once, through each node's own warm agent, in the in-process pass's VM boot (what it proves
is where the rules are, which ADD and the agent write alike). Multus and KubeVirt do not run
here: the scene writes the NADs and the Pods' networks annotation as a user would and calls
the plugin as Multus would; a VM is a guest netns on the tap (e2e/harness/tapguest.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import srv6_nodes
from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.datapath import DatapathNode
from e2e.harness.kernel import run_ip, vpc_table
from e2e.harness.kube import Kube
from e2e.harness.pace import Bound, pace
from e2e.harness.packets import nft_counters
from e2e.harness.plugin import random_vpc
from e2e.harness.policymatrix import (
    ALLOWED,
    Join,
    Workload,
    connects,
    vms_and_pods_both_ways,
    workload,
)
from e2e.harness.policyscene import (
    PolicyNode,
    Scene,
    manifest_nad,
    manifest_namespace,
    policy_node,
)
from e2e.harness.tenancy import bound

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel,
              pytest.mark.both_paths, pytest.mark.once_through_agent]
WHAT = "kernel SRv6, End.DT46, vrf"


def settle_bound() -> Bound:
    """Until a matrix holds: the agents' passes once the Pods and their EndpointSlices appear
    and the matrix's own rounds (a second per denied row), at the emulated VM's pace."""
    return pace().starts(30)


@pytest.fixture(scope="module")
def kernel(kube: Kube, cluster: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DatapathNode]]:
    """Two nodes on one IPv6 underlay, their routers with SRv6 locators, no galactic pins."""
    with srv6_nodes.kernel_nodes(kube, cluster, tmp_path_factory.mktemp("policy-srv6")) as made:
        yield made


@pytest.fixture(scope="module")
def nodes(kernel: list[DatapathNode], cluster: Any, cni_bin: Path, own_agents: OwnAgents,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[PolicyNode]]:
    """vpc-attach and its agent on each node."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(policy_node(
            cluster, cni_bin, tmp_path_factory.mktemp(f"policy-{node.name}"), own_agents,
            via_agent=True, netns=node.netns, prefix=node.prefix, name=node.name))
            for node in kernel]


def joined_by_srv6(kernel: list[DatapathNode]) -> Join:
    """The stand-in SRv6 source: each node's VRF of the VPC sends the other node's workloads'
    addresses to the SID the other node answers for the VPC."""
    def join(vpc: str, workloads: dict[str, Workload]) -> None:
        for node in kernel:
            for other in kernel:
                if other is not node:
                    srv6_nodes.route_toward(node, other, vpc, [
                        w.address for w in workloads.values() if w.node == other.name])
    return join


def test_vms_on_taps_and_veth_pods_across_two_kernel_srv6_nodes_both_ways_and_a_label_change(
        kube: Kube, kernel: list[DatapathNode], nodes: list[PolicyNode],
        tmp_path: Path) -> None:
    """End.DT46 hands a packet to the VRF, which routes it into a veth Pod's netns, where its
    rules are, or out of a VM's tap through its TC egress; a VM's packets pass its tap's TC
    ingress before the VRF encapsulates them. Then node 2's agent follows a label change of a
    Pod on node 1 on both kinds. (A VPC of veth Pods alone takes the same path here, unlike
    galactic's, which hands it to the Pod's netns directly: no test of its own.)"""
    vms_and_pods_both_ways(kube, nodes, tmp_path, WHAT, ("10.74.0.0/24", "10.74.1.0/24"),
                           joined_by_srv6(kernel), settle_bound())


def test_a_table_mode_vpc_has_no_path_between_nodes_to_enforce(
        kube: Kube, kernel: list[DatapathNode], nodes: list[PolicyNode],
        tmp_path: Path) -> None:
    """`table` isolation answers no SID and is not registered in any datapath; and its host
    links' packets may leave only through vpc-attach links (SPEC §14's host protection, the
    `escape_dropped` counter). A hand-made encap route toward the other node's Pod in the
    VPC's table is dropped there, no policy involved (the vrf tests above are the positive
    control: the same route in a VRF carries)."""
    node1, node2 = nodes
    namespace, vpc = f"policy-x-table-{os.urandom(2).hex()}", random_vpc()
    nad = f"px-table-{os.urandom(2).hex()}"
    with bound(kube, vpc), contextlib.ExitStack() as stack:
        scene = Scene(kube, node1, vpc, tmp_path, isolation="table")
        stack.callback(scene.close)
        scene.namespace(manifest_namespace(namespace))
        scene.nad(manifest_nad(nad, "10.75.0.0/24"))
        a = stack.enter_context(workload(scene, namespace, "a", "veth", {}, nad, node1))
        b = stack.enter_context(workload(scene, namespace, "b", "veth", {}, nad, node2))
        first, second = kernel
        table = vpc_table(vpc, first.netns)
        assert table is not None, f"no table recorded for {vpc} on {first.name}"
        assert "End.DT46" not in run_ip("-n", second.netns, "-6", "route", "show"), \
            "a table-mode VPC answers no SID"
        sid = second.locator.replace("::/48", "::1")  # nothing answers it: dropped before
        run_ip("-n", first.netns, "-6", "route", "replace", second.locator, "via",
               second.underlay_address, "dev", first.underlay_link, "table", table)
        run_ip("-n", first.netns, "route", "replace", f"{b.address}/32", "encap", "seg6",
               "mode", "encap.red", "segs", sid, "dev", first.underlay_link, "table", table)
        before = nft_counters(first.netns).get("escape_dropped", 0)
        assert not connects(a, b, ALLOWED), "a table-mode VPC's packet left its node"
        assert nft_counters(first.netns).get("escape_dropped", 0) > before, \
            "dropped elsewhere than by host protection's escape rule"
