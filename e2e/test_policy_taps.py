"""Policy on a VM's tap (SPEC §17) on one node, without galactic, with real packets: a VM's
packets enter the node on its tap's TC ingress and leave to it on the tap's TC egress, where
vpc-attach writes stateful filters (cls_flower + act_ct in the VPC's conntrack zone:
cni_plugin/policy/tc.py). This machine's kernel has no cls_flower, act_ct or act_gact (there
the tap is reported, never silent: e2e/test_policy_enforcement.py), so this runs in the
full-kernel VM (`fullkernel`; it needs no VRF itself), once, through the node's own agent:
what it proves is the tap's filters, which ADD and the agent write alike.

KubeVirt and Multus do not run here: a VM is a guest netns on the tap with a relay copying
frames as qemu's tap backend does (e2e/harness/tapguest.py); the scene writes the NADs and
the Pods' networks annotation as a user would and calls the plugin as Multus would.
"""

from __future__ import annotations

import contextlib
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


def evidence(kube: Kube, namespace: str, log: Path | None) -> str:
    """The Events of the namespace's policies and the agent's last lines: what it said it did."""
    events = [f"{e.get('reason')} {(e.get('regarding') or {}).get('name')}: {e.get('note')}"
              for e in kube.list(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")]
    lines = log.read_text().splitlines()[-40:] if log is not None and log.exists() else []
    return "\n".join(["Events:", *events, "agent log:", *lines])
