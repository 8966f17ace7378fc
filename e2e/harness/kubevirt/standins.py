"""What KubeVirt's components (and kubelet, for a virt-launcher Pod that exited) write, written
on their behalf: KubeVirt does not run here (SPEC §16).

- ipam-extensions' VMI controller: an IPAMClaim per VM network whose config allows persistent
  IPs (`kubevirt_creates_claim`), its finalizer dropped and the claim deleted once the VM is
  gone (`kubevirt_deletes_claim`, `claims_namespace`'s cleanup);
- virt-controller and ipam-extensions' webhook: a virt-launcher Pod carrying its VM's label and
  one network-selection element with the claim reference (`kubevirt_starts_launcher`), the
  ready timestamp on a live migration's target Pod (`kubevirt_marks_target_ready`);
- kubelet: phase Succeeded once a virt-launcher Pod's containers exited
  (`kubelet_reports_succeeded`; `e2e/test_node_kubevirt.py` shows a real kubelet's report has
  the same effect).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cni_plugin.kube.kinds import PODS
from e2e.harness.ipamclaims import claims_path
from e2e.harness.kube import Kube
from e2e.harness.tenancy import namespace as fresh_namespace

# What kubevirt/ipam-extensions puts on the claims it makes (pkg/claims, vmi_controller.go).
KUBEVIRT_FINALIZER = "kubevirt.io/persistent-ipam"
KUBEVIRT_VM_LABEL = "kubevirt.io/vm"
# What virt-controller puts on a VM's virt-launcher Pods and, once the target node's domain is
# ready during a live migration, on the target Pod (pkg/virt-controller/watch/migration: a JSON
# patch `add` of the annotation, its value the VMI's TargetNodeDomainReadyTimestamp).
KUBEVIRT_VM_NAME_LABEL = "vm.kubevirt.io/name"
KUBEVIRT_DOMAIN_ANNOTATION = "kubevirt.io/domain"
MIGRATION_TARGET_READY = "kubevirt.io/migration-target-ready-timestamp"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
IFNAME = "net1"  # Multus's name for the first element that asks for no interface
VM = "vm-a"
NAD = "blue-nad"
_CLAIM_NAME_PART = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CLAIM_NAME_MAX = 253


def kubevirt_claim_name(vm: str, network: str) -> str:
    """`<vm>.<network>` as ipam-extensions' `claims.ComposeKey` makes it: lower case, the
    DNS-label runs joined by dots, at most 253 characters."""
    runs = [match.group(0) for match in _CLAIM_NAME_PART.finditer(f"{vm}.{network}".lower())]
    return ".".join(runs)[:_CLAIM_NAME_MAX]


def kubevirt_claim(namespace: str, vm: str, vm_uid: str, network: str,
                   network_config: str) -> dict[str, Any]:
    """The IPAMClaim ipam-extensions' VMI controller creates for a VM network whose network
    config allows persistent IPs: owned by the VM, its finalizer, the VM label, `spec.network`
    the config's `name` and `spec.interface` empty (its Go struct writes the empty string)."""
    return {
        "apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
        "metadata": {
            "name": kubevirt_claim_name(vm, network), "namespace": namespace,
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                 "name": vm, "uid": vm_uid, "controller": True,
                                 "blockOwnerDeletion": True}],
            "finalizers": [KUBEVIRT_FINALIZER],
            "labels": {KUBEVIRT_VM_LABEL: vm},
        },
        "spec": {"network": network_config, "interface": ""},
    }


def kubevirt_creates_claim(kube: Kube, namespace: str, network_config: str, vm: str = VM,
                           network: str = "blue") -> dict[str, Any]:
    """What ipam-extensions' VMI controller does for a VM network whose config allows
    persistent IPs (the VM exists only as the owner reference); the claim as created."""
    return kube.create(claims_path(namespace),
                       kubevirt_claim(namespace, vm, f"uid-{secrets.token_hex(4)}", network,
                                      network_config))


def vm_of_claim(kube: Kube, namespace: str, claim: str | None) -> str:
    """The VM a claim belongs to (its `kubevirt.io/vm` label); `VM` for no or an unknown claim."""
    found = kube.get(claims_path(namespace, claim)) if claim else None
    return str(((found or {}).get("metadata", {}).get("labels") or {})
               .get(KUBEVIRT_VM_LABEL, VM))


def launcher_pod(name: str, namespace: str, node: str, vm: str, claim: str | None, *,
                 nad: str = NAD, interface: str | None = None) -> dict[str, Any]:
    """A virt-launcher Pod object as virt-controller makes it (its VM's label and domain) and
    kubevirt's webhook leaves it: one network-selection element (Multus names it net1 unless
    it asks for ``interface``), with ipam-extensions' claim reference when claim is given."""
    element: dict[str, Any] = {"name": nad, "namespace": namespace}
    if interface is not None:
        element["interface"] = interface
    if claim is not None:
        element["ipam-claim-reference"] = claim
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {KUBEVIRT_VM_NAME_LABEL: vm},
                         "annotations": {NETWORKS_ANNOTATION: json.dumps([element]),
                                         KUBEVIRT_DOMAIN_ANNOTATION: vm}},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "compute", "image": "registry.invalid/virt:1"}]}}


def kubevirt_starts_launcher(kube: Kube, namespace: str, node: str, claim: str | None,
                             vm: str | None = None, **element: Any) -> tuple[str, str]:
    """A virt-launcher Pod of ``vm`` (by default the claim's VM) on node, no kubelet running
    it; (name, uid). ``element``: `launcher_pod`'s element options."""
    vm = vm or vm_of_claim(kube, namespace, claim)
    name = f"virt-launcher-{vm}-{secrets.token_hex(3)}"
    pod = kube.create(PODS.path(namespace),
                      launcher_pod(name, namespace, node, vm, claim, **element))
    return name, str(pod["metadata"]["uid"])


def ready_timestamp() -> str:
    """Now, as virt-controller writes the VMI's TargetNodeDomainReadyTimestamp."""
    return time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime())


def kubevirt_marks_target_ready(kube: Kube, namespace: str, pod: str,
                                timestamp: str | None = None) -> None:
    """What virt-controller does when the migration target's domain is ready: the ready
    timestamp (now, by default) added to the target Pod's annotations (virt-controller sends a
    JSON patch `add`; this merge patch has the same effect and the harness's client sends
    objects)."""
    kube.request("PATCH", PODS.path(namespace, pod),
                 {"metadata": {"annotations": {
                     MIGRATION_TARGET_READY: timestamp or ready_timestamp()}}},
                 content_type="application/merge-patch+json")


def kubelet_reports_succeeded(kube: Kube, namespace: str, pod: str) -> None:
    """What kubelet reports once a Pod's containers exited for good (restartPolicy Never, exit
    0): phase Succeeded, through the Pod's status subresource."""
    kube.request("PATCH", f"{PODS.path(namespace, pod)}/status",
                 {"status": {"phase": "Succeeded"}},
                 content_type="application/merge-patch+json")


def kubevirt_deletes_claim(kube: Kube, namespace: str, claim: str) -> str:
    """The VM is gone: ipam-extensions drops its finalizer and the claim is deleted; the uid
    it had."""
    path = claims_path(namespace, claim)
    found = kube.get(path)
    assert found is not None, f"no IPAMClaim {namespace}/{claim} to delete"
    kube.request("PATCH", path, {"metadata": {"finalizers": None}},
                 content_type="application/merge-patch+json")
    kube.delete(path)
    return str(found["metadata"]["uid"])


@contextmanager
def claims_namespace(kube: Kube) -> Iterator[str]:
    """A namespace of the test's own; the claims in it lose kubevirt's finalizer first (as
    ipam-extensions' cleanup does once the VM is gone), so the namespace can go."""
    with fresh_namespace(kube) as name:
        yield name
        for claim in kube.list(claims_path(name)):
            kube.request("PATCH", claims_path(name, claim["metadata"]["name"]),
                         {"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")
