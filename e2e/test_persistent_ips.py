"""KubeVirt's persistent IPs through the verbs (SPEC §16, `allowPersistentIPs`): the real
`vpc-attach` executable (in-process, or through the agent and its Pod cache) on the real
control plane with the real IPAMClaim CRD. Claims are made as kubevirt's ipam-extensions makes
them and the Pods carry the network-selection element its webhook leaves; no kubelet runs them.
A Pod with a claim gets addresses and the claim's status says so; the claim's next Pod gets
exactly those; nobody else can take them (102 naming the claim); DEL and GC keep them; a
claim for another network, addresses outside the pool and another IPAM are code 7; a Pod
without a claim costs the API requests it always did. Claims are read back with the test's
own admin client, the records with the harness's reader."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.faults import start_proxy
from e2e.harness.ipam_files import IpamFiles
from e2e.harness.ipamclaims import claims_namespace, claims_path, kubevirt_claim
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import Answer, Plugin, base_conf, with_prev
from e2e.harness.publishing import Node, make_node
from e2e.harness.report import report
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
IFNAME = "net1"  # Multus's name for the first element that asks for no interface
VM = "vm-a"


@pytest.fixture
def vm_namespace(kube: Kube) -> Iterator[str]:
    with claims_namespace(kube) as name:
        yield name


@pytest.fixture
def node(kube: Kube, cluster: Any, plugin: Plugin) -> Node:
    return make_node(kube, cluster, plugin)


def stanza(vpc: str, data_dir: Path, **extra: Any) -> dict[str, Any]:
    ipam = {"type": "vpc-attach-ipam", "dataDir": str(data_dir),
            "ipv6_subnet": "fd00:61::/64", "ipv4_subnet": "10.61.0.0/24"}
    ipam.update(extra.pop("ipam", {}))
    return base_conf(vpc, "61", name=f"vms-{vpc}", allowPersistentIPs=True, ipam=ipam,
                     capabilities={"ips": True}, **extra)


def kubevirt_creates_claim(kube: Kube, namespace: str, network_config: str) -> str:
    """What ipam-extensions' VMI controller does for a VM network whose config allows
    persistent IPs; the claim's name."""
    made = kube.create(claims_path(namespace),
                       kubevirt_claim(namespace, VM, f"uid-{secrets.token_hex(4)}", "blue",
                                      network_config))
    return str(made["metadata"]["name"])


def launcher_pod_as_kubevirts_webhook_left_it(kube: Kube, namespace: str, node: Node,
                                              claim: str | None) -> tuple[str, str]:
    """A virt-launcher Pod on node whose network-selection element (no interface asked for:
    Multus names it net1) carries ipam-extensions' claim reference; (name, uid)."""
    element: dict[str, Any] = {"name": "blue-nad", "namespace": namespace}
    if claim is not None:
        element["ipam-claim-reference"] = claim
    name = f"virt-launcher-{VM}-{secrets.token_hex(3)}"
    pod = kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {NETWORKS_ANNOTATION: json.dumps([element])}},
        "spec": {"nodeName": node.name, "automountServiceAccountToken": False,
                 "containers": [{"name": "compute", "image": "registry.invalid/virt:1"}]}})
    return name, str(pod["metadata"]["uid"])


def claim_status(kube: Kube, namespace: str, claim: str) -> dict[str, Any]:
    found = kube.get(claims_path(namespace, claim))
    assert found is not None
    status: dict[str, Any] = found.get("status") or {}
    return status


def allocated(status: dict[str, Any]) -> tuple[str, str, str]:
    condition = next(c for c in status["conditions"] if c["type"] == "IPsAllocated")
    return condition["status"], condition["reason"], status["ownerPod"]["name"]


class Launcher:
    """ADD and DEL of one Pod's attachment, as the runtime runs them."""

    def __init__(self, plugin: Plugin, node: Node, namespace: str, pod: tuple[str, str],
                 container: str, netns: str) -> None:
        self.plugin, self.node, self.namespace = plugin, node, namespace
        self.pod, self.uid = pod
        self.container, self.netns = container, netns

    def add(self, conf: dict[str, Any]) -> Answer:
        return self.plugin.call("ADD", conf, container_id=self.container, netns=self.netns,
                                ifname=IFNAME,
                                CNI_ARGS=self.node.cni_args(self.pod, self.uid, self.namespace))

    def ok(self, verb: str, conf: dict[str, Any]) -> Any:
        return self.plugin.ok(verb, conf, container_id=self.container, netns=self.netns,
                              ifname=IFNAME,
                              CNI_ARGS=self.node.cni_args(self.pod, self.uid, self.namespace))


class Scene:
    """One test's VM network: its config, node, namespace and the claims and Pods in it."""

    def __init__(self, kube: Kube, plugin: Plugin, node: Node, namespace: str,
                 conf: dict[str, Any], data_dir: Path) -> None:
        self.kube, self.plugin, self.node, self.namespace = kube, plugin, node, namespace
        self.conf, self.data_dir = conf, data_dir

    def claim(self, network_config: str | None = None) -> str:
        return kubevirt_creates_claim(self.kube, self.namespace,
                                      network_config or self.conf["name"])

    def pod(self, claim: str | None) -> tuple[str, str]:
        return launcher_pod_as_kubevirts_webhook_left_it(self.kube, self.namespace, self.node,
                                                         claim)

    def launcher(self, pod: tuple[str, str], container: str, netns: str) -> Launcher:
        return Launcher(self.plugin, self.node, self.namespace, pod, container, netns)

    def attached_and_detached(self, pod: tuple[str, str], container: str) -> dict[str, Any]:
        """ADD then DEL of the Pod's container in a netns of its own; the ADD's result."""
        with temporary_netns("vpa-pip") as netns:
            launcher = self.launcher(pod, container, netns)
            result: dict[str, Any] = launcher.ok("ADD", self.conf)
            launcher.ok("DEL", with_prev(self.conf, result))
        return result

    def files(self) -> IpamFiles:
        return IpamFiles.read(self.data_dir)


@pytest.fixture
def scene(kube: Kube, plugin: Plugin, node: Node, vm_namespace: str, vpc: str,
          tmp_path: Path) -> Scene:
    return Scene(kube, plugin, node, vm_namespace, stanza(vpc, tmp_path / "ipam"),
                 tmp_path / "ipam")


def ips_of(result: dict[str, Any]) -> list[str]:
    return sorted(ip["address"] for ip in result["ips"])


def test_a_pod_with_a_claim_gets_addresses_and_the_claims_status_records_them(
        kube: Kube, plugin: Plugin, node: Node, vm_namespace: str, vpc: str, tmp_path: Path,
        pytestconfig: pytest.Config) -> None:
    conf = stanza(vpc, tmp_path / "ipam")
    claim = kubevirt_creates_claim(kube, vm_namespace, conf["name"])
    pod = launcher_pod_as_kubevirts_webhook_left_it(kube, vm_namespace, node, claim)
    with temporary_netns("vpa-pip") as netns:
        launcher = Launcher(plugin, node, vm_namespace, pod, "ctr-a", netns)
        answer = launcher.add(conf)
        assert answer.status == 0, answer.stdout
        status = claim_status(kube, vm_namespace, claim)
        assert sorted(status["ips"]) == ips_of(answer.body) == ["10.61.0.2/32",
                                                                 "fd00:61::1:0:0/96"]
        assert allocated(status) == ("True", "SuccessfulAllocation", pod[0])
        report(pytestconfig, "IPAMClaim status after a Pod's ADD", tmp_path / "status.json",
               status)
        uid = kube.get(claims_path(vm_namespace, claim))["metadata"]["uid"]  # type: ignore[index]
        assert set(IpamFiles.read(tmp_path / "ipam").claims().values()) == \
            {f"{vm_namespace}/{claim}@{uid}"}
        launcher.ok("DEL", with_prev(conf, answer.body))


def test_the_claims_next_pod_after_del_gets_exactly_the_same_addresses(scene: Scene) -> None:
    conf, claim = scene.conf, scene.claim()
    result = scene.attached_and_detached(scene.pod(claim), "ctr-first")
    assert scene.files().holders() == {}, "DEL detached them"
    # A container of another Pod takes the next free addresses meanwhile.
    other, second_pod = scene.pod(None), scene.pod(claim)
    plain = {**conf, "vpcattachment": "62"}
    with temporary_netns("vpa-pip") as other_netns, temporary_netns("vpa-pip") as netns:
        intruder = scene.launcher(other, "ctr-other", other_netns)
        taken = intruder.ok("ADD", plain)
        assert set(ips_of(taken)).isdisjoint(ips_of(result))
        second = scene.launcher(second_pod, "ctr-second", netns)
        again = second.ok("ADD", conf)
        assert ips_of(again) == ips_of(result)
        status = claim_status(scene.kube, scene.namespace, claim)
        assert sorted(status["ips"]) == ips_of(result)
        assert allocated(status) == ("True", "SuccessfulAllocation", second_pod[0])
        second.ok("DEL", with_prev(conf, again))
        intruder.ok("DEL", with_prev(plain, taken))


def test_a_container_without_the_claim_asking_for_its_address_gets_102_naming_the_claim(
        scene: Scene) -> None:
    claim = scene.claim()
    scene.attached_and_detached(scene.pod(claim), "ctr-a")
    with temporary_netns("vpa-pip") as netns:
        intruder = scene.launcher(scene.pod(None), "ctr-b", netns)
        answer = intruder.add({**scene.conf, "vpcattachment": "62",
                               "runtimeConfig": {"ips": ["10.61.0.2"]}})
    assert answer.code == 102, answer.stdout
    assert f"IPAMClaim {scene.namespace}/{claim} holds it" in answer.body["msg"]
    assert "10.61.0.2" in scene.files().claims()


def test_gc_keeps_a_claims_addresses_after_its_container_is_gone(scene: Scene) -> None:
    scene.attached_and_detached(scene.pod(scene.claim()), "ctr-a")
    scene.plugin.ok("GC", {**scene.conf, "cni.dev/valid-attachments": []})
    assert sorted(scene.files().claims()) == ["10.61.0.2", "fd00:61::1:0:0"]


def test_a_claim_for_another_network_is_code_7_naming_both(scene: Scene) -> None:
    claim = scene.claim("someone-elses-network")
    with temporary_netns("vpa-pip") as netns:
        answer = scene.launcher(scene.pod(claim), "ctr-a", netns).add(scene.conf)
    assert answer.code == 7, answer.stdout
    assert answer.body["msg"] == (f"IPAMClaim {scene.namespace}/{claim} is for network "
                                  f"'someone-elses-network', not this network config's "
                                  f"{scene.conf['name']!r}")
    assert scene.files().records == {}
    assert claim_status(scene.kube, scene.namespace, claim) == {}


def test_claim_addresses_another_ipam_wrote_outside_the_pool_are_code_7(scene: Scene) -> None:
    claim = scene.claim()
    path = claims_path(scene.namespace, claim)
    stored = scene.kube.get(path)
    assert stored is not None
    stored["status"] = {"ips": ["10.99.0.5/32"], "ownerPod": {"name": "elsewhere"}}
    scene.kube.request("PUT", path + "/status", stored)
    with temporary_netns("vpa-pip") as netns:
        answer = scene.launcher(scene.pod(claim), "ctr-a", netns).add(scene.conf)
    assert answer.code == 7, answer.stdout
    assert f"invalid IPAMClaim {scene.namespace}/{claim} status.ips: 10.99.0.5/32 is outside " \
        "every pool" in answer.body["msg"]
    assert claim_status(scene.kube, scene.namespace, claim)["ips"] == ["10.99.0.5/32"]


def test_an_ips_capability_other_than_the_claims_addresses_is_code_7_naming_both(
        scene: Scene) -> None:
    claim = scene.claim()
    pod = scene.pod(claim)
    scene.attached_and_detached(pod, "ctr-a")
    with temporary_netns("vpa-pip") as netns:
        answer = scene.launcher(pod, "ctr-a", netns).add(
            {**scene.conf, "runtimeConfig": {"ips": ["10.61.0.9"]}})
    assert answer.code == 7, answer.stdout
    assert f"it asks for 10.61.0.9, but IPAMClaim {scene.namespace}/{claim} status.ips holds" \
        in answer.body["msg"]


def test_an_exhausted_pool_is_recorded_in_the_claim_as_subnet_exhausted(
        kube: Kube, plugin: Plugin, node: Node, vm_namespace: str, vpc: str,
        tmp_path: Path) -> None:
    # A /30 hands out one address (10.61.0.2): a Pod without a claim takes it first.
    conf = stanza(vpc, tmp_path / "ipam", ipam={"ipv4_subnet": "10.61.0.0/30",
                                                "address_families": ["IPv4"]})
    claim = kubevirt_creates_claim(kube, vm_namespace, conf["name"])
    plain = launcher_pod_as_kubevirts_webhook_left_it(kube, vm_namespace, node, None)
    pod = launcher_pod_as_kubevirts_webhook_left_it(kube, vm_namespace, node, claim)
    with temporary_netns("vpa-pip") as other_netns, temporary_netns("vpa-pip") as netns:
        first = Launcher(plugin, node, vm_namespace, plain, "ctr-plain", other_netns)
        taken = first.ok("ADD", {**conf, "vpcattachment": "62"})
        answer = Launcher(plugin, node, vm_namespace, pod, "ctr-a", netns).add(conf)
        assert answer.code == 102, answer.stdout
        first.ok("DEL", with_prev({**conf, "vpcattachment": "62"}, taken))
    status = claim_status(kube, vm_namespace, claim)
    assert status["ips"] == []
    assert allocated(status) == ("False", "SubnetExhausted", pod[0])


def test_allow_persistent_ips_with_host_local_is_code_7_saying_it_needs_vpc_attach_ipam(
        plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    conf = base_conf(vpc, "61", allowPersistentIPs=True,
                     ipam={"type": "host-local", "ranges": [[{"subnet": "fd00:61::/64"}]]})
    answer = plugin.call("ADD", conf, container_id="ctr-a", netns="/var/run/netns/none")
    assert answer.code == 7, answer.stdout
    assert answer.body["msg"] == "invalid config key 'allowPersistentIPs'"
    assert "kept by vpc-attach-ipam" in answer.body["details"]


def test_an_add_of_a_pod_without_a_claim_makes_the_requests_it_made_without_the_setting(
        kube: Kube, cluster: Any, plugin: Plugin, vm_namespace: str, vpc: str, tmp_path: Path,
        pytestconfig: pytest.Config) -> None:
    """Seen by a proxy between the plugin and the API server, publishing on (the EndpointSlice
    step reads the Pod too): allowPersistentIPs with no claim reference reads the Pod once,
    for both steps (through the agent: from its Pod cache), and nothing else."""
    proxied = start_proxy(cluster, tmp_path)
    try:
        node = make_node(kube, cluster, plugin)
        plugin.environ["VPC_ATTACH_KUBECONFIG"] = str(proxied.kubeconfig)
        runs: dict[bool, list[str]] = {}
        for n, setting in enumerate((False, True, False, True)):
            conf = stanza(vpc, tmp_path / "ipam", publish={"bgp": False, "endpointSlice": True})
            conf["allowPersistentIPs"] = setting
            pod = launcher_pod_as_kubevirts_webhook_left_it(kube, vm_namespace, node, None)
            with temporary_netns("vpa-pip") as netns:
                launcher = Launcher(plugin, node, vm_namespace, pod, f"ctr-{n}", netns)
                mark = len(proxied.proxy.seen())
                result = launcher.ok("ADD", conf)
                wait_until("the proxy to record the ADD's requests",
                           lambda: proxied.proxy.in_flight() == 0, 10, interval=0.05)
                runs[setting] = sorted(
                    f"{s.method} {s.resource}" for s in proxied.proxy.seen()[mark:]
                    if "watch=1" not in s.path and s.resource not in ("events", None))
                launcher.ok("DEL", with_prev(conf, result))
        # The second pair counts (the first warms an agent's caches).
        report(pytestconfig, "API requests of an ADD of a Pod without a claim",
               tmp_path / "requests.json",
               {f"allowPersistentIPs {setting}": {"count": len(seen), "requests": seen}
                for setting, seen in runs.items()})
        assert runs[True] == runs[False], runs
        assert "GET ipamclaims" not in runs[True]
    finally:
        proxied.stop()
