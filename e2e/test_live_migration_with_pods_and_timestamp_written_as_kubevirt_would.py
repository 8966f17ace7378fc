"""A VM's live migration between two nodes running galactic-router (SPEC §16, issue 32 item 4).
KubeVirt does not run here: the test makes the IPAMClaim as ipam-extensions does, the source
and target virt-launcher Pods as virt-controller and kubevirt's webhook leave them, and adds
the ready timestamp to the target Pod as virt-controller does once the target's domain runs
(`e2e.harness.kubevirt`). Both Pods name the claim, so both get its addresses (each node its
own `scope: node` pool of vpc-attach-ipam: the claim's addresses are requested exactly) on the
VM's tap.

A gobgpd collector peered with both nodes' routers holds the VM's prefixes once from node 1
until the timestamp, then once from node 2 (the cut-over time printed, not asserted); a
migration whose target goes before the timestamp leaves the source's routes and nothing of
the target; a third Pod of the claim is refused; a target marked before its ADD is announced
by it; a target marked while its node's agent was down is cut over by the next agent. Through
the agent, the target node's agent cuts over on its Pod watch; in-process, a STATUS of the
network on the target node does (the test runs it right after the timestamp, standing in for
a runtime's poll; containerd's own poll cutting over on a real node: e2e/test_node_kubevirt.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import AgentProcess, OwnAgents
from e2e.harness.doctor import doctor_on
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.sites import ROUTE_TIMEOUT_S
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.migration import Migration, migration, pending_records, vm_pod
from e2e.harness.kubevirt.standins import IFNAME, kubevirt_marks_target_ready
from e2e.harness.plugin import NO_AGENT_SOCKET, VIA_AGENT, with_prev
from e2e.harness.wait import wait_until

# Every test but the agent restart's runs in both passes: that one brings agents of its own,
# and in the agent pass the node agents would have served node 2's earlier ADDs already.
pytestmark = [pytest.mark.root, pytest.mark.cluster]
PATH = "agent" if VIA_AGENT else "in-process"
CUT_OVER_POLL_S = 0.01  # how often the collector's RIB is read while timing the cut-over
# The node's host settings an agent reads at start (the DaemonSet's come from its host file).
HOST_SETTINGS = ("VPC_ATTACH_NODE_NAME", "VPC_ATTACH_KUBECONFIG", "VPC_ATTACH_LOCK_DIR",
                 "VPC_ATTACH_HOST_CONFIG", "VPC_ATTACH_NAMESPACE", "VPC_ATTACH_IPAM_DATA_ROOT")


@pytest.fixture(scope="module")
def deployment(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
               galactic: GalacticBuild,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Migration]:
    """Two galactic sites and a namespace for the VMs, set up once for the module."""
    with migration(kube, cluster, cni_bin, own_agents, galactic,
                   tmp_path_factory.mktemp("migration")) as running:
        yield running


@pytest.mark.both_paths
def test_migration_target_announced_on_the_ready_timestamp_set_as_kubevirt_would(
        deployment: Migration) -> None:
    first, second = deployment.sites
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "41", claim, vm) as source:
        assert source.add().status == 0
        prefixes = deployment.announced_from(source)
        with vm_pod(deployment, second, "41", claim, vm) as target:
            answer = target.add()
            assert answer.status == 0, answer.stdout
            assert sorted(ip["address"] for ip in answer.body["ips"]) == \
                sorted(ip["address"] for ip in (source.result or {})["ips"])
            # Attached but not announced: node 2 advertises nothing of it, its slices say not
            # ready, and it waits in a record.
            assert deployment.advertised(second, "41") == set()
            assert target.slices_ready() == [False, False]
            assert source.slices_ready() == [True, True]
            assert pending_records(second) == [f"{target.container}@{IFNAME}.json"]
            assert deployment.routes(prefixes) == deployment.held_by(first, prefixes)
            print(f"collector before the timestamp: {deployment.routes(prefixes)}")
            checked = target.call("CHECK", with_prev(target.conf(), answer.body))
            assert checked.status == 0, checked.stdout  # unannounced on purpose, not drift
            waiting = doctor_on(second.plugin).findings("migration.targets")
            print(f"doctor on node 2 before the timestamp: {waiting}")
            assert [f["status"] for f in waiting] == ["ok"]
            assert f"{deployment.namespace}/{target.name}" in waiting[0]["detail"]

            kubevirt_marks_target_ready(deployment.kube, deployment.namespace, target.name)
            marked = time.monotonic()
            if not VIA_AGENT:  # kubelet's poll of the runtime's status, made at once
                second.plugin.ok("STATUS", target.conf())
            status_done = time.monotonic()
            deployment.wait_held_by(second, prefixes, interval=CUT_OVER_POLL_S)
            cut_over = time.monotonic() - marked
            extra = f" (STATUS took {status_done - marked:.3f} s of it)" if not VIA_AGENT else ""
            print(f"cut-over ({PATH}): {cut_over:.3f} s from the ready timestamp to the "
                  f"collector holding only node 2's routes{extra}")
            print(f"collector after the timestamp: {deployment.routes(prefixes)}")
            assert deployment.advertised(first, "41") == set()
            assert deployment.advertised(second, "41") == prefixes
            wait_until("the target's slices ready and the source's not",
                       lambda: target.slices_ready() == [True, True]
                       and source.slices_ready() == [False, False], ROUTE_TIMEOUT_S)
            assert pending_records(second) == []

            # The migration completed: KubeVirt deletes the source Pod, its DEL runs.
            source.delete()
            assert deployment.routes(prefixes) == deployment.held_by(second, prefixes)


@pytest.mark.both_paths
def test_a_target_marked_ready_before_its_add_is_announced_by_the_add_as_kubevirt_would(
        deployment: Migration) -> None:
    """The runtime retried the target's ADD after KubeVirt marked the Pod (its first sandbox
    failed): the ADD announces it and withdraws the source before it answers."""
    first, second = deployment.sites
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "46", claim, vm) as source:
        assert source.add().status == 0
        prefixes = deployment.announced_from(source)
        with vm_pod(deployment, second, "46", claim, vm) as target:
            kubevirt_marks_target_ready(deployment.kube, deployment.namespace, target.name)
            assert target.add().status == 0
            assert pending_records(second) == []
            assert deployment.advertised(first, "46") == set()
            assert deployment.advertised(second, "46") == prefixes
            assert target.slices_ready() == [True, True]
            assert source.slices_ready() == [False, False]
            deployment.wait_held_by(second, prefixes)


@pytest.mark.both_paths
def test_failed_migration_keeps_the_source_with_pods_made_as_kubevirt_would(
        deployment: Migration) -> None:
    first, second = deployment.sites
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "42", claim, vm) as source:
        assert source.add().status == 0
        prefixes = deployment.announced_from(source)
        with vm_pod(deployment, second, "42", claim, vm) as target:
            assert target.add().status == 0
            assert pending_records(second) == [f"{target.container}@{IFNAME}.json"]
            # The migration fails before the target was ready: KubeVirt deletes the target
            # Pod, and its sandbox's DEL runs.
            target.delete()
        assert pending_records(second) == []
        assert deployment.advertised(second, "42") == set()
        assert target.slices() == [None, None]
        assert source.slices_ready() == [True, True]
        if not VIA_AGENT:  # a later status poll finds nothing to cut over
            second.plugin.ok("STATUS", target.conf())
        assert deployment.routes(prefixes) == deployment.held_by(first, prefixes)
        assert first.address in deployment.fabric.established()


@pytest.mark.both_paths
def test_a_third_pod_of_a_claim_is_refused_with_pods_made_as_kubevirt_would(
        deployment: Migration) -> None:
    first, second = deployment.sites
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "43", claim, vm) as source, \
            vm_pod(deployment, second, "43", claim, vm) as target:
        assert source.add().status == 0
        prefixes = deployment.announced_from(source)
        assert target.add().status == 0
        with vm_pod(deployment, second, "44", claim, vm) as third:
            refused = third.add()
            print(f"third Pod's ADD: {refused.stdout.strip()}")
            assert refused.status != 0 and refused.code == 102
            message = refused.body["msg"]
            assert f"IPAMClaim {deployment.namespace}/{claim} is held by 2 Pods already" \
                in message
            for held in (source, target):
                assert f"{deployment.namespace}/{held.name} on node {held.site.name}" \
                    in message
            assert f"{third.name} cannot be a third" in message
            assert third.slices() == [None, None]
            assert deployment.advertised(second, "44") == set()
        assert deployment.routes(prefixes) == deployment.held_by(first, prefixes)


def test_a_target_marked_as_kubevirt_would_while_its_agent_was_down_is_cut_over_by_the_next_agent(
        deployment: Migration, tmp_path: Path) -> None:
    """The target's ADD goes through an agent of node 2 that then crashes (SIGKILL); KubeVirt
    marks the target ready while no agent runs; the next agent, started with the node's host
    settings as the DaemonSet's are, finds the record at its first listing of the node's Pods
    and cuts over."""
    first, second = deployment.sites
    plugin = second.plugin
    host = {key: value for key, value in plugin.env("ADD", "", "", IFNAME).items()
            if key in HOST_SETTINGS}
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "45", claim, vm) as source:
        assert source.add().status == 0
        prefixes = deployment.announced_from(source)
        with vm_pod(deployment, second, "45", claim, vm) as target:
            (tmp_path / "a1").mkdir()
            crashed = AgentProcess(tmp_path / "a1", prefix=plugin.prefix, env=host).start()
            try:
                plugin.agent_socket = str(crashed.socket)
                assert target.add().status == 0
                assert [line["verb"] for line in crashed.verb_lines()] == ["ADD"]
            finally:
                plugin.agent_socket = NO_AGENT_SOCKET
                crashed.kill()
            assert pending_records(second) == [f"{target.container}@{IFNAME}.json"]
            kubevirt_marks_target_ready(deployment.kube, deployment.namespace, target.name)
            (tmp_path / "a2").mkdir()
            started = time.monotonic()
            with AgentProcess(tmp_path / "a2", prefix=plugin.prefix, env=host):
                deployment.wait_held_by(second, prefixes, interval=CUT_OVER_POLL_S)
                print(f"cut-over by the restarted agent: {time.monotonic() - started:.3f} s "
                      "after it was started")
                wait_until("the record gone", lambda: pending_records(second) == [],
                           ROUTE_TIMEOUT_S)
            assert target.slices_ready() == [True, True]
            assert source.slices_ready() == [False, False]
