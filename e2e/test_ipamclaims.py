"""IPAMClaims on the real control plane with the real CRD (SPEC §16): claims made as kubevirt's
ipam-extensions makes them, found from the Pod's network-selection element, read with the
plugin's own client and identity, their status written through `/status` as OVN-Kubernetes
writes it; a writer that lost the race never overwrites the addresses, a claim for another
network is refused, and the plugin's identity can change nothing of a claim but its status.
Everything is checked with the official client, as admin or with the plugin's token."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import KubeClient
from cni_plugin.kube.config import load_kubeconfig
from cni_plugin.kube.kinds import IPAMCLAIMS, PODS
from cni_plugin.kube.networks import NetworkName
from cni_plugin.kubevirt.api import (
    ClaimHoldsOtherAddresses,
    api_read_ipamclaim,
    api_write_ipamclaim_status,
)
from cni_plugin.kubevirt.claim import Allocated, AllocationFailed, IPAMClaim
from cni_plugin.kubevirt.selection import ClaimReference, find_claim_reference
from e2e.harness.cluster import Cluster
from e2e.harness.ipamclaims import CRD_NAME, ipamclaim_crd
from e2e.harness.kube import ApiError, Kube
from e2e.harness.kubevirt.standins import (
    KUBEVIRT_FINALIZER,
    KUBEVIRT_VM_LABEL,
    claims_namespace,
    kubevirt_claim,
    kubevirt_claim_name,
    kubevirt_creates_claim,
    launcher_pod,
)
from netconf.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError

pytestmark = pytest.mark.cluster
NETWORK_CONFIG = "vpc60"  # the network config's `name` the NAD carries
NAD = "vpc60"
INTERFACE = "pod16367aacb67"  # the hashed name virt-controller asks Multus for
LAUNCHER = "virt-launcher-vm-a-x7k2p"
DEADLINE_S = 10.0
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@dataclass
class Recorded:
    """The plugin's API client and what it exchanged with the API server: (method, status)."""

    client: KubeClient
    exchanges: list[tuple[str, str]]


@pytest.fixture
def plugin_client(cluster: Cluster) -> Iterator[Recorded]:
    """The plugin's own API client with the plugin's identity, its requests recorded."""
    exchanges: list[tuple[str, str]] = []
    client = KubeClient(load_kubeconfig(str(cluster.plugin_kubeconfig)),
                        observe=lambda method, code, _: exchanges.append((method, code)))
    yield Recorded(client, exchanges)
    client.close()


@pytest.fixture
def vm_namespace(kube: Kube) -> Iterator[str]:
    """A namespace of the test's own, its claims' finalizers dropped at the end."""
    with claims_namespace(kube) as name:
        yield name


def launcher_asking_for_its_interface(kube: Kube, namespace: str,
                                      claim: str) -> dict[str, Any]:
    """The virt-launcher Pod whose network-selection element asks Multus for the interface name
    virt-controller hashes, with ipam-extensions' claim reference (no kubelet runs it)."""
    return kube.create(PODS.path(namespace),
                       launcher_pod(LAUNCHER, namespace, "nowhere", "vm-a", claim, nad=NAD,
                                    interface=INTERFACE))


def read_claim(plugin: Recorded, reference: ClaimReference,
               network: str = NETWORK_CONFIG) -> IPAMClaim:
    return api_read_ipamclaim(plugin.client, reference, network=network,
                              deadline=Deadline(DEADLINE_S))


def test_the_control_plane_serves_the_ipamclaims_modules_own_crd(kube: Kube) -> None:
    served = kube.get(f"{CRDS}/{CRD_NAME}")
    shipped = ipamclaim_crd()
    assert served is not None
    for key in ("group", "names", "scope"):
        assert served["spec"][key] == shipped["spec"][key], key
    [version] = served["spec"]["versions"]
    assert version == shipped["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}


def test_the_pods_element_leads_to_the_claim_kubevirt_made_and_the_plugin_reads_it(
        kube: Kube, vm_namespace: str, plugin_client: Recorded) -> None:
    made = kubevirt_creates_claim(kube, vm_namespace, NETWORK_CONFIG)
    assert made["metadata"]["name"] == kubevirt_claim_name("vm-a", "blue") == "vm-a.blue"
    launcher_asking_for_its_interface(kube, vm_namespace, "vm-a.blue")
    pod = plugin_client.client.get(PODS, LAUNCHER, namespace=vm_namespace,
                                   deadline=Deadline(DEADLINE_S))
    assert pod is not None
    reference = find_claim_reference(pod, network=NetworkName(vm_namespace, NAD),
                                     interface=INTERFACE)
    assert reference == ClaimReference(vm_namespace, "vm-a.blue")
    claim = read_claim(plugin_client, reference)
    assert (claim.network, claim.interface, claim.ips, claim.owner_pod, claim.deleting) == (
        NETWORK_CONFIG, "", (), None, False)
    assert claim.uid == made["metadata"]["uid"]


def test_the_first_allocation_is_written_through_status_as_ovn_kubernetes_writes_it(
        kube: Kube, vm_namespace: str, plugin_client: Recorded) -> None:
    made = kubevirt_creates_claim(kube, vm_namespace, NETWORK_CONFIG)
    claim = read_claim(plugin_client, ClaimReference(vm_namespace, "vm-a.blue"))
    plugin_client.exchanges.clear()
    api_write_ipamclaim_status(plugin_client.client, claim,
                               Allocated(("10.60.0.5/24", "fd00:60::5/64")), pod=LAUNCHER,
                               deadline=Deadline(DEADLINE_S))
    assert plugin_client.exchanges == [("PUT", "200")], "one write, from the claim as read"
    stored = kube.get(IPAMCLAIMS.path(vm_namespace, "vm-a.blue"))
    assert stored is not None
    status = stored["status"]
    assert status["ips"] == ["10.60.0.5/24", "fd00:60::5/64"]
    assert status["ownerPod"] == {"name": LAUNCHER}
    [condition] = status["conditions"]
    assert {k: condition[k] for k in ("type", "status", "reason", "message")} == {
        "type": "IPsAllocated", "status": "True", "reason": "SuccessfulAllocation",
        "message": "IP addresses successfully allocated"}
    assert condition["observedGeneration"] == stored["metadata"]["generation"]
    assert condition["lastTransitionTime"].endswith("Z")
    for kept in ("finalizers", "labels", "ownerReferences"):
        assert stored["metadata"][kept] == made["metadata"][kept], kept
    assert stored["metadata"]["finalizers"] == [KUBEVIRT_FINALIZER]
    assert stored["metadata"]["labels"] == {KUBEVIRT_VM_LABEL: "vm-a"}
    assert stored["spec"] == made["spec"]


def stale_after_another_writer(plugin: Recorded, namespace: str) -> IPAMClaim:
    """Two ADDs read the fresh claim and the first records 10.60.0.5/24: the second's read,
    stale now (the recorder starts empty after)."""
    reference = ClaimReference(namespace, "vm-a.blue")
    first, second = read_claim(plugin, reference), read_claim(plugin, reference)
    api_write_ipamclaim_status(plugin.client, first, Allocated(("10.60.0.5/24",)), pod=LAUNCHER,
                               deadline=Deadline(DEADLINE_S))
    plugin.exchanges.clear()
    return second


def test_a_writer_that_read_before_another_wrote_rereads_and_never_overwrites_its_ips(
        kube: Kube, vm_namespace: str, plugin_client: Recorded) -> None:
    kubevirt_creates_claim(kube, vm_namespace, NETWORK_CONFIG)
    second = stale_after_another_writer(plugin_client, vm_namespace)
    with pytest.raises(ClaimHoldsOtherAddresses) as caught:
        api_write_ipamclaim_status(plugin_client.client, second, Allocated(("10.60.0.9/24",)),
                                   pod="virt-launcher-vm-a-9q8wz", deadline=Deadline(DEADLINE_S))
    assert plugin_client.exchanges == [("PUT", "409"), ("GET", "200")]
    assert caught.value.code == TRY_AGAIN_LATER
    assert caught.value.msg == (f"IPAMClaim {vm_namespace}/vm-a.blue already holds "
                                "10.60.0.5/24, recorded by another writer first; not "
                                "overwritten with 10.60.0.9/24")
    stored = kube.get(IPAMCLAIMS.path(vm_namespace, "vm-a.blue"))
    assert stored is not None
    assert stored["status"]["ips"] == ["10.60.0.5/24"]
    assert stored["status"]["ownerPod"] == {"name": LAUNCHER}


def test_a_writer_that_lost_the_race_with_the_same_addresses_records_its_pod_only(
        kube: Kube, vm_namespace: str, plugin_client: Recorded) -> None:
    kubevirt_creates_claim(kube, vm_namespace, NETWORK_CONFIG)
    second = stale_after_another_writer(plugin_client, vm_namespace)
    stored = api_write_ipamclaim_status(
        plugin_client.client, second, Allocated(("10.60.0.5/24",)),
        pod="virt-launcher-vm-a-9q8wz", deadline=Deadline(DEADLINE_S))
    assert plugin_client.exchanges == [("PUT", "409"), ("GET", "200"), ("PUT", "200")]
    assert (stored.ips, stored.owner_pod) == (("10.60.0.5/24",), "virt-launcher-vm-a-9q8wz")


def test_a_failed_first_allocation_leaves_ips_empty_and_ips_allocated_false(
        kube: Kube, vm_namespace: str, plugin_client: Recorded) -> None:
    kubevirt_creates_claim(kube, vm_namespace, NETWORK_CONFIG)
    claim = read_claim(plugin_client, ClaimReference(vm_namespace, "vm-a.blue"))
    api_write_ipamclaim_status(plugin_client.client, claim,
                               AllocationFailed("SubnetExhausted", "pool vpc60 is full"),
                               pod=LAUNCHER, deadline=Deadline(DEADLINE_S))
    stored = kube.get(IPAMCLAIMS.path(vm_namespace, "vm-a.blue"))
    assert stored is not None
    assert stored["status"]["ips"] == []
    [condition] = stored["status"]["conditions"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False", "SubnetExhausted", "pool vpc60 is full")


def test_a_claim_for_another_network_is_refused_naming_both(
        kube: Kube, vm_namespace: str, plugin_client: Recorded) -> None:
    kubevirt_creates_claim(kube, vm_namespace, "vpc70")
    with pytest.raises(CniError) as caught:
        read_claim(plugin_client, ClaimReference(vm_namespace, "vm-a.blue"))
    assert caught.value.code == INVALID_CONFIG
    assert str(caught.value) == (f"IPAMClaim {vm_namespace}/vm-a.blue is for network "
                                 "'vpc70', not this network config's 'vpc60'")


def test_a_claim_not_there_yet_is_code_11_naming_it(
        vm_namespace: str, plugin_client: Recorded) -> None:
    with pytest.raises(CniError) as caught:
        read_claim(plugin_client, ClaimReference(vm_namespace, "vm-b.blue"))
    assert caught.value.code == TRY_AGAIN_LATER
    assert str(caught.value) == f"IPAMClaim {vm_namespace}/vm-b.blue not found"


def test_the_plugins_identity_can_write_a_claims_status_and_nothing_else_of_it(
        kube: Kube, cluster: Cluster, vm_namespace: str) -> None:
    made = kubevirt_creates_claim(kube, vm_namespace, NETWORK_CONFIG)
    path = IPAMCLAIMS.path(vm_namespace, "vm-a.blue")
    status = {"ips": ["10.60.0.5/24"], "ownerPod": {"name": LAUNCHER}}
    with Kube.with_token(cluster.server, cluster.ca_file, cluster.plugin_token) as plugin:
        written = plugin.put(f"{path}/status", {**made, "status": status})
        assert written["status"]["ips"] == ["10.60.0.5/24"]
        unfinalized = {**written, "metadata": {**written["metadata"], "finalizers": []}}
        attempts: dict[str, Callable[[], Any]] = {
            "update the claim": lambda: plugin.put(path, unfinalized),
            "patch its status": lambda: plugin.request(
                "PATCH", f"{path}/status", {"status": {"ips": []}},
                content_type="application/merge-patch+json"),
            "delete it": lambda: plugin.request("DELETE", path),
            "create one": lambda: plugin.create(IPAMCLAIMS.path(vm_namespace), kubevirt_claim(
                vm_namespace, "vm-c", "uid-c", "blue", NETWORK_CONFIG)),
        }
        refused = {}
        for what, attempt in attempts.items():
            with pytest.raises(ApiError) as caught:
                attempt()
            refused[what] = caught.value.status
    assert refused == dict.fromkeys(attempts, 403)
    stored = kube.get(path)
    assert stored is not None
    assert stored["metadata"]["finalizers"] == [KUBEVIRT_FINALIZER]
    assert stored["status"]["ips"] == ["10.60.0.5/24"]
