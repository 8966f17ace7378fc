"""Policy across two nodes through galactic's datapath (SPEC §15, §17), in the full-kernel VM:
each node runs galactic-cni, galactic-router and vpc-attach with its agent. Between the nodes
no packet passes a netfilter hook of either node (galactic's `usid_egress` redirects on the
host link's TC ingress; `usid_ingress` hands a VPC of veth Pods straight into the Pod's netns,
`bpf_redirect_peer`, past the host end of its veth): a veth Pod is guarded in its own netns,
which every packet of it passes whichever path brought it (docs/architecture.md, "Policy
inside a VPC"); a label change of a Pod on the other node is followed. A VM is guarded on
its tap's TC hooks: its packets to other nodes pass the policy's filters before `usid_egress`
(attached after them on a tap) redirects them, and packets for it leave the tap's TC egress
after `usid_ingress` redirected them there (a VPC with a tap on the node gets galactic's plain
redirect, which reaches its veth Pods too). The scenes and their matrices are
e2e/harness/policymatrix.py's, shared with the path without galactic
(e2e/test_policy_kernel_srv6.py); each denied row is shown dropped by the hook named for it.
Run once, in the in-process pass's VM boot: each node's own agent keeps its policies.

Multus and KubeVirt do not run here: the scene writes the NADs and the Pods' networks
annotation as a user would and calls the plugin as Multus would; a VM is a guest netns on the
tap (e2e/harness/tapguest.py), as qemu's tap backend relays a virtio NIC.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.datapath import Datapath, galactic_datapath
from e2e.harness.kube import Kube
from e2e.harness.policymatrix import (
    Workload,
    veth_pods_and_a_remote_label_change,
    vms_and_pods_both_ways,
)
from e2e.harness.policyscene import PolicyNode, policy_node

# Once, through the warm agents, in the in-process pass's VM (after test_galactic_datapath:
# its routers did not reach Established in 210 s when these ran before it in the same boot).
pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel,
              pytest.mark.both_paths, pytest.mark.once_through_agent]
SETTLE_S = 300.0  # galactic-router's routes to the other node come first (BGP, one vCPU)
WHAT = "galactic's eBPF datapath, vrf"


@pytest.fixture(scope="module")
def datapath(kube: Kube, cluster: Any, galactic: GalacticBuild,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Datapath]:
    """Two nodes with galactic-cni (told its underlay) and galactic-router, sessions up."""
    with galactic_datapath(kube, cluster, galactic, tmp_path_factory.mktemp("policy-dp"),
                           underlay_by_env=True) as running:
        yield running


@pytest.fixture(scope="module")
def nodes(datapath: Datapath, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[PolicyNode]]:
    """vpc-attach and its agent on each galactic node."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(policy_node(
            cluster, cni_bin, tmp_path_factory.mktemp(f"policy-{node.name}"), own_agents,
            via_agent=True, netns=node.netns, prefix=node.prefix, name=node.name))
            for node in datapath.nodes]


def through_galactic(vpc: str, workloads: dict[str, Workload]) -> None:
    """Nothing to add: galactic-router learns the other node's prefixes from the BGP objects
    each node's vpc-attach publishes (the matrix waits for its routes)."""


def test_veth_pods_of_a_vpc_without_taps_across_two_galactic_nodes_and_a_remote_label_change(
        kube: Kube, nodes: list[PolicyNode], tmp_path: Path) -> None:
    """No tap in the VPC: usid_ingress redirects straight into the Pod's netns (past the host
    end of its veth), where its rules are. Then a Pod on node 1 gets the label the policy on
    node 2 admits: node 2's agent follows it (the Pod from the API, its addresses from the
    EndpointSlice node 1 published)."""
    veth_pods_and_a_remote_label_change(kube, nodes, tmp_path, WHAT, "10.72.0.0/24",
                                        through_galactic, SETTLE_S)


def test_vms_on_taps_and_veth_pods_across_two_galactic_nodes_both_ways(
        kube: Kube, nodes: list[PolicyNode], tmp_path: Path) -> None:
    """Servers on node 2 (a veth Pod b, a VM u) admit clients on ALLOWED only and send only to
    clients (a veth Pod a and a VM t on node 1), never to c (node 1, no policy). u's packets
    to node 1 pass its filters before usid_egress (0xC000) redirects them; packets for u
    leave the tap's TC egress after usid_ingress redirected them there. Then c is labelled
    a client: node 2's agent opens b and u to it, both ways."""
    vms_and_pods_both_ways(kube, nodes, tmp_path, WHAT, ("10.71.0.0/24", "10.71.1.0/24"),
                           through_galactic, SETTLE_S)
