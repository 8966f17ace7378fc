"""Policy on a VM's tap (SPEC §17) on one node, without galactic, with real packets: a VM's
packets enter the node on its tap's TC ingress and leave to it on the tap's TC egress, where
vpc-attach writes stateful filters (cls_flower + act_ct in the VPC's conntrack zone:
cni_plugin/policy/tc.py). This machine's kernel has no cls_flower, act_ct or act_gact (there
the tap is reported, never silent: e2e/test_policy_enforcement.py), so this runs in the
full-kernel VM (`fullkernel`; it needs no VRF itself), once, through the node's own agent:
what it proves is the tap's filters, which ADD and the agent write alike.

Two VPCs with the same subnets on taps: each VPC's taps track connections in a conntrack zone
of its own (the VPC's table id) and their filters name only their own VPC's peers, so a policy in
one VPC admits or shuts nothing in the other, whose VMs hold the same addresses.

KubeVirt and Multus do not run here: a VM is a guest netns on the tap with a relay copying
frames as qemu's tap backend does (e2e/harness/tapguest.py); the scene writes the NADs and
the Pods' networks annotation as a user would and calls the plugin as Multus would.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import OwnAgents
from e2e.harness.kube import Kube
from e2e.harness.plugin import random_vpc
from e2e.harness.policymatrix import ALLOWED, DENIED, Workload, settle, workload
from e2e.harness.policyscene import (
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
SETTLE_S = 120.0  # the agent's pass after a change, at the emulated VM's pace


def test_a_vm_on_a_tap_is_filtered_both_ways_on_one_node_and_follows_a_label_change(
        kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
        tmp_path: Path) -> None:
    """Servers (a VM, and a veth Pod as the control) admit clients on ALLOWED only and send
    only to clients; every pair of kinds both ways, a second VM as a client (tap to tap on
    one node), a Pod no policy names; then that Pod becomes a client."""
    from cni_plugin.policy.enforce import TAPS_FILTERED
    assert TAPS_FILTERED, "this release leaves taps unfiltered: nothing here to prove"
    namespace, vpc = f"policy-taps-{os.urandom(2).hex()}", random_vpc()
    with policy_node(cluster, cni_bin, tmp_path / "node", own_agents, via_agent=True) as node, \
            bound(kube, vpc), contextlib.ExitStack() as stack:
        scene = Scene(kube, node, vpc, tmp_path / "scene")
        stack.callback(scene.close)
        scene.namespace(manifest_namespace(namespace))
        scene.nad(manifest_nad("pt-veth", "10.73.0.0/24"))
        scene.nad(manifest_nad("pt-tap", "10.73.1.0/24"), attachment="tap")
        scene.policy(manifest_policy("servers", namespace, "default/pt-veth,default/pt-tap", {
            "podSelector": {"matchLabels": {"role": "server"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                         "ports": [{"port": ALLOWED}]}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}))
        workloads: dict[str, Workload] = {}
        for name, kind, role in (("a", "veth", "client"), ("v", "tap", "client"),
                                 ("c", "veth", "other"), ("t", "tap", "server"),
                                 ("b", "veth", "server")):
            workloads[name] = stack.enter_context(workload(
                scene, namespace, name, kind, {"role": role}, f"pt-{kind}"))
        stack.callback(lambda: print(evidence(kube, namespace, node.agent.log
                                              if node.agent else None)))
        settle(workloads, [
            ("a", "t", ALLOWED, True), ("a", "t", DENIED, False),  # veth -> tap: ingress
            ("v", "t", ALLOWED, True), ("v", "t", DENIED, False),  # tap -> tap
            ("c", "t", ALLOWED, False),  # not a client
            ("t", "a", ALLOWED, True), ("t", "v", ALLOWED, True),  # tap egress to clients
            ("t", "c", ALLOWED, False), ("t", "b", ALLOWED, False),  # ... and nowhere else
            ("a", "b", ALLOWED, True), ("a", "b", DENIED, False),  # the veth control
            ("b", "c", ALLOWED, False),
            ("c", "a", ALLOWED, True), ("a", "v", DENIED, True),  # nothing selects a or v
        ], "one node, servers t (tap) and b (veth)", SETTLE_S)
        kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/c",
                     {"metadata": {"labels": {"role": "client"}}},
                     content_type="application/merge-patch+json")
        settle(workloads, [("c", "t", ALLOWED, True), ("t", "c", ALLOWED, True),
                           ("c", "t", DENIED, False)], "c labelled a client", SETTLE_S)


def test_taps_of_two_vpcs_with_the_same_subnets_never_share_a_rule(
        kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
        tmp_path: Path) -> None:
    """VMs in two VPCs hold the same addresses (server s, clients a and b). In VPC one the
    server admits, on ALLOWED only, b's address (ipBlock) and Pods labelled friend in any
    namespace, and sends only there; in VPC two, where only a is a friend, no policy selects
    anything. A rule that crossed VPCs would let VPC one's a in (its twin is a friend) or
    shut VPC two's server (its clients have the addresses VPC one names)."""
    one, two = f"policy-twin1-{os.urandom(2).hex()}", f"policy-twin2-{os.urandom(2).hex()}"
    vpc_one, vpc_two = random_vpc(), random_vpc()
    with policy_node(cluster, cni_bin, tmp_path / "node", own_agents, via_agent=True) as node, \
            bound(kube, vpc_one), bound(kube, vpc_two), contextlib.ExitStack() as stack:
        scenes = {one: Scene(kube, node, vpc_one, tmp_path / "one"),
                  two: Scene(kube, node, vpc_two, tmp_path / "two")}
        scenes[one].nad(manifest_nad("pt-twins", ""), attachment="tap")  # static: `ips`
        scenes[two]._nads = scenes[one]._nads  # the same NAD; each Pod says its VPC
        workloads: dict[str, Workload] = {}
        for number, (namespace, scene) in enumerate(scenes.items(), 1):
            stack.callback(scene.close)
            scene.namespace(manifest_namespace(namespace))
            for name, role, address in (("a", "friend" if number == 2 else "client", "2"),
                                        ("b", "client", "3"), ("s", "server", "1")):
                element = [{"name": "pt-twins", "namespace": "default",
                            "ips": [f"10.74.0.{address}/24"]}]
                workloads[f"{name}{number}"] = stack.enter_context(workload(
                    scene, namespace, name, "tap", {"role": role}, "pt-twins",
                    networks=json.dumps(element)))
        twins = [(workloads[f"{n}1"].address, workloads[f"{n}2"].address) for n in "abs"]
        assert all(first == second for first, second in twins), twins  # the same addresses
        stack.callback(lambda: print(evidence(kube, one, node.agent.log
                                              if node.agent else None)))
        b_address = workloads["b1"].address
        peers = [{"ipBlock": {"cidr": f"{b_address}/32"}},
                 {"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "friend"}}}]
        scenes[one].policy(manifest_policy("only-b-and-friends", one, "default/pt-twins", {
            "podSelector": {"matchLabels": {"role": "server"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": peers, "ports": [{"port": ALLOWED}]}],
            "egress": [{"to": peers}]}))
        settle(workloads, [
            ("b1", "s1", ALLOWED, True), ("b1", "s1", DENIED, False),  # ipBlock, its port only
            ("a1", "s1", ALLOWED, False),  # its twin in VPC two is the friend, not it
            ("s1", "b1", DENIED, True), ("s1", "a1", ALLOWED, False),  # egress likewise
            ("a2", "s2", ALLOWED, True), ("a2", "s2", DENIED, True),  # VPC two: nothing shut
            ("b2", "s2", DENIED, True), ("s2", "a2", DENIED, True), ("s2", "b2", ALLOWED, True),
        ], "two VPCs, the same addresses, a policy in VPC one", SETTLE_S)


def evidence(kube: Kube, namespace: str, log: Path | None) -> str:
    """The Events of the namespace's policies and the agent's last lines: what it said it did."""
    events = [f"{e.get('reason')} {(e.get('regarding') or {}).get('name')}: {e.get('note')}"
              for e in kube.list(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")]
    lines = log.read_text().splitlines()[-40:] if log is not None and log.exists() else []
    return "\n".join(["Events:", *events, "agent log:", *lines])
