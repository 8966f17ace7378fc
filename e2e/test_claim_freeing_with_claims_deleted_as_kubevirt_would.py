"""A claim's addresses are freed when the claim is deleted, and only then (SPEC §16): by the
node agent's watch of IPAMClaims at once, by an agent that restarts for claims deleted while
it was down, and by GC on a node without an agent; GC and a restart never free the addresses
of a claim that exists. The real `vpc-attach` executable and agent, the real control plane and
CRD; claims deleted as kubevirt's ipam-extensions lets them go (finalizer dropped, deleted).
The records are read with the harness's reader. Each test picks its path itself (its own agent,
or none), so it runs once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import AgentProcess
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.scene import Scene, vm_scene
from e2e.harness.kubevirt.standins import kubevirt_deletes_claim
from e2e.harness.plugin import NO_AGENT_SOCKET, Plugin
from e2e.harness.report import report
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster]
FREED_WITHIN_S = 15.0


@pytest.fixture
def scene(kube: Kube, cluster: Any, plugin: Plugin, vpc: str,
          tmp_path: Path) -> Iterator[Scene]:
    with vm_scene(kube, cluster, plugin, vpc, tmp_path) as made:
        yield made


def node_agent(scene: Scene, cluster: Any, directory: Path) -> AgentProcess:
    """An agent of the scene's node (its kubeconfig, name and ipamDataRoot), which the
    plugin then reaches."""
    directory.mkdir(exist_ok=True)
    agent = AgentProcess(directory, env={
        "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
        "VPC_ATTACH_NODE_NAME": scene.node.name,
        "VPC_ATTACH_IPAM_DATA_ROOT": scene.plugin.environ["VPC_ATTACH_IPAM_DATA_ROOT"]})
    scene.plugin.agent_socket = str(agent.socket)
    return agent


def claimed(scene: Scene) -> dict[str, str]:
    """address -> `namespace/name@uid` of every record a claim owns."""
    return scene.files().claims()


def pool_hints(scene: Scene) -> dict[str, list[str]]:
    """claim uid -> the pool directories' hashes the node notes it holds records in
    (`<ipamDataRoot>/.claims/<claim uid>/<hash>`, cni_plugin/ipam/plugin/README.md)."""
    root = Path(scene.plugin.environ["VPC_ATTACH_IPAM_DATA_ROOT"]) / ".claims"
    return {claim.name: sorted(p.name for p in claim.iterdir())  # not `.formatVersion`
            for claim in sorted(root.iterdir()) if claim.is_dir()} if root.exists() else {}


def test_gc_frees_a_deleted_claims_addresses_on_a_node_without_an_agent(scene: Scene) -> None:
    scene.plugin.agent_socket = NO_AGENT_SOCKET
    claim = scene.claim()
    scene.attached_and_detached(scene.pod(claim), "ctr-a")
    gc = {**scene.conf, "cni.dev/valid-attachments": []}
    scene.plugin.ok("GC", gc)
    assert len(claimed(scene)) == 2, "the claim exists: GC keeps its addresses"
    [(uid, pools)] = pool_hints(scene).items()  # where the node notes the claim's pools
    assert pools, "the claim's pools are noted on the node"
    assert kubevirt_deletes_claim(scene.kube, scene.namespace, claim) == uid
    scene.plugin.ok("GC", gc)
    assert scene.files().records == {}
    assert pool_hints(scene) == {}, "the deleted claim's note of its pools is gone too"


def test_the_agent_frees_a_deleted_claims_addresses_when_its_watch_sees_it_go(
        scene: Scene, cluster: Any, pytestconfig: pytest.Config) -> None:
    with node_agent(scene, cluster, scene.data_dir.parent / "agent"):
        claim = scene.claim()
        scene.attached_and_detached(scene.pod(claim), "ctr-a")
        assert len(claimed(scene)) == 2
        started = time.monotonic()
        kubevirt_deletes_claim(scene.kube, scene.namespace, claim)
        wait_until("the agent to free the deleted claim's addresses",
                   lambda: scene.files().records == {}, FREED_WITHIN_S, interval=0.05)
        seconds = time.monotonic() - started
    report(pytestconfig, "Deleted IPAMClaim to its addresses freed by the agent",
           scene.data_dir.parent / "freed.json", {"seconds": round(seconds, 3)})


def test_an_agent_restart_frees_claims_deleted_while_it_was_down_and_keeps_existing_ones(
        scene: Scene, cluster: Any) -> None:
    agent_dir = scene.data_dir.parent / "agent"
    with node_agent(scene, cluster, agent_dir):
        gone, kept = scene.claim(vm="vm-gone"), scene.claim(vm="vm-kept")
        scene.attached_and_detached(scene.pod(gone), "ctr-gone")
        scene.attached_and_detached(scene.pod(kept), "ctr-kept")
    before = claimed(scene)
    assert len(before) == 4
    gone_uid = kubevirt_deletes_claim(scene.kube, scene.namespace, gone)
    with node_agent(scene, cluster, agent_dir):
        wait_until("the restarted agent to free the claim deleted meanwhile",
                   lambda: not any(v.endswith(gone_uid) for v in claimed(scene).values()),
                   FREED_WITHIN_S, interval=0.05)
        assert claimed(scene) == {address: owner for address, owner in before.items()
                                  if not owner.endswith(gone_uid)}
        assert all(f"/{kept}@" in owner for owner in claimed(scene).values())
