"""`packaging/` deployed for real: a kustomize overlay over the shipped base, applied as admin.

The overlay sets only what a user sets too (docs/operations.md, "Deploying with kustomize"):
the image, and the API server address for the installer, because this node runs no
kube-proxy to route the `kubernetes` Service's ClusterIP.
"""

from __future__ import annotations

import logging
import os
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.kube import Kube, crd_established
from e2e.harness.wait import wait_until

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGING = REPO_ROOT / "packaging"
SHIPPED_IMAGE = "ghcr.io/example/vpc-attach"
DAEMONSET = ("kube-system", "vpc-attach")
POD_LABEL = "app.kubernetes.io/name=vpc-attach"
READY_S = 180.0
ROLL_S = 300.0  # the old Pod's graceful stop (its verbs drain) and the new Pod's start
KUSTOMIZE_S = 60.0


def write_overlay(directory: Path, image_ref: str, server: str,
                  packaging: Path = PACKAGING) -> Path:
    """A kustomization in `directory` over `packaging` (this tree's, or another release's):
    the image and the API server; the directory."""
    name, _, tag = image_ref.rpartition(":")
    host, _, port = server.removeprefix("https://").rpartition(":")
    service_env = [{"name": "KUBERNETES_SERVICE_HOST", "value": host},
                   {"name": "KUBERNETES_SERVICE_PORT", "value": port}]
    patch = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": DAEMONSET[1], "namespace": DAEMONSET[0]},
        "spec": {"template": {"spec": {
            "initContainers": [{"name": "install", "env": service_env}],
            "containers": [{"name": "refresh-token", "env": service_env}],
        }}},
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(packaging, directory)],
        "images": [{"name": SHIPPED_IMAGE, "newName": name, "newTag": tag}],
        "patches": [{"target": {"kind": "DaemonSet", "name": DAEMONSET[1]},
                     "patch": yaml.safe_dump(patch, sort_keys=False)}],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "kustomization.yaml"
    path.write_text("# Written by e2e.node: packaging/ as shipped, plus this node's image and "
                    "API server.\n" + yaml.safe_dump(kustomization, sort_keys=False))
    return directory


def render(kubectl: Path, overlay: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize OVERLAY`: the objects to apply."""
    proc = subprocess.run([str(kubectl), "kustomize", str(overlay)], capture_output=True,
                          text=True, timeout=KUSTOMIZE_S, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay}: {proc.stderr.strip()}")
    return [document for document in yaml.safe_load_all(proc.stdout) if document]


def apply(admin: Kube, objects: list[dict[str, Any]]) -> None:
    """Server-side apply every object; wait for the CRDs to be Established."""
    for manifest in objects:
        log.info("applying %s %s", manifest["kind"], manifest["metadata"]["name"])
        admin.apply(manifest)
    for manifest in objects:
        if manifest["kind"] == "CustomResourceDefinition":
            name = manifest["metadata"]["name"]
            wait_until(f"CRD {name} Established", partial(crd_established, admin, name),
                       READY_S)


def agent_pod(admin: Kube, node_name: str) -> dict[str, Any] | None:
    """The DaemonSet's Pod on `node_name`, if any."""
    namespace = DAEMONSET[0]
    pods = admin.list(f"/api/v1/namespaces/{namespace}/pods", labels=POD_LABEL)
    for pod in pods:
        if pod.get("spec", {}).get("nodeName") == node_name and \
                not pod["metadata"].get("deletionTimestamp"):
            return pod
    return None


def pod_ready(pod: dict[str, Any] | None) -> bool:
    """Whether a Pod's Ready condition is True."""
    if pod is None:
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def agent_image(pod: dict[str, Any]) -> str:
    """The image the Pod's agent container runs (as its spec names it)."""
    return str(next(c["image"] for c in pod["spec"]["containers"] if c["name"] == "agent"))


def wait_rolled(admin: Kube, node_name: str, image_ref: str, alive: Any = None,
                timeout: float = ROLL_S) -> dict[str, Any]:
    """Until the DaemonSet's only Pod on the node runs `image_ref` and is Ready (the Pod it
    replaced gone); that Pod."""
    namespace = DAEMONSET[0]

    def rolled() -> bool:
        pods = [p for p in admin.list(f"/api/v1/namespaces/{namespace}/pods", labels=POD_LABEL)
                if p.get("spec", {}).get("nodeName") == node_name]
        return len(pods) == 1 and agent_image(pods[0]) == image_ref and \
            not pods[0]["metadata"].get("deletionTimestamp") and pod_ready(pods[0])

    wait_until(f"the vpc-attach DaemonSet Pod on {node_name} running {image_ref}, Ready",
               rolled, timeout, interval=0.2, alive=alive)
    pod = agent_pod(admin, node_name)
    assert pod is not None
    return pod


def wait_agent_ready(admin: Kube, node_name: str, alive: Any = None,
                     timeout: float = READY_S) -> dict[str, Any]:
    """Until the DaemonSet's Pod on the node is Ready; that Pod."""
    wait_until(f"the vpc-attach DaemonSet Pod Ready on {node_name}",
               lambda: pod_ready(agent_pod(admin, node_name)), timeout, interval=0.5,
               alive=alive)
    pod = agent_pod(admin, node_name)
    assert pod is not None
    return pod
