"""Helpers for publishing e2e tests: routers, Pods and the plugin configured for a node."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cni_plugin.core import naming
from cni_plugin.kube.kinds import PODS
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    ENDPOINT_SLICES,
    GROUP,
    ROUTERS,
    VERSION,
    VRF_INSTANCES,
)
from e2e.harness.kube import ApiError, Kube
from e2e.harness.plugin import Plugin
from e2e.harness.wait import wait_until

BGP_NS = "galactic-system"


def create_router(kube: Kube, node: str, asn: int = 65000, locator: str | None = None,
                  node_id: int | None = None, router_id: str = "192.0.2.1") -> str:
    """A BGPRouter targeting node; returns its name."""
    spec: dict[str, Any] = {"targetRef": {"kind": "Node", "name": node}, "localASN": asn,
                            "routerID": router_id, "roles": ["tenant"],
                            "addressFamilies": [{"afi": "l2vpn", "safi": "evpn"}]}
    if locator:
        spec["srv6Locator"] = locator
    if node_id:
        spec["nodeID"] = node_id
    name = f"router-{node}"
    kube.create(ROUTERS.path(BGP_NS), {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPRouter",
                                       "metadata": {"name": name}, "spec": spec})
    return name


def create_pod(kube: Kube, name: str, node: str, namespace: str = "default") -> str:
    """A Pod object (no kubelet runs it); returns its uid."""
    pod = kube.create(PODS.path(namespace), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "main", "image": "registry.invalid/pause:1"}]}})
    return str(pod["metadata"]["uid"])


def delete_pod(kube: Kube, name: str, namespace: str = "default") -> None:
    """Delete a Pod object and wait until it is gone."""
    kube.delete(PODS.path(namespace, name), grace_period_seconds=0)
    wait_until(f"pod {name} deleted", lambda: kube.get(PODS.path(namespace, name)) is None)


def advertisement(kube: Kube, name: str) -> dict[str, Any] | None:
    """A BGPAdvertisement by name."""
    return kube.get(ADVERTISEMENTS.path(BGP_NS, name))


def advertisements_of(kube: Kube, vpc: str, att: str) -> dict[str, dict[str, Any]]:
    """Every BGPAdvertisement of (vpc, att) by name: each node's, and a shared one earlier
    versions wrote."""
    shared = naming.shared_advertisement_name(vpc, att)
    return {item["metadata"]["name"]: item for item in kube.list(ADVERTISEMENTS.path(BGP_NS))
            if item["metadata"]["name"] == shared
            or item["metadata"]["name"].startswith(shared + "-")}


def vrf_instance(kube: Kube, name: str) -> dict[str, Any] | None:
    """A BGPVRFInstance by name."""
    return kube.get(VRF_INSTANCES.path(BGP_NS, name))


def endpoint_slice(kube: Kube, name: str, namespace: str = "default") -> dict[str, Any] | None:
    """An EndpointSlice by name."""
    return kube.get(ENDPOINT_SLICES.path(namespace, name))


@dataclass
class Node:
    """A simulated node: its name, router, and the plugin configured for it."""

    name: str
    router: str
    plugin: Plugin

    def cni_args(self, pod: str, uid: str | None = None, namespace: str = "default") -> str:
        """CNI_ARGS as containerd sends them."""
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};" \
               f"K8S_POD_INFRA_CONTAINER_ID=sandbox-{pod}"
        return args + (f";K8S_POD_UID={uid}" if uid else "")


def make_node(kube: Kube, cluster: Any, plugin: Plugin, **router: Any) -> Node:
    """A fresh node name with its BGPRouter, and the plugin pointed at the cluster for it."""
    name = f"worker-{secrets.token_hex(3)}"
    router_name = create_router(kube, name, **router)
    plugin.environ.update({"VPC_ATTACH_NODE_NAME": name,
                           "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig)})
    return Node(name, router_name, plugin)


def deny_writes(kube: Kube, name: str, resource: str, group: str, operations: list[str],
                name_prefix: str) -> Callable[[], None]:
    """A ValidatingAdmissionPolicy (+ binding) refusing `operations` on objects of `resource`
    whose name starts with name_prefix; returns the function that removes it again.

    Waits until the API server enforces it (probed with server-side dry-run creates)."""
    admission = "/apis/admissionregistration.k8s.io/v1"
    kube.create(f"{admission}/validatingadmissionpolicies", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [group], "apiVersions": ["*"], "resources": [resource],
                "operations": operations}]},
            "validations": [{"expression": f"!object.metadata.name.startsWith('{name_prefix}')",
                             "message": f"denied by test policy {name}"}],
        }})
    kube.create(f"{admission}/validatingadmissionpolicybindings", {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}})

    def remove() -> None:
        kube.delete(f"{admission}/validatingadmissionpolicybindings/{name}")
        kube.delete(f"{admission}/validatingadmissionpolicies/{name}")

    return remove


def wait_denied(probe: Callable[[], object]) -> None:
    """Wait until probe() (a dry-run write) raises the policy's 4xx refusal."""
    def refused() -> bool:
        try:
            probe()
        except ApiError as exc:
            return exc.status in (400, 403, 422) and "denied by test policy" in exc.message
        return False

    wait_until("the admission policy to take effect", refused, timeout=30)
