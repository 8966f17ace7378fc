"""What a test reads off a running node, each through a client independent of vpc-attach: the
official Kubernetes client, the node's CRI, `ip -j` in the node's namespaces; and the plugin's
JSON log lines, for what only the log tells (STATUS calls, timings)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from e2e.harness.cri.client import CriError, SandboxStatus
from e2e.harness.kube import Kube
from e2e.harness.wait import wait_until
from e2e.node.mountns import MountNamespaceError
from e2e.node.node import Node

POD_READY_S = 120.0
POD_GONE_S = 120.0


def pod_manifest(name: str, image: str, namespace: str = "default",
                 labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod running the local pause image (never pulled), quick to stop."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": image,
                                 "imagePullPolicy": "Never"}]},
    }


def unique(prefix: str) -> str:
    """A fresh object name."""
    return f"{prefix}-{secrets.token_hex(3)}"


def create_pod(kube: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create a Pod through the API; the created object."""
    namespace = manifest["metadata"].get("namespace", "default")
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", manifest)


def get_pod(kube: Kube, name: str, namespace: str = "default") -> dict[str, Any] | None:
    """A Pod, or None."""
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def wait_running(kube: Kube, name: str, namespace: str = "default",
                 timeout: float = POD_READY_S) -> dict[str, Any]:
    """Until the Pod is Running with a Pod IP; the Pod."""
    def running() -> bool:
        pod = get_pod(kube, name, namespace) or {}
        status = pod.get("status", {})
        return status.get("phase") == "Running" and bool(status.get("podIP"))

    wait_until(f"pod {name} Running", running, timeout, interval=0.25)
    pod = get_pod(kube, name, namespace)
    assert pod is not None
    return pod


def delete_pod(kube: Kube, name: str, namespace: str = "default",
               timeout: float = POD_GONE_S) -> None:
    """Delete a Pod (graceful, as a user does) and wait until the object is gone, which the
    kubelet allows only after it stopped the sandbox (CNI DEL)."""
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
    wait_until(f"pod {name} gone", lambda: get_pod(kube, name, namespace) is None, timeout,
               interval=0.25)


def pod_events(kube: Kube, name: str, namespace: str = "default") -> list[dict[str, Any]]:
    """core/v1 Events about a Pod (what `kubectl describe pod` shows)."""
    return kube.list(f"/api/v1/namespaces/{namespace}/events",
                     fields=f"involvedObject.kind=Pod,involvedObject.name={name}")


def sandbox_failures(kube: Kube, name: str, namespace: str = "default") -> list[str]:
    """The messages of the Pod's FailedCreatePodSandBox events."""
    return [event.get("message", "") for event in pod_events(kube, name, namespace)
            if event.get("reason") == "FailedCreatePodSandBox"]


def plugin_log(node: Node) -> list[dict[str, Any]]:
    """Every JSON line of the node's vpc-attach log (`/var/log/vpc-attach/*.log*`)."""
    lines = []
    for path in sorted(node.host_path("/var/log/vpc-attach").glob("*.log*")):
        for raw in path.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                continue
    return lines


def host_links(node: Node) -> set[str]:
    """Link names in the host network namespace (the node's)."""
    return {link["ifname"] for link in _ip_json(node, ["link", "show"])}


def _ip_json(node: Node, args: list[str], netns: str | None = None) -> list[dict[str, Any]]:
    argv = ["ip", "-j", *args]
    if netns is not None:
        argv = ["nsenter", f"--net={netns}", *argv]
    output = node.namespace.run(argv)
    decoded: list[dict[str, Any]] = json.loads(output or "[]")
    return decoded


def pod_addresses(node: Node, netns: str, ifname: str = "eth0") -> list[str]:
    """The global addresses of `ifname` inside a Pod's netns (a node path, /var/run/netns/..)."""
    found = []
    for link in _ip_json(node, ["addr", "show", "dev", ifname], netns=netns):
        for info in link.get("addr_info", []):
            if info.get("scope") == "global":
                found.append(info["local"])
    return found


def sandboxes(node: Node, pod_uid: str | None = None) -> list[SandboxStatus]:
    """Every sandbox the node's CRI knows (of one Pod, given its UID): what the runtime made
    of its ADDs (a ready sandbox, its IPs and netns) and DELs (stopped, then removed)."""
    found = []
    with node.runtime.control.client() as cri:
        for sandbox_id in cri.list_pod_sandboxes():
            try:
                status = cri.pod_sandbox_status(sandbox_id)
            except CriError as exc:
                if exc.code == grpc.StatusCode.NOT_FOUND:  # removed since it was listed
                    continue
                raise
            if pod_uid is None or status.uid == pod_uid:
                found.append(status)
    return found


def sandbox(node: Node, pod_uid: str) -> SandboxStatus:
    """The ready sandbox of the Pod with this UID (its id is the CNI_CONTAINERID), through the
    node's CRI."""
    for status in sandboxes(node, pod_uid):
        if status.ready:
            return status
    raise LookupError(f"no ready sandbox of pod {pod_uid}")


def netns_exists(node: Node, netns: str) -> bool:
    """Whether the node still has this network namespace path (the runtime removes a
    sandbox's once the CNI DEL of its stop succeeded)."""
    try:
        node.namespace.run(["test", "-e", netns])
    except MountNamespaceError:
        return False
    return True


def bgp_router(node: Node, kube: Kube) -> str:
    """The name of the BGPRouter targeting this node (SPEC §6: exactly one)."""
    (name,) = [str(router["metadata"]["name"]) for router in
               kube.list(f"{BGP_API}/namespaces/{node.cluster.bgp_namespace}/bgprouters")
               if router["spec"]["targetRef"]["name"] == node.node_name]
    return name


def ipam_records(node: Node) -> list[Path]:
    """Allocation records on the node, of vpc-attach-ipam (`/var/lib/cni/vpc-attach-ipam`) and
    host-local (`/var/lib/cni/networks`): every file but the pools' locks, cursors and format
    markers."""
    root = node.host_path("/var/lib/cni")
    return [path for path in root.rglob("*") if path.is_file()
            and path.name not in ("lock", ".formatVersion")
            and not path.name.startswith("last_reserved")]


BGP_API = "/apis/network.datumapis.com/v1alpha1"
GALACTIC_PREFIX = "galactic.datum.net/"


def advertisements(node: Node, kube: Kube) -> list[dict[str, Any]]:
    """Every BGPAdvertisement in the node's BGP namespace."""
    return kube.list(f"{BGP_API}/namespaces/{node.cluster.bgp_namespace}/bgpadvertisements")


def vrf_instances(node: Node, kube: Kube) -> list[dict[str, Any]]:
    """Every BGPVRFInstance in the node's BGP namespace."""
    return kube.list(f"{BGP_API}/namespaces/{node.cluster.bgp_namespace}/bgpvrfinstances")


def pod_slices(kube: Kube, namespace: str = "default") -> list[dict[str, Any]]:
    """The EndpointSlices of a namespace owned by a Pod (vpc-attach's; none other is)."""
    return [s for s in kube.list(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices")
            if any(o.get("kind") == "Pod" for o in s["metadata"].get("ownerReferences") or [])]


def rules(node: Node) -> set[str]:
    """The host's IPv4 and IPv6 policy routing rules, one string each."""
    found = set()
    for family in ("-4", "-6"):
        for rule in _ip_json(node, [family, "rule", "show"]):
            found.add(json.dumps(rule, sort_keys=True))
    return found


@dataclass(frozen=True)
class Snapshot:
    """What vpc-attach may leave on a node and in the cluster, at one moment."""

    links: frozenset[str]
    rules: frozenset[str]
    ipam: frozenset[str]
    annotations: frozenset[str]
    slices: frozenset[str]

    def added_since(self, before: Snapshot) -> dict[str, list[str]]:
        """What is here and was not in `before`, per kind (empty kinds left out)."""
        leaked = {name: sorted(getattr(self, name) - getattr(before, name))
                  for name in ("links", "rules", "ipam", "annotations", "slices")}
        return {name: items for name, items in leaked.items() if items}


def snapshot(node: Node, kube: Kube) -> Snapshot:
    """Links, rules, IPAM records (vpc-attach-ipam's and host-local's), the galactic
    annotations on advertisements and the Pod-owned EndpointSlices, now."""
    records = {str(p) for p in ipam_records(node)}
    annotations = {f"{ad['metadata']['name']}/{key}"
                   for ad in advertisements(node, kube)
                   for key in (ad["metadata"].get("annotations") or {})
                   if key.startswith(GALACTIC_PREFIX)}
    return Snapshot(frozenset(host_links(node)), frozenset(rules(node)), frozenset(records),
                    frozenset(annotations),
                    frozenset(s["metadata"]["name"] for s in pod_slices(kube)))


def verb_lines(node: Node, verb: str | None = None,
               container_id: str | None = None) -> list[dict[str, Any]]:
    """The plugin's one-line summaries, optionally of one verb and one container."""
    return [line for line in plugin_log(node) if "verb" in line
            and (verb is None or line["verb"] == verb)
            and (container_id is None or line["containerID"] == container_id)]
