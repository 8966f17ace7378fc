"""The real node a test module stands on (`e2e/test_node.py`): up once for the module with the
plugin reaching the API server through a fault proxy, and what its tests read of it — Pods
started through the API, what they left, what `down` left on the host. Read through clients
independent of vpc-attach (the node's CRI, the API as admin, `ip -j`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from e2e.harness import kernel
from e2e.harness.faults import FaultProxy, ProxiedCluster, start_proxy
from e2e.harness.kube import Kube
from e2e.harness.wait import wait_until
from e2e.node import Node
from e2e.node import down as node_down
from e2e.node.observe import (
    Snapshot,
    advertisements,
    create_pod,
    pod_manifest,
    pod_slices,
    sandbox,
    sandboxes,
    snapshot,
    unique,
    wait_running,
)

CID_KEY = 41  # annotations carry the first 41 characters of the container ID (SPEC §6)
SETTLE_S = 60.0  # what a deleted Pod left is gone (kubelet, containerd and the plugin's DEL)


class NodeUnderTest:
    """The module's node, the proxy its plugin talks through, and the figures it reports."""

    def __init__(self, node: Node, proxied: ProxiedCluster) -> None:
        self.node = node
        self.proxied = proxied
        self.figures: dict[str, Any] = {}

    @property
    def proxy(self) -> FaultProxy:
        """The fault proxy between the node's plugin (and agent) and the API server."""
        return self.proxied.proxy


@contextlib.contextmanager
def node_under_test(base: Path) -> Iterator[NodeUnderTest]:
    """A node up under ``base`` with its plugin behind a fault proxy; afterwards `down`, and
    what it left on the host in ``figures["down"]``."""
    state_dir = base / "state"
    links_before = host_links_now()
    proxied: list[ProxiedCluster] = []

    def through_proxy(cluster: Any) -> str:
        proxied.append(start_proxy(cluster, base))
        return proxied[0].proxy.url

    try:
        node = Node.up(state_dir, plugin_server=through_proxy)
    except BaseException:
        node_down(state_dir)
        for started in proxied:
            started.stop()
        raise
    under_test = NodeUnderTest(node, proxied[0])
    try:
        yield under_test
    finally:
        problems = node.down()
        proxied[0].stop()
        left = left_on_host(state_dir, node.kubelet.cgroup_root, links_before)
        under_test.figures["down"] = {"problems": problems, "left_on_host": left}


def pause_image(node: Node) -> str:
    """The node's local pause image (never pulled)."""
    return node.runtime.pause.ref


def start_pod(node: Node, admin: Kube, prefix: str) -> tuple[dict[str, Any], str, str]:
    """A Pod created through the API and Running; (pod, sandbox id, sandbox netns)."""
    name = unique(prefix)
    create_pod(admin, pod_manifest(name, pause_image(node)))
    pod = wait_running(admin, name)
    box = sandbox(node, pod["metadata"]["uid"])
    assert box.netns, f"sandbox {box.id} has no netns"
    return pod, box.id, box.netns


def wait_nothing_left(node: Node, admin: Kube, baseline: Snapshot,
                      timeout: float = SETTLE_S) -> dict[str, list[str]]:
    """Until nothing added since ``baseline`` remains (or the timeout); what remains."""
    left: dict[str, list[str]] = {}

    def clean() -> bool:
        left.clear()
        left.update(snapshot(node, admin).added_since(baseline))
        return not left

    with contextlib.suppress(TimeoutError):  # what remains is the caller's to judge
        wait_until("nothing of the deleted Pods left", clean, timeout, interval=0.5)
    return left


def owned_slices(admin: Kube, uid: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The EndpointSlices the Pod of ``uid`` owns."""
    return [s for s in pod_slices(admin, namespace)
            if any(o.get("uid") == uid for o in s["metadata"]["ownerReferences"])]


def advertising(node: Node, admin: Kube, container_id: str) -> list[dict[str, Any]]:
    """Advertisements carrying an annotation of this container."""
    return [ad for ad in advertisements(node, admin)
            if any(key.endswith("." + container_id[:CID_KEY])
                   for key in ad["metadata"].get("annotations") or {})]


def ready_condition(node: Node, admin: Kube) -> dict[str, Any]:
    """The Node object's Ready condition."""
    status = (admin.get(f"/api/v1/nodes/{node.node_name}") or {}).get("status", {})
    ready: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == "Ready")
    return ready


def attached_sandboxes(node: Node, admin: Kube) -> dict[str, str]:
    """The node's ready sandboxes of Pods not on the host network (those the runtime calls the
    plugin for): id -> Pod UID."""
    host_network = {pod["metadata"]["uid"] for pod in admin.list("/api/v1/pods")
                    if pod["spec"].get("hostNetwork")}
    return {box.id: box.uid for box in sandboxes(node)
            if box.ready and box.uid not in host_network}


def host_links_now() -> set[str]:
    """The host's links, by name."""
    return {link["ifname"] for link in json.loads(kernel.run_ip("-j", "link", "show") or "[]")}


def left_on_host(state_dir: Path, cgroup_root: str, links_before: set[str]) -> list[str]:
    """Mounts, processes, cgroups, links and files of the node still on the host."""
    left = []
    marker = str(state_dir)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if marker in line:
            left.append(f"mount {line.split()[4]}")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                left.append(f"process {proc.name}: {cmdline.replace(chr(0), ' ')[:120]}")
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if (hierarchy / cgroup_root.strip("/")).exists():
            left.append(f"cgroup {hierarchy / cgroup_root.strip('/')}")
    left += [f"link {name}" for name in sorted(host_links_now() - links_before)]
    if state_dir.exists():
        left.append(f"state dir {state_dir}")
    return left
