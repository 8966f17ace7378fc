"""The IPAMClaim CRD as its Go module ships it, and claims made as kubevirt's ipam-extensions
makes them, and a VM network's Pods as kubevirt's webhook leaves them, attached through the
plugin (`Scene`) (SPEC §16).

The CRD is `artifacts/k8s.cni.cncf.io_ipamclaims.yaml` of the Go module
github.com/k8snetworkplumbingwg/ipamclaims, fetched from the Go module proxy by `go mod
download` into Go's module cache, as the CRI API's proto is (`e2e/harness/cri/protos.py`); the
module's checksum is pinned here and compared with the one go checked against the checksum
database. vpc-attach does not ship the CRD (packaging/): whoever runs KubeVirt's persistent IPs
installs it. Every control plane `e2e.harness.cluster` starts has it.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.ipam_files import IpamFiles
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import Answer, Plugin, base_conf, with_prev
from e2e.harness.publishing import Node, make_node
from e2e.harness.tenancy import namespace as fresh_namespace
from e2e.harness.tools.gotools import go_binary, go_env

MODULE = "github.com/k8snetworkplumbingwg/ipamclaims"
# The version OVN-Kubernetes requires; the proxy here serves it (not @latest).
VERSION = "v0.5.1-alpha"
MODULE_SUM = "h1:RPXmPp07hm6l2/a3PSInne+6VnZeSapcFeegpDNklCs="  # `go mod download -json`'s Sum
CRD_IN_MODULE = "artifacts/k8s.cni.cncf.io_ipamclaims.yaml"
CRD_NAME = "ipamclaims.k8s.cni.cncf.io"
DOWNLOAD_TIMEOUT_S = 300.0
# What kubevirt/ipam-extensions puts on the claims it makes (pkg/claims, vmi_controller.go).
KUBEVIRT_FINALIZER = "kubevirt.io/persistent-ipam"
KUBEVIRT_VM_LABEL = "kubevirt.io/vm"
_CLAIM_NAME_PART = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CLAIM_NAME_MAX = 253


class ModuleError(RuntimeError):
    """The module could not be fetched, or is not the one pinned here."""


@functools.cache
def module_dir() -> Path:
    """The module's directory in Go's module cache (downloaded if missing; offline after)."""
    with tempfile.TemporaryDirectory(prefix="vpa-ipamclaims-") as scratch:
        command = [go_binary(), "mod", "download", "-json", f"{MODULE}@{VERSION}"]
        try:
            done = subprocess.run(command, cwd=scratch, env=go_env(Path(scratch)),
                                  capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModuleError(f"{' '.join(command)}: {exc}") from None
    try:
        info: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        raise ModuleError(f"{' '.join(command)}: exit status {done.returncode}: "
                          f"{done.stderr.strip()}") from None
    if info.get("Error"):
        raise ModuleError(f"{' '.join(command)}: {info['Error']}")
    if info.get("Sum") != MODULE_SUM:
        raise ModuleError(f"{MODULE}@{VERSION}: checksum {info.get('Sum')}, pinned {MODULE_SUM}")
    return Path(info["Dir"])


def ipamclaim_crd() -> dict[str, Any]:
    """The module's IPAMClaim CustomResourceDefinition, as it ships it."""
    crd: dict[str, Any] = yaml.safe_load((module_dir() / CRD_IN_MODULE).read_text())
    return crd


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


def claims_path(namespace: str, name: str = "") -> str:
    """The API path of a namespace's IPAMClaims (or one of them)."""
    path = f"/apis/k8s.cni.cncf.io/v1alpha1/namespaces/{namespace}/ipamclaims"
    return f"{path}/{name}" if name else path


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


NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
IFNAME = "net1"  # Multus's name for the first element that asks for no interface
VM = "vm-a"


def kubevirt_creates_claim(kube: Kube, namespace: str, network_config: str,
                           vm: str = VM) -> str:
    """What ipam-extensions' VMI controller does for a VM network whose config allows
    persistent IPs; the claim's name."""
    made = kube.create(claims_path(namespace),
                       kubevirt_claim(namespace, vm, f"uid-{secrets.token_hex(4)}", "blue",
                                      network_config))
    return str(made["metadata"]["name"])


def launcher_pod_as_kubevirts_webhook_left_it(kube: Kube, namespace: str, node: Node,
                                              claim: str | None) -> tuple[str, str]:
    """A virt-launcher Pod on node whose network-selection element (no interface asked for:
    Multus names it net1) carries ipam-extensions' claim reference; (name, uid)."""
    name = f"virt-launcher-{VM}-{secrets.token_hex(3)}"
    pod = kube.create(f"/api/v1/namespaces/{namespace}/pods",
                      launcher_pod(name, namespace, node.name, claim))
    return name, str(pod["metadata"]["uid"])


def launcher_pod(name: str, namespace: str, node: str, claim: str | None) -> dict[str, Any]:
    """A virt-launcher Pod object as kubevirt's webhook leaves it: one network-selection
    element (no interface asked for: Multus names it net1), with ipam-extensions' claim
    reference when claim is given."""
    element: dict[str, Any] = {"name": "blue-nad", "namespace": namespace}
    if claim is not None:
        element["ipam-claim-reference"] = claim
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name,
                         "annotations": {NETWORKS_ANNOTATION: json.dumps([element])}},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "compute", "image": "registry.invalid/virt:1"}]}}


# What virt-controller puts on a VM's virt-launcher Pods and, once the target node's domain is
# ready during a live migration, on the target Pod (pkg/virt-controller/watch/migration: a JSON
# patch `add` of the annotation, its value the VMI's TargetNodeDomainReadyTimestamp).
KUBEVIRT_VM_NAME_LABEL = "vm.kubevirt.io/name"
MIGRATION_TARGET_READY = "kubevirt.io/migration-target-ready-timestamp"


def virt_launcher_pod(kube: Kube, namespace: str, node: str, claim: str,
                      vm: str) -> tuple[str, str]:
    """A virt-launcher Pod of `vm` on node, as virt-controller makes it (the VM's label) and
    kubevirt's webhook leaves it (the claim reference in its only network-selection element,
    net1); (name, uid)."""
    element = {"name": "blue-nad", "namespace": namespace, "ipam-claim-reference": claim}
    name = f"virt-launcher-{vm}-{secrets.token_hex(3)}"
    pod = kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {KUBEVIRT_VM_NAME_LABEL: vm},
                     "annotations": {NETWORKS_ANNOTATION: json.dumps([element])}},
        "spec": {"nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "compute", "image": "registry.invalid/virt:1"}]}})
    return name, str(pod["metadata"]["uid"])


def kubevirt_marks_target_ready(kube: Kube, namespace: str, pod: str, timestamp: str) -> None:
    """What virt-controller does when the migration target's domain is ready: the ready
    timestamp added to the target Pod's annotations (virt-controller sends a JSON patch `add`;
    this merge patch has the same effect and the harness's client sends objects)."""
    kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}",
                 {"metadata": {"annotations": {MIGRATION_TARGET_READY: timestamp}}},
                 content_type="application/merge-patch+json")


def pod_completed(kube: Kube, namespace: str, pod: str) -> None:
    """What kubelet reports once a Pod's containers exited for good: phase Succeeded."""
    kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
                 {"status": {"phase": "Succeeded"}},
                 content_type="application/merge-patch+json")


def kubevirt_deletes_claim(kube: Kube, namespace: str, claim: str) -> str:
    """The VM is gone: ipam-extensions drops its finalizer and the claim is deleted; the uid
    it had."""
    path = claims_path(namespace, claim)
    found = kube.get(path)
    assert found is not None
    kube.request("PATCH", path, {"metadata": {"finalizers": None}},
                 content_type="application/merge-patch+json")
    kube.delete(path)
    return str(found["metadata"]["uid"])


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

    def claim(self, network_config: str | None = None, vm: str = VM) -> str:
        return kubevirt_creates_claim(self.kube, self.namespace,
                                      network_config or self.conf["name"], vm)

    def pod(self, claim: str | None) -> tuple[str, str]:
        return launcher_pod_as_kubevirts_webhook_left_it(self.kube, self.namespace, self.node,
                                                         claim)

    def launcher(self, pod: tuple[str, str], container: str, netns: str) -> Launcher:
        return Launcher(self.plugin, self.node, self.namespace, pod, container, netns)

    def attached_and_detached(self, pod: tuple[str, str], container: str) -> dict[str, Any]:
        """ADD then DEL of the Pod's container in a netns of its own, and the Pod completed
        (its VM stopped: the phase kubelet gives a virt-launcher Pod that exited, so it holds
        the claim no more); the ADD's result."""
        with temporary_netns("vpa-pip") as netns:
            launcher = self.launcher(pod, container, netns)
            result: dict[str, Any] = launcher.ok("ADD", self.conf)
            launcher.ok("DEL", with_prev(self.conf, result))
        pod_completed(self.kube, self.namespace, pod[0])
        return result

    def files(self) -> IpamFiles:
        return IpamFiles.read(self.data_dir)


def vm_network(vpc: str, data_dir: Path, **extra: Any) -> dict[str, Any]:
    """A tap-less VM network stanza (veth, publishing off) with allowPersistentIPs and
    vpc-attach-ipam pools in data_dir; `ipam` in extra adds to the pools' keys."""
    ipam = {"type": "vpc-attach-ipam", "dataDir": str(data_dir),
            "ipv6_subnet": "fd00:61::/64", "ipv4_subnet": "10.61.0.0/24"}
    ipam.update(extra.pop("ipam", {}))
    return base_conf(vpc, "61", name=f"vms-{vpc}", allowPersistentIPs=True, ipam=ipam,
                     capabilities={"ips": True}, **extra)


@contextmanager
def vm_scene(kube: Kube, cluster: Any, plugin: Plugin, vpc: str,
             directory: Path) -> Iterator[Scene]:
    """A node, a namespace of its own and a VM network; the node's ipamDataRoot is directory
    (so its notes of claims are the test's own)."""
    plugin.environ["VPC_ATTACH_IPAM_DATA_ROOT"] = str(directory)
    node = make_node(kube, cluster, plugin)
    with claims_namespace(kube) as namespace:
        yield Scene(kube, plugin, node, namespace, vm_network(vpc, directory / "ipam"),
                    directory / "ipam")
