"""A VM's live migration between two nodes running galactic-router (SPEC §16, issue 32 item 4).
KubeVirt does not run here: the test makes the IPAMClaim as ipam-extensions does, the source
and target virt-launcher Pods as virt-controller and kubevirt's webhook leave them, and adds
the ready timestamp to the target Pod as virt-controller does once the target's domain runs
(`e2e/harness/ipamclaims.py`). Both Pods name the claim, so both get its addresses (each node
its own `scope: node` pool of vpc-attach-ipam: the claim's addresses are requested exactly) on
the VM's tap.

A gobgpd collector peered with both nodes' routers holds the VM's prefixes once from node 1
until the timestamp, then once from node 2 (the cut-over time printed, not asserted); a
migration whose target goes before the timestamp leaves the source's routes and nothing of
the target; a third Pod of the claim is refused; a target marked before its ADD is announced
by it; a target marked while its node's agent was down is cut over by the next agent. Through
the agent, the target node's agent cuts over on its Pod watch; in-process, a STATUS of the
network on the target node does (the test runs it right after the timestamp, standing in for
a runtime's poll, which reaches a network behind Multus only when run by hand).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.migration import RECORDS_DIR
from e2e.harness.agentproc import AgentProcess, OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import Fabric, running_fabric
from e2e.harness.ipamclaims import (
    claims_namespace,
    kubevirt_creates_claim,
    kubevirt_marks_target_ready,
    virt_launcher_pod,
)
from e2e.harness.kernel import remove_vpc_objects, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import (
    NO_AGENT_SOCKET,
    VIA_AGENT,
    Answer,
    base_conf,
    random_vpc,
    with_prev,
)
from e2e.harness.publishing import advertisement, endpoint_slice
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until
from e2e.test_galactic_router import ROUTE_TIMEOUT_S, GalacticNode, start_node

# Every test but the agent restart's runs in both passes: that one brings agents of its own,
# and in the agent pass the node agents would have served node 2's earlier ADDs already.
pytestmark = [pytest.mark.root, pytest.mark.cluster]
PATH = "agent" if VIA_AGENT else "in-process"
IFNAME = "net1"  # Multus's name for the VM network's element
FAMILIES = ("IPv6", "IPv4")
# As the shipped tap example (examples/tap-vm.conflist) makes the VM's tap.
TAP = {"owner": 107, "group": 107, "multiQueue": True, "vnetHdr": True}
DOCTOR_TIMEOUT_S = 60.0
CUT_OVER_POLL_S = 0.01  # how often the collector's RIB is read while timing the cut-over
# The node's host settings an agent reads at start (the DaemonSet's come from its host file).
HOST_SETTINGS = ("VPC_ATTACH_NODE_NAME", "VPC_ATTACH_KUBECONFIG", "VPC_ATTACH_LOCK_DIR",
                 "VPC_ATTACH_HOST_CONFIG", "VPC_ATTACH_NAMESPACE", "VPC_ATTACH_IPAM_DATA_ROOT")


@dataclass
class Deployment:
    """The collector, two nodes (each its own vpc-attach-ipam data root), a VPC and a
    namespace for the VMs' claims and Pods."""

    kube: Kube
    fabric: Fabric
    nodes: list[GalacticNode]
    vpc: str
    namespace: str
    root: Path

    def conf(self, node: GalacticNode, att: str) -> dict[str, Any]:
        """The VM network on `node`: the VM's tap as the shipped example makes it,
        allowPersistentIPs, publishing BGP and both slices, a node-scope pool in the node's
        own data directory."""
        ipam = {"type": "vpc-attach-ipam", "dataDir": str(self.root / f"ipam-{node.index}"),
                "ipv6_subnet": "fd00:65::/64", "ipv4_subnet": "10.65.0.0/24"}
        return base_conf(self.vpc, att, name=f"vms-{self.vpc}", allowPersistentIPs=True,
                         attachment="tap", mtu=1400, tap=TAP, ipam=ipam,
                         publish={"bgp": True, "endpointSlice": True,
                                  "endpointSliceFamilies": list(FAMILIES)})

    def new_vm(self) -> tuple[str, str]:
        """A fresh VM's name and the claim ipam-extensions creates for its network."""
        vm = f"vm-{secrets.token_hex(3)}"
        return vm, kubevirt_creates_claim(self.kube, self.namespace, f"vms-{self.vpc}", vm)

    def routes(self, prefixes: set[str]) -> list[tuple[str, str]]:
        """The collector's (prefix, router) paths of these prefixes, sorted."""
        return sorted((r.prefix, r.router) for r in self.fabric.rib() if r.prefix in prefixes)

    def held_by(self, node: GalacticNode, prefixes: set[str]) -> list[tuple[str, str]]:
        """Each prefix once, from node's router."""
        return sorted((prefix, node.address) for prefix in prefixes)


@pytest.fixture(scope="module")
def deployment(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
               galactic: GalacticBuild,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp_path = tmp_path_factory.mktemp("migration")
    vpc = random_vpc()
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, [vpc])
        stack.enter_context(bound(kube, vpc))
        fabric = stack.enter_context(running_fabric(galactic, tmp_path, nodes=2))
        nodes = [start_node(stack, fabric, index, kube, cluster, cni_bin, own_agents, tmp_path)
                 for index in (1, 2)]
        for node in nodes:  # each node's notes of the claims it holds are its own
            node.node.plugin.environ["VPC_ATTACH_IPAM_DATA_ROOT"] = \
                str(tmp_path / f"ipam-{node.index}")
        namespace = stack.enter_context(claims_namespace(kube))
        yield Deployment(kube, fabric, nodes, vpc, namespace, tmp_path)


@dataclass
class VmPod:
    """A virt-launcher Pod of the VM on a node, and its container's ADD and DEL."""

    deployment: Deployment
    node: GalacticNode
    att: str
    name: str
    uid: str
    netns: str
    result: dict[str, Any] | None = None

    @property
    def container(self) -> str:
        return f"ctr-{self.name}"

    def call(self, verb: str, conf: dict[str, Any]) -> Answer:
        node = self.node.node
        return node.plugin.call(verb, conf, container_id=self.container, netns=self.netns,
                                ifname=IFNAME,
                                CNI_ARGS=node.cni_args(self.name, self.uid,
                                                       self.deployment.namespace))

    def add(self) -> Answer:
        answer = self.call("ADD", self.deployment.conf(self.node, self.att))
        if answer.status == 0:
            self.result = answer.body
        return answer

    def delete(self) -> None:
        conf = self.deployment.conf(self.node, self.att)
        answer = self.call("DEL", with_prev(conf, self.result) if self.result else conf)
        assert answer.status == 0, answer.stdout

    def slices(self) -> list[dict[str, Any] | None]:
        return [endpoint_slice(self.deployment.kube,
                               slice_name(self.name, self.deployment.vpc, self.att, family),
                               self.deployment.namespace) for family in FAMILIES]

    def slices_ready(self) -> list[bool]:
        return [bool(s["endpoints"][0]["conditions"]["ready"]) for s in self.slices() if s]


@contextlib.contextmanager
def vm_pod(deployment: Deployment, node: GalacticNode, att: str, claim: str,
           vm: str) -> Iterator[VmPod]:
    """A virt-launcher Pod of `vm` on node with a netns for its sandbox; DEL (if it was added)
    and the Pod's deletion afterwards."""
    name, uid = virt_launcher_pod(deployment.kube, deployment.namespace, node.node.name,
                                  claim, vm)
    with temporary_netns("vpa-mig") as netns:
        pod = VmPod(deployment, node, att, name, uid, netns)
        try:
            yield pod
        finally:
            if pod.result is not None:
                pod.delete()
            deployment.kube.delete(f"/api/v1/namespaces/{deployment.namespace}/pods/{name}")


def prefixes_of_node(deployment: Deployment, node: GalacticNode, att: str) -> set[str]:
    """What node's advertisement of the attachment advertises (none when it has none)."""
    found = advertisement(deployment.kube,
                          naming.advertisement_name(deployment.vpc, att, node.node.name))
    return set((found or {}).get("spec", {}).get("prefixes") or [])


def announced_from_source(deployment: Deployment, source: VmPod) -> set[str]:
    """The VM's prefixes once the source's ADD is announced: the collector holds them once,
    from the source's node."""
    prefixes = prefixes_of_node(deployment, source.node, source.att)
    assert len(prefixes) == 2, prefixes  # the claim's IPv6 and IPv4 address
    wait_until(f"the collector to hold {sorted(prefixes)} from node {source.node.index}",
               lambda: deployment.routes(prefixes) == deployment.held_by(source.node,
                                                                         prefixes),
               ROUTE_TIMEOUT_S, alive=deployment.fabric.alive,
               detail=lambda: str(deployment.routes(prefixes)))
    return prefixes


def pending_records(node: GalacticNode) -> list[str]:
    """The migration targets recorded on node, waiting for the ready timestamp."""
    directory = node.node.plugin.lock_dir / RECORDS_DIR
    return sorted(p.name for p in directory.glob("*.json")) if directory.exists() else []


def doctor_migration_targets(node: GalacticNode) -> list[dict[str, str]]:
    """`vpc-attach doctor --json`'s migration.targets finding, run inside the node with its
    settings, as an operator runs it there."""
    plugin = node.node.plugin
    done = subprocess.run(
        [*plugin.prefix, str(plugin.cni_bin / "vpc-attach"), "doctor", "--json"],
        env={key: value for key, value in plugin.env("", "", "", IFNAME).items()
             if not key.startswith("CNI_")},
        capture_output=True, text=True, timeout=DOCTOR_TIMEOUT_S, check=False)
    assert done.stdout.strip(), done.stderr
    return [finding for finding in json.loads(done.stdout)["checks"]
            if finding["check"] == "migration.targets"]


@pytest.mark.both_paths
def test_migration_target_announced_on_the_ready_timestamp_set_as_kubevirt_would(
        deployment: Deployment) -> None:
    first, second = deployment.nodes
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "41", claim, vm) as source:
        assert source.add().status == 0
        prefixes = announced_from_source(deployment, source)
        with vm_pod(deployment, second, "41", claim, vm) as target:
            answer = target.add()
            assert answer.status == 0, answer.stdout
            assert sorted(ip["address"] for ip in answer.body["ips"]) == \
                sorted(ip["address"] for ip in (source.result or {})["ips"])
            # Attached but not announced: node 2 advertises nothing of it, its slices say not
            # ready, and it waits in a record.
            assert prefixes_of_node(deployment, second, "41") == set()
            assert target.slices_ready() == [False, False]
            assert source.slices_ready() == [True, True]
            assert pending_records(second) == [f"{target.container}@{IFNAME}.json"]
            assert deployment.routes(prefixes) == deployment.held_by(first, prefixes)
            print(f"collector before the timestamp: {deployment.routes(prefixes)}")
            checked = target.call("CHECK", with_prev(deployment.conf(second, "41"),
                                                     answer.body))
            assert checked.status == 0, checked.stdout  # unannounced on purpose, not drift
            waiting = doctor_migration_targets(second)
            print(f"doctor on node 2 before the timestamp: {waiting}")
            assert [f["status"] for f in waiting] == ["ok"]
            assert f"{deployment.namespace}/{target.name}" in waiting[0]["detail"]

            kubevirt_marks_target_ready(deployment.kube, deployment.namespace, target.name,
                                        time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC",
                                                      time.gmtime()))
            marked = time.monotonic()
            if not VIA_AGENT:  # kubelet's poll of the runtime's status, made at once
                target.node.node.plugin.ok("STATUS", deployment.conf(second, "41"))
            status_done = time.monotonic()
            wait_until(f"the collector to hold {sorted(prefixes)} from node 2 only",
                       lambda: deployment.routes(prefixes) == deployment.held_by(second,
                                                                                 prefixes),
                       ROUTE_TIMEOUT_S, interval=CUT_OVER_POLL_S, alive=deployment.fabric.alive,
                       detail=lambda: str(deployment.routes(prefixes)))
            cut_over = time.monotonic() - marked
            extra = f" (STATUS took {status_done - marked:.3f} s of it)" if not VIA_AGENT else ""
            print(f"cut-over ({PATH}): {cut_over:.3f} s from the ready timestamp to the "
                  f"collector holding only node 2's routes{extra}")
            print(f"collector after the timestamp: {deployment.routes(prefixes)}")
            assert prefixes_of_node(deployment, first, "41") == set()
            assert prefixes_of_node(deployment, second, "41") == prefixes
            wait_until("the target's slices ready and the source's not",
                       lambda: target.slices_ready() == [True, True]
                       and source.slices_ready() == [False, False], ROUTE_TIMEOUT_S)
            assert pending_records(second) == []

            # The migration completed: KubeVirt deletes the source Pod, its DEL runs.
            source.delete()
            source.result = None
            assert deployment.routes(prefixes) == deployment.held_by(second, prefixes)


@pytest.mark.both_paths
def test_a_target_marked_ready_before_its_add_is_announced_by_the_add_as_kubevirt_would(
        deployment: Deployment) -> None:
    """The runtime retried the target's ADD after KubeVirt marked the Pod (its first sandbox
    failed): the ADD announces it and withdraws the source before it answers."""
    first, second = deployment.nodes
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "46", claim, vm) as source:
        assert source.add().status == 0
        prefixes = announced_from_source(deployment, source)
        with vm_pod(deployment, second, "46", claim, vm) as target:
            kubevirt_marks_target_ready(deployment.kube, deployment.namespace, target.name,
                                        time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC",
                                                      time.gmtime()))
            assert target.add().status == 0
            assert pending_records(second) == []
            assert prefixes_of_node(deployment, first, "46") == set()
            assert prefixes_of_node(deployment, second, "46") == prefixes
            assert target.slices_ready() == [True, True]
            assert source.slices_ready() == [False, False]
            wait_until(f"the collector to hold {sorted(prefixes)} from node 2 only",
                       lambda: deployment.routes(prefixes) == deployment.held_by(second,
                                                                                 prefixes),
                       ROUTE_TIMEOUT_S, alive=deployment.fabric.alive,
                       detail=lambda: str(deployment.routes(prefixes)))


@pytest.mark.both_paths
def test_failed_migration_keeps_the_source_with_pods_made_as_kubevirt_would(
        deployment: Deployment) -> None:
    first, second = deployment.nodes
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "42", claim, vm) as source:
        assert source.add().status == 0
        prefixes = announced_from_source(deployment, source)
        with vm_pod(deployment, second, "42", claim, vm) as target:
            assert target.add().status == 0
            assert pending_records(second) == [f"{target.container}@{IFNAME}.json"]
            # The migration fails before the target was ready: KubeVirt deletes the target
            # Pod, and its sandbox's DEL runs.
            target.delete()
            target.result = None
        assert pending_records(second) == []
        assert prefixes_of_node(deployment, second, "42") == set()
        assert target.slices() == [None, None]
        assert source.slices_ready() == [True, True]
        if not VIA_AGENT:  # a later status poll finds nothing to cut over
            second.node.plugin.ok("STATUS", deployment.conf(second, "42"))
        assert deployment.routes(prefixes) == deployment.held_by(first, prefixes)
        assert first.address in deployment.fabric.established()


@pytest.mark.both_paths
def test_a_third_pod_of_a_claim_is_refused_with_pods_made_as_kubevirt_would(
        deployment: Deployment) -> None:
    first, second = deployment.nodes
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "43", claim, vm) as source, \
            vm_pod(deployment, second, "43", claim, vm) as target:
        assert source.add().status == 0
        prefixes = announced_from_source(deployment, source)
        assert target.add().status == 0
        with vm_pod(deployment, second, "44", claim, vm) as third:
            refused = third.add()
            print(f"third Pod's ADD: {refused.stdout.strip()}")
            assert refused.status != 0 and refused.code == 102
            message = refused.body["msg"]
            assert f"IPAMClaim {deployment.namespace}/{claim} is held by 2 Pods already" \
                in message
            for held in (source, target):
                assert f"{deployment.namespace}/{held.name} on node {held.node.node.name}" \
                    in message
            assert f"{third.name} cannot be a third" in message
            assert third.slices() == [None, None]
            assert prefixes_of_node(deployment, second, "44") == set()
        assert deployment.routes(prefixes) == deployment.held_by(first, prefixes)


def test_a_target_marked_as_kubevirt_would_while_its_agent_was_down_is_cut_over_by_the_next_agent(
        deployment: Deployment, tmp_path: Path) -> None:
    """The target's ADD goes through an agent of node 2 that then crashes (SIGKILL); KubeVirt
    marks the target ready while no agent runs; the next agent, started with the node's host
    settings as the DaemonSet's are, finds the record at its first listing of the node's Pods
    and cuts over."""
    first, second = deployment.nodes
    plugin = second.node.plugin
    host = {key: value for key, value in plugin.env("ADD", "", "", IFNAME).items()
            if key in HOST_SETTINGS}
    vm, claim = deployment.new_vm()
    with vm_pod(deployment, first, "45", claim, vm) as source:
        assert source.add().status == 0
        prefixes = announced_from_source(deployment, source)
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
            kubevirt_marks_target_ready(deployment.kube, deployment.namespace, target.name,
                                        time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC",
                                                      time.gmtime()))
            (tmp_path / "a2").mkdir()
            started = time.monotonic()
            with AgentProcess(tmp_path / "a2", prefix=plugin.prefix, env=host):
                wait_until(f"the collector to hold {sorted(prefixes)} from node 2 only",
                           lambda: deployment.routes(prefixes) ==
                           deployment.held_by(second, prefixes), ROUTE_TIMEOUT_S,
                           interval=CUT_OVER_POLL_S, alive=deployment.fabric.alive,
                           detail=lambda: str(deployment.routes(prefixes)))
                print(f"cut-over by the restarted agent: {time.monotonic() - started:.3f} s "
                      "after it was started")
                wait_until("the record gone", lambda: pending_records(second) == [],
                           ROUTE_TIMEOUT_S)
            assert target.slices_ready() == [True, True]
            assert source.slices_ready() == [False, False]
