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
redirect, which reaches its veth Pods too). Run once, in the in-process pass's VM boot: each
node's own agent keeps its policies.

Multus and KubeVirt do not run here: the scene writes the NADs and the Pods' networks
annotation as a user would and calls the plugin as Multus would; a VM is a guest netns on the
tap (e2e/harness/tapguest.py), as qemu's tap backend relays a virtio NIC.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.datapath import Datapath, galactic_datapath
from e2e.harness.kube import Kube
from e2e.harness.plugin import random_vpc
from e2e.harness.policymatrix import ALLOWED, DENIED, settle, workload
from e2e.harness.policyscene import (
    PolicyNode,
    Scene,
    manifest_nad,
    manifest_namespace,
    manifest_policy,
    policy_node,
)
from e2e.harness.tenancy import bound

# Once, through the warm agents, in the in-process pass's VM (after test_galactic_datapath:
# its routers did not reach Established in 210 s when these ran before it in the same boot).
pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel,
              pytest.mark.both_paths, pytest.mark.once_through_agent]
SETTLE_S = 300.0  # galactic-router's routes to the other node come first (BGP, one vCPU)


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


def test_veth_pods_of_a_vpc_without_taps_across_two_galactic_nodes_and_a_remote_label_change(
        kube: Kube, nodes: list[PolicyNode], tmp_path: Path) -> None:
    """No tap in the VPC: usid_ingress redirects straight into the Pod's netns (past the host
    end of its veth), where its rules are. Then a Pod on node 1 gets the label the policy on
    node 2 admits: node 2's agent follows it (the Pod from the API, its addresses from the
    EndpointSlice node 1 published)."""
    node1, node2 = nodes
    namespace, vpc = f"policy-galactic-veth-{os.urandom(2).hex()}", random_vpc()
    with bound(kube, vpc), contextlib.ExitStack() as stack:
        scene = Scene(kube, node1, vpc, tmp_path, isolation="vrf", bgp=True)
        stack.callback(scene.close)
        scene.namespace(manifest_namespace(namespace))
        scene.nad(manifest_nad("pg-veth-only", "10.72.0.0/24"))
        scene.policy(manifest_policy("server", namespace, "default/pg-veth-only", {
            "podSelector": {"matchLabels": {"role": "server"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                         "ports": [{"port": ALLOWED}]}]}))
        workloads = {name: stack.enter_context(workload(scene, namespace, name, "veth",
                                                        {"role": role}, "pg-veth-only", node))
                     for name, role, node in (("a", "client", node1), ("o", "other", node1),
                                              ("b", "server", node2))}
        settle(workloads, [("a", "b", ALLOWED, True), ("a", "b", DENIED, False),
                           ("o", "b", ALLOWED, False), ("b", "a", ALLOWED, True)],
               "a VPC of veth Pods across two galactic nodes", SETTLE_S)
        # o (node 1) becomes a client: node 2's agent admits it from the label change alone.
        kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/o",
                     {"metadata": {"labels": {"role": "client"}}},
                     content_type="application/merge-patch+json")
        settle(workloads, [("o", "b", ALLOWED, True), ("o", "b", DENIED, False),
                           ("a", "b", ALLOWED, True)],
               "o on node 1 labelled a client", SETTLE_S)


def test_vms_on_taps_and_veth_pods_across_two_galactic_nodes_both_ways(
        kube: Kube, nodes: list[PolicyNode], tmp_path: Path) -> None:
    """Servers on node 2 (a veth Pod b, a VM u) admit clients on ALLOWED only and send only to
    clients (a veth Pod a and a VM t on node 1), never to c (node 1, no policy). u's packets
    to node 1 pass its filters before usid_egress (0xC000) redirects them; packets for u
    leave the tap's TC egress after usid_ingress redirected them there."""
    node1, node2 = nodes
    namespace, vpc = f"policy-galactic-{os.urandom(2).hex()}", random_vpc()
    with bound(kube, vpc), contextlib.ExitStack() as stack:
        scene = Scene(kube, node1, vpc, tmp_path, isolation="vrf", bgp=True)
        stack.callback(scene.close)
        scene.namespace(manifest_namespace(namespace))
        scene.nad(manifest_nad("pg-veth", "10.71.0.0/24"))
        scene.nad(manifest_nad("pg-tap", "10.71.1.0/24"), attachment="tap")
        scene.policy(manifest_policy("servers", namespace, "default/pg-veth,default/pg-tap", {
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
                scene, namespace, name, kind, {"role": role}, f"pg-{kind}", node))
        settle(workloads, [
            ("a", "b", ALLOWED, True), ("a", "b", DENIED, False),
            ("a", "u", ALLOWED, True), ("a", "u", DENIED, False),
            ("t", "b", ALLOWED, True), ("t", "b", DENIED, False),
            ("t", "u", ALLOWED, True), ("t", "u", DENIED, False),
            ("b", "a", ALLOWED, True), ("b", "t", ALLOWED, True),
            ("u", "a", ALLOWED, True), ("u", "t", ALLOWED, True),
            ("b", "c", ALLOWED, False), ("u", "c", ALLOWED, False),
            ("c", "b", ALLOWED, False), ("c", "u", ALLOWED, False)],
            "VMs and veth Pods across two galactic nodes", SETTLE_S)
