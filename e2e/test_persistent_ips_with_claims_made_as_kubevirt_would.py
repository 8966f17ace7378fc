"""KubeVirt's persistent IPs through the verbs (SPEC §16, `allowPersistentIPs`): the real
`vpc-attach` executable (in-process, or through the agent and its Pod cache) on the real
control plane with the real IPAMClaim CRD. Claims are made as kubevirt's ipam-extensions makes
them and the Pods carry the network-selection element its webhook leaves; no kubelet runs them.
A Pod with a claim gets addresses and the claim's status says so; the claim's next Pod gets
exactly those; nobody else can take them (102 naming the claim); DEL and GC keep them; a
claim for another network, addresses outside the pool and another IPAM are code 7; two
claims racing for a pool's last address: one gets it, the other's claim says SubnetExhausted; a
claim
another writer filled first rolls the ADD back (11) giving back only what it took; a Pod
without a claim costs the API requests it always did. Claims are read back with the test's
own admin client, the records with the harness's reader."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS
from e2e.harness.faults import Fault, Rule, start_proxy
from e2e.harness.ipamclaims import allocated, claim_status, claims_path
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.scene import Scene, vm_scene
from e2e.harness.nodes import NODES, node_objects
from e2e.harness.plugin import Answer, Plugin, base_conf, with_prev
from e2e.harness.rbac import identity_without
from e2e.harness.report import report
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]


@pytest.fixture
def scene(kube: Kube, cluster: Any, plugin: Plugin, vpc: str,
          tmp_path: Path) -> Iterator[Scene]:
    with vm_scene(kube, cluster, plugin, vpc, tmp_path) as made:
        yield made


def ips_of(result: dict[str, Any]) -> list[str]:
    return sorted(ip["address"] for ip in result["ips"])


def test_a_pod_with_a_claim_gets_addresses_and_the_claims_status_records_them(
        scene: Scene, pytestconfig: pytest.Config) -> None:
    claim = scene.claim()
    pod = scene.pod(claim)
    with temporary_netns("vpa-pip") as netns:
        launcher = scene.launcher(pod, "ctr-a", netns)
        answer = launcher.add(scene.conf)
        assert answer.status == 0, answer.stdout
        status = claim_status(scene.kube, scene.namespace, claim)
        assert sorted(status["ips"]) == ips_of(answer.body) == ["10.61.0.2/32",
                                                                 "fd00:61::1:0:0/96"]
        assert allocated(status) == ("True", "SuccessfulAllocation", pod[0])
        report(pytestconfig, "IPAMClaim status after a Pod's ADD",
               scene.data_dir.parent / "status.json", status)
        stored = scene.kube.get(claims_path(scene.namespace, claim))
        assert stored is not None
        assert set(scene.files().claims().values()) == \
            {f"{scene.namespace}/{claim}@{stored['metadata']['uid']}"}
        launcher.ok("DEL", with_prev(scene.conf, answer.body))


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


def test_an_exhausted_pool_is_recorded_in_the_claim_as_subnet_exhausted(scene: Scene) -> None:
    # A /30 hands out one address (10.61.0.2): a Pod without a claim takes it first.
    conf = {**scene.conf, "ipam": {**scene.conf["ipam"], "ipv4_subnet": "10.61.0.0/30",
                                   "address_families": ["IPv4"]}}
    plain_conf = {**conf, "vpcattachment": "62"}
    claim = scene.claim()
    plain, pod = scene.pod(None), scene.pod(claim)
    with temporary_netns("vpa-pip") as other_netns, temporary_netns("vpa-pip") as netns:
        first = scene.launcher(plain, "ctr-plain", other_netns)
        taken = first.ok("ADD", plain_conf)
        answer = scene.launcher(pod, "ctr-a", netns).add(conf)
        assert answer.code == 102, answer.stdout
        first.ok("DEL", with_prev(plain_conf, taken))
    status = claim_status(scene.kube, scene.namespace, claim)
    assert status["ips"] == []
    assert allocated(status) == ("False", "SubnetExhausted", pod[0])


def test_two_claims_racing_for_the_last_address_one_gets_it_the_other_is_subnet_exhausted(
        scene: Scene) -> None:
    # A /30 hands out one address: two VMs' first Pods ADD at once, each with its own claim.
    conf = {**scene.conf, "ipam": {**scene.conf["ipam"], "ipv4_subnet": "10.61.0.0/30",
                                   "address_families": ["IPv4"]}}
    confs = [conf, {**conf, "vpcattachment": "62"}]  # one attachment per Pod on a node
    claims = [scene.claim(vm="vm-a"), scene.claim(vm="vm-b")]
    pods = [scene.pod(claim) for claim in claims]
    with temporary_netns("vpa-pip") as netns_a, temporary_netns("vpa-pip") as netns_b:
        launchers = [scene.launcher(pod, f"ctr-{n}", netns)
                     for n, (pod, netns) in enumerate(zip(pods, (netns_a, netns_b), strict=True))]
        start = threading.Barrier(2)

        def add(n: int) -> Answer:
            start.wait(timeout=30)
            return launchers[n].add(confs[n])

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(add, range(2)))
        assert sorted(a.status == 0 for a in answers) == [False, True], \
            [a.stdout for a in answers]
        won = next(n for n, a in enumerate(answers) if a.status == 0)
        lost = 1 - won
        assert answers[lost].code == 102 and "exhausted" in answers[lost].body["msg"], \
            answers[lost].stdout
        winner, loser = (claim_status(scene.kube, scene.namespace, claims[n])
                         for n in (won, lost))
        assert winner["ips"] == ips_of(answers[won].body) == ["10.61.0.2/32"]
        assert allocated(winner) == ("True", "SuccessfulAllocation", pods[won][0])
        assert loser["ips"] == []
        assert allocated(loser) == ("False", "SubnetExhausted", pods[lost][0])
        assert set(scene.files().claims().values()) == \
            {f"{scene.namespace}/{claims[won]}@{claim_uid(scene, claims[won])}"}, \
            "only the winner's claim owns a record"
        launchers[won].ok("DEL", with_prev(confs[won], answers[won].body))


def test_a_cluster_block_claimed_after_its_nodes_deletion_keeps_a_stopped_vms_address(
        scene: Scene, cluster: Any, pytestconfig: pytest.Config) -> None:
    """`scope: cluster`: the VM's Pod ran on node 1 and stopped (no Pod of it anywhere, so
    nothing is lent), then Node 1 was deleted and the garbage collector took its IPAMBlocks.
    Node 2 claims that block for a Pod asking for the neighbouring address: the claim's
    address stays the claim's there (another Pod asking for it gets 102 naming the claim) and
    the VM's next Pod, on node 2, gets it."""
    kube = scene.kube
    ipam = {**scene.conf["ipam"], "scope": "cluster", "address_families": ["IPv4"]}
    with node_objects(kube, 2, prefix="pip-node") as (first, second):
        scene.plugin.environ["VPC_ATTACH_NODE_NAME"] = first
        scene.conf = {**scene.conf, "ipam": {**ipam, "dataDir": str(scene.data_dir / first)}}
        claim = scene.claim()
        (address,) = ips_of(scene.attached_and_detached(scene.pod(claim), "ctr-vm-1"))
        ip = ipaddress.ip_interface(address).ip
        assert any(ip in ipaddress.ip_network(b["spec"]["cidr"]) for b in kube.list(
            IPAM_BLOCKS.path(), fields=f"spec.node={first}")), "node 1 holds its block"
        kube.delete(f"{NODES}/{first}")
        wait_until(f"IPAMBlocks of deleted Node {first} to be collected", lambda: not kube.list(
            IPAM_BLOCKS.path(), fields=f"spec.node={first}"), timeout=90)

        scene.plugin.environ["VPC_ATTACH_NODE_NAME"] = second
        on_second = {**scene.conf, "ipam": {**ipam, "dataDir": str(scene.data_dir / second)}}
        with temporary_netns("vpa-pip") as netns_a, temporary_netns("vpa-pip") as netns_b:
            neighbour = scene.launcher(scene.pod(None), "ctr-neighbour", netns_a)
            near = {**on_second, "vpcattachment": "62",
                    "runtimeConfig": {"ips": [str(ip + 1)]}}
            beside = neighbour.ok("ADD", near)
            (block,) = [b for b in kube.list(IPAM_BLOCKS.path(), fields=f"spec.node={second}")
                        if ip in ipaddress.ip_network(b["spec"]["cidr"])]
            intruder = scene.launcher(scene.pod(None), "ctr-intruder", netns_b)
            answer = intruder.add({**on_second, "vpcattachment": "63",
                                   "runtimeConfig": {"ips": [str(ip)]}})
            report(pytestconfig, "A Pod asking for a stopped VM's address on the node that "
                   "claimed its deleted holder's block", scene.data_dir / "refused.json",
                   {"block": block["spec"], "answer": answer.body})
            assert answer.code == 102, answer.stdout
            assert f"IPAMClaim {scene.namespace}/{claim} holds it" in answer.body["msg"]
            neighbour.ok("DEL", with_prev(near, beside))
        scene.conf = on_second
        again = scene.attached_and_detached(scene.pod(claim), "ctr-vm-2")
        assert ips_of(again) == [address], "the VM's next Pod, on node 2, gets its address"


def claim_uid(scene: Scene, claim: str) -> str:
    stored = scene.kube.get(claims_path(scene.namespace, claim))
    assert stored is not None
    return str(stored["metadata"]["uid"])


def test_allow_persistent_ips_with_host_local_is_code_7_saying_it_needs_vpc_attach_ipam(
        plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    conf = base_conf(vpc, "61", allowPersistentIPs=True,
                     ipam={"type": "host-local", "ranges": [[{"subnet": "fd00:61::/64"}]]})
    answer = plugin.call("ADD", conf, container_id="ctr-a", netns="/var/run/netns/none")
    assert answer.code == 7, answer.stdout
    assert answer.body["msg"] == "invalid config key 'allowPersistentIPs'"
    assert "kept by vpc-attach-ipam" in answer.body["details"]


def test_an_add_of_a_pod_without_a_claim_makes_the_requests_it_made_without_the_setting(
        scene: Scene, cluster: Any, pytestconfig: pytest.Config) -> None:
    """Seen by a proxy between the plugin and the API server, publishing on (the EndpointSlice
    step reads the Pod too): allowPersistentIPs with no claim reference reads the Pod once,
    for both steps (through the agent: from its Pod cache), and nothing else; a Pod with a
    claim adds the claim's GET, a LIST of the Pods that may name it (a live migration's other
    Pod; the proxy counts it as a GET of pods) and its status PUT (reported)."""
    proxied = start_proxy(cluster, scene.data_dir.parent)
    try:
        scene.plugin.environ["VPC_ATTACH_KUBECONFIG"] = str(proxied.kubeconfig)
        runs: dict[str, list[str]] = {}
        claim = scene.claim()
        cases = [("allowPersistentIPs false", False, None), ("no claim", True, None),
                 ("allowPersistentIPs false", False, None), ("no claim", True, None),
                 ("with a claim", True, claim)]
        for n, (case, setting, claimed) in enumerate(cases):
            conf = {**scene.conf, "allowPersistentIPs": setting,
                    "publish": {"bgp": False, "endpointSlice": True}}
            with temporary_netns("vpa-pip") as netns:
                launcher = scene.launcher(scene.pod(claimed), f"ctr-{n}", netns)
                mark = len(proxied.proxy.seen())
                result = launcher.ok("ADD", conf)
                wait_until("the proxy to record the ADD's requests",
                           lambda: proxied.proxy.in_flight() == 0, 10, interval=0.05)
                runs[case] = sorted(
                    f"{s.method} {s.resource}" for s in proxied.proxy.seen()[mark:]
                    if "watch=1" not in s.path and s.resource not in ("events", None))
                launcher.ok("DEL", with_prev(conf, result))
        # The second pair counts (the first warms an agent's caches).
        report(pytestconfig, "API requests of an ADD (allowPersistentIPs: false, true without "
               "a claim, with a claim)", scene.data_dir.parent / "requests.json",
               {case: {"count": len(seen), "requests": seen} for case, seen in runs.items()})
        assert runs["no claim"] == runs["allowPersistentIPs false"], runs
        assert "GET ipamclaims" not in runs["no claim"]
        assert sorted([*runs["no claim"], "GET ipamclaims", "GET pods", "PUT ipamclaims"]) == \
            runs["with a claim"], runs
    finally:
        proxied.stop()


def another_writer_fills_the_claim_first(scene: Scene, cluster: Any, claim: str,
                                         ips: list[str]) -> Answer:
    """An ADD of the claim's next Pod whose status write meets a claim that another writer
    (another node's vpc-attach, as the test writes it) gave other addresses just before: the
    proxy in front of the API server lets the test write them when the plugin's PUT comes."""
    path = claims_path(scene.namespace, claim)

    def write_first() -> None:
        stored = scene.kube.get(path)
        assert stored is not None
        stored["status"] = {"ips": ips, "ownerPod": {"name": "virt-launcher-elsewhere"}}
        scene.kube.request("PUT", path + "/status", stored)

    proxied = start_proxy(cluster, scene.data_dir.parent)
    try:
        scene.plugin.environ["VPC_ATTACH_KUBECONFIG"] = str(proxied.kubeconfig)
        proxied.proxy.add(Rule(Fault.FORWARD, method="PUT", resource="ipamclaims",
                               hook=write_first))
        with temporary_netns("vpa-pip") as netns:
            return scene.launcher(scene.pod(claim), "ctr-late", netns).add(scene.conf)
    finally:
        proxied.stop()


def test_a_claim_another_writer_filled_first_rolls_back_a_fresh_reserve_with_code_11(
        scene: Scene, cluster: Any) -> None:
    claim = scene.claim()
    answer = another_writer_fills_the_claim_first(scene, cluster, claim,
                                                  ["10.61.0.50/32", "fd00:61::50:0:0/96"])
    assert answer.code == 11, answer.stdout
    assert f"IPAMClaim {scene.namespace}/{claim} already holds 10.61.0.50/32, " \
        "fd00:61::50:0:0/96, recorded by another writer first" in answer.body["msg"]
    assert scene.files().records == {}, "the ADD's own reserve was freed"
    assert claim_status(scene.kube, scene.namespace, claim)["ips"] == \
        ["10.61.0.50/32", "fd00:61::50:0:0/96"]


def test_a_claim_another_writer_changed_meanwhile_gives_an_adopted_record_back_as_it_was(
        scene: Scene, cluster: Any) -> None:
    claim = scene.claim()
    scene.attached_and_detached(scene.pod(claim), "ctr-first")
    before = scene.files()
    answer = another_writer_fills_the_claim_first(scene, cluster, claim, ["10.61.0.50/32"])
    assert answer.code == 11, answer.stdout
    after = scene.files()
    assert after.bodies == before.bodies and after.index == before.index


def test_status_with_allow_persistent_ips_passes_with_the_packaged_role(scene: Scene) -> None:
    scene.plugin.ok("STATUS", scene.conf)


@pytest.mark.parametrize(("dropped", "missing"), [
    ("ipamclaims", "get ipamclaims.k8s.cni.cncf.io"),
    ("ipamclaims:list", "list ipamclaims.k8s.cni.cncf.io"),
    ("ipamclaims/status", "update ipamclaims/status.k8s.cni.cncf.io")])
def test_status_is_code_50_naming_an_ipamclaim_permission_the_plugin_lacks(
        scene: Scene, cluster: Any, dropped: str, missing: str) -> None:
    with identity_without(scene.kube, cluster, scene.data_dir.parent,
                          {("k8s.cni.cncf.io", dropped)}) as kubeconfig:
        scene.plugin.environ["VPC_ATTACH_KUBECONFIG"] = str(kubeconfig)
        answer = scene.plugin.call("STATUS", scene.conf)
    assert answer.code == 50, answer.stdout
    assert answer.body["msg"] == f"missing RBAC permission: {missing}"
