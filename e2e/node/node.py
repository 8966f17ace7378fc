"""A real Kubernetes node for tests (SPEC §13): control plane, kube-scheduler, containerd v2 +
runc and a kubelet, all under one state dir, with vpc-attach deployed by its own DaemonSet.

`Node.up` starts everything and returns when the DaemonSet Pod is Ready on the node and the
node is Ready and schedulable; `down(state_dir)` (or `Node.down`) removes everything `up` made.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.cluster import Cluster, build, processes
from e2e.harness.cluster.cluster import down as cluster_down
from e2e.harness.cluster.pki import Pki
from e2e.harness.cri.pause import pause_image
from e2e.harness.image import Release, current_release
from e2e.harness.kube import Kube
from e2e.harness.tools import gotools
from e2e.harness.wait import wait_until
from e2e.node import deploy, mountns
from e2e.node.kubelet import (
    KUBELET,
    SCHEDULER,
    Kubelet,
    remove_cgroup_root,
    restore_kernel_tunables,
    start_scheduler,
    wait_healthy,
)
from e2e.node.runtime import CNI_BIN_DIR, CNI_CONF_DIR, IMPORT_S, Runtime

log = logging.getLogger(__name__)

STATE_FILE = "node.json"
STATE_MARKER = "vpc-attach e2e.node"
CLUSTER_DIR = "cluster"
CONFLIST_NAME = "10-vpc-attach.conflist"
EXAMPLES = deploy.PACKAGING / "examples"
# The reference plugins a conflist may chain besides vpc-attach (the DaemonSet installs that).
REFERENCE_PLUGINS = ("loopback", "host-local", "ptp", "tuning", "portmap", "static")
# The workload controllers a node needs besides the cluster's own.
NODE_CONTROLLERS = ("daemonset-controller", "deployment-controller", "replicaset-controller",
                    "node-lifecycle-controller")
NODE_READY_S = 180.0
CONFLIST_LOAD_S = 30.0


class NodeError(RuntimeError):
    """The node could not be brought up or down; the message says which part."""


@dataclasses.dataclass
class Node:
    """A running node and what a test needs to reach it."""

    state_dir: Path
    cluster: Cluster
    node_name: str
    node_ip: str
    image_ref: str
    namespace: mountns.MountNamespace
    runtime: Runtime
    kubelet: Kubelet
    components: dict[str, processes.Component] = dataclasses.field(default_factory=dict)
    plugin_server: str = ""  # the API server URL the installer writes into the node's kubeconfig

    @property
    def cni_conf_dir(self) -> Path:
        """The host directory that is the node's /etc/cni/net.d."""
        return self.namespace.host_path(CNI_CONF_DIR)

    @property
    def cni_bin_dir(self) -> Path:
        """The host directory that is the node's /opt/cni/bin."""
        return self.namespace.host_path(CNI_BIN_DIR)

    def host_path(self, node_path: str) -> Path:
        """The host directory behind one of the node's paths (mountns.BOUND)."""
        return self.namespace.host_path(node_path)

    def info(self) -> dict[str, str]:
        """The JSON line `up` prints (SPEC §13)."""
        return {
            "admin_kubeconfig": str(self.cluster.admin_kubeconfig),
            "plugin_kubeconfig": str(self.cluster.plugin_kubeconfig),
            "node_name": self.node_name,
            "bgp_namespace": self.cluster.bgp_namespace,
            "cni_conf_dir": str(self.cni_conf_dir),
            "cni_bin_dir": str(self.cni_bin_dir),
        }

    def admin(self) -> Kube:
        """Cluster-admin access through the official client (close it after)."""
        return self.cluster.admin()

    # -- up ----------------------------------------------------------------------------------

    @classmethod
    def up(cls, state_dir: Path | str, conflist: Path | None = None,
           plugin_server: Callable[[Cluster], str] | None = None,
           release: Release | None = None) -> Node:
        """Start the node in `state_dir` (absent or empty) with `conflist` (default: the
        veth-pod example) as its CNI configuration. `plugin_server`, given the running
        control plane, names the API server URL the DaemonSet's installer writes into the
        node's kubeconfig (default: the API server itself; a test puts a fault proxy there).
        `release` is what the node deploys (default: this tree's image and packaging/; the
        upgrade test starts from the previous release's)."""
        started = time.monotonic()
        binaries = build.ensure_all_built()
        pause = pause_image()
        release = release or current_release()
        image_archive, image_ref = release.image
        plugins_dir = gotools.reference_plugins_dir()
        directory = _claim_state_dir(Path(state_dir))
        cluster = Cluster.up(directory / CLUSTER_DIR, extra_controllers=NODE_CONTROLLERS)
        node: Node | None = None
        try:
            namespace = mountns.create(directory)
            runtime = Runtime(directory, binaries, pause, namespace)
            kubelet = Kubelet.plan(directory, binaries["kubelet"], runtime.endpoint, namespace)
            node = cls(directory, cluster, kubelet.node_name, kubelet.node_ip, image_ref,
                       namespace, runtime, kubelet)
            node._write_state("starting")
            for plugin in REFERENCE_PLUGINS:
                shutil.copy2(plugins_dir / plugin, node.cni_bin_dir / plugin)
            node.set_conflist(_conflist_source(conflist))
            pki = Pki(cluster.state_dir / "pki")
            node.components[SCHEDULER] = start_scheduler(
                directory, binaries["kube-scheduler"], pki, cluster.server)
            node.components["containerd"] = runtime.start()
            runtime.control.import_image(image_archive, _cri_ref(image_ref), IMPORT_S)
            node.components[KUBELET] = kubelet.start(pki, cluster.server)
            wait_healthy(node.components[KUBELET])
            with cluster.admin() as admin:
                node._wait_registered(admin)
                node.plugin_server = plugin_server(cluster) if plugin_server else cluster.server
                objects = deploy.render(binaries["kubectl"], deploy.write_overlay(
                    directory / "overlay", image_ref, node.plugin_server, release.packaging))
                deploy.apply(admin, objects)
                node.create_router(admin)
                node.create_binding(admin)
                deploy.wait_agent_ready(admin, node.node_name, alive=node.check_alive)
                node.wait_schedulable(admin)
        except BaseException:
            log.error("node up failed; logs are in %s (run `down` to remove it)", directory)
            if node is None:
                cluster.down()
            raise
        node._write_state("up")
        log.info("node %s up in %.1f s (state dir %s)", node.node_name,
                 time.monotonic() - started, directory)
        return node

    def set_conflist(self, conflist: dict[str, Any]) -> Path:
        """Make `conflist` the node's only CNI configuration (containerd reloads it)."""
        for old in self.cni_conf_dir.glob("*.conf*"):
            old.unlink()
        path = self.cni_conf_dir / CONFLIST_NAME
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps(conflist, indent=2) + "\n")
        staged.rename(path)
        if "containerd" in self.components:  # it reloads on a file event: wait until it has
            wait_until("containerd using the new CNI conflist",
                       lambda: self.loaded_conflist() == conflist, CONFLIST_LOAD_S,
                       interval=0.1, alive=self.check_alive)
        return path

    def loaded_conflist(self) -> dict[str, Any] | None:
        """The pod network configuration containerd's CRI uses now (verbose Status)."""
        with self.runtime.control.client() as cri:
            _, info = cri.status()
        for network in (info.get("cniconfig") or {}).get("Networks") or []:
            if network.get("IFName") != "lo":
                loaded: dict[str, Any] = json.loads(network["Config"]["Source"])
                return loaded
        return None

    def create_router(self, admin: Kube) -> None:
        """The node's BGPRouter, from packaging/examples/bgprouter.yaml."""
        router = yaml.safe_load((EXAMPLES / "bgprouter.yaml").read_text())
        router["metadata"]["name"] = self.node_name
        router["metadata"]["namespace"] = self.cluster.bgp_namespace
        router["spec"]["targetRef"]["name"] = self.node_name
        admin.apply(router)

    def create_binding(self, admin: Kube) -> None:
        """The example VPCBindings (packaging/examples/vpcbinding.yaml): Pods of `default` may
        use the example networks; other namespaces are denied until a test binds them."""
        for binding in yaml.safe_load_all((EXAMPLES / "vpcbinding.yaml").read_text()):
            admin.apply(binding)

    def check_alive(self) -> None:
        """Raise ProcessExited if a node process died (with its log tail)."""
        for component in self.components.values():
            component.check_alive()

    def _wait_registered(self, admin: Kube) -> None:
        wait_until(f"node {self.node_name} registered",
                   lambda: admin.get(f"/api/v1/nodes/{self.node_name}") is not None,
                   NODE_READY_S, interval=0.5, alive=self.check_alive)

    def node_ready(self, admin: Kube) -> bool:
        """Whether the Node reports Ready (its runtime and network are ready)."""
        node = admin.get(f"/api/v1/nodes/{self.node_name}")
        conditions = (node or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_schedulable(self, admin: Kube, timeout: float = NODE_READY_S) -> None:
        """Until the node is Ready and carries no NoSchedule/NoExecute taint."""
        def schedulable() -> bool:
            node = admin.get(f"/api/v1/nodes/{self.node_name}") or {}
            taints = node.get("spec", {}).get("taints") or []
            return self.node_ready(admin) and not taints

        wait_until(f"node {self.node_name} Ready and untainted", schedulable, timeout,
                   interval=0.5, alive=self.check_alive)

    # -- what a test does to a running node ---------------------------------------------------

    def roll_to(self, admin: Kube, release: Release) -> dict[str, Any]:
        """Deploy another release as an operator does: its image on the node, its
        `packaging/` applied with that image (the DaemonSet then rolls: the old Pod stops, the
        new one installs and starts its agent); returns the new DaemonSet Pod once Ready."""
        self.runtime.control.import_image(release.image.archive, _cri_ref(release.image.ref),
                                          IMPORT_S)
        overlay = self.state_dir / f"overlay-{release.image.ref.rpartition(':')[2]}"
        objects = deploy.render(build.ensure_all_built()["kubectl"], deploy.write_overlay(
            overlay, release.image.ref, self.plugin_server, release.packaging))
        deploy.apply(admin, objects)
        pod = deploy.wait_rolled(admin, self.node_name, release.image.ref, alive=self.check_alive)
        self.image_ref = release.image.ref
        self._write_state("up")
        return pod

    def restart_kubelet(self) -> None:
        """Stop kubelet (SIGTERM; Pods keep running) and start it again."""
        self.components[KUBELET] = processes.restart(self.components[KUBELET])
        wait_healthy(self.components[KUBELET])
        self._write_state("up")

    def restart_containerd(self) -> None:
        """Stop containerd (SIGTERM; shims and Pods keep running) and start it again."""
        self.components["containerd"] = self.runtime.restart(self.components["containerd"])
        self._write_state("up")

    def reboot(self) -> None:
        """A simulated reboot: kubelet and containerd stop, every container dies, every Pod's
        network namespace is gone (with the links inside it and their host peers) and /run is
        empty; then containerd and kubelet start again, and kubelet recreates every sandbox.
        The control plane keeps running, as it does when one node reboots."""
        processes.stop(KUBELET, self.state_dir, self.components[KUBELET].popen)
        processes.stop("containerd", self.state_dir, self.components["containerd"].popen)
        for problem in self.runtime.delete_containers() + self.runtime.kill_shims():
            log.info("reboot: %s", problem)
        self.namespace.run(["sh", "-c", "for ns in /run/netns/*; do [ -e \"$ns\" ] || "
                            "continue; umount \"$ns\"; rm -f \"$ns\"; done"])
        self.namespace.run(["find", "/run", "-mindepth", "1", "-delete"])
        self._start_after_reboot()

    def _start_after_reboot(self) -> None:
        containerd, kubelet = self.components["containerd"], self.components[KUBELET]
        self.components["containerd"] = processes.start(
            containerd.name, containerd.argv, self.state_dir, containerd.env)
        self.runtime.wait_ready(self.components["containerd"])
        self.components[KUBELET] = processes.start(kubelet.name, kubelet.argv, self.state_dir,
                                                   kubelet.env)
        wait_healthy(self.components[KUBELET])
        self._write_state("up")

    def _write_state(self, status: str) -> None:
        state = {"harness": STATE_MARKER, "status": status, **self.info(),
                 "node_ip": self.node_ip, "image": self.image_ref,
                 "cgroup_root": self.kubelet.cgroup_root,
                 "pids": {name: c.pid for name, c in self.components.items()}}
        (self.state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    def down(self) -> list[str]:
        """Remove everything `up` made; the problems met on the way (already logged)."""
        return down(self.state_dir)


def down(state_dir: Path | str) -> list[str]:
    """Stop the node recorded in `state_dir` and remove it; refuses a directory not ours.

    Order: kubelet (so nothing restarts), every sandbox through the CRI (each runs the CNI
    DEL), containerd, leftover containers and shims, the mount namespace (its mounts go with
    it), the cgroup root, the scheduler, the control plane, kernel settings kubelet changed.
    """
    directory = Path(state_dir).resolve()
    if not directory.exists():
        return []
    state = _read_state(directory)
    problems: list[str] = []
    processes.stop(KUBELET, directory)
    namespace = mountns.attach(directory)
    if namespace is not None:
        runtime = Runtime(directory, build.ensure_all_built(), pause_image(), namespace)
        if processes.read_pid(directory, "containerd") is not None and runtime.socket.exists():
            problems += runtime.remove_sandboxes()
        processes.stop("containerd", directory)
        problems += runtime.delete_containers()
        problems += runtime.kill_shims()
    processes.stop(mountns.HOLDER, directory)
    if state.get("cgroup_root"):
        problems += remove_cgroup_root(state["cgroup_root"])
    processes.stop(SCHEDULER, directory)
    if (directory / CLUSTER_DIR).exists():
        cluster_down(directory / CLUSTER_DIR)
    for restored in restore_kernel_tunables(directory):
        log.info("down: %s", restored)
    for problem in problems:
        log.warning("down: %s", problem)
    shutil.rmtree(directory)
    log.info("removed %s", directory)
    return problems


def _claim_state_dir(state_dir: Path) -> Path:
    directory = state_dir.resolve()
    if directory.exists() and any(directory.iterdir()):
        if (directory / STATE_FILE).exists():
            raise NodeError(f"{directory} already holds a node; run `down` first")
        raise NodeError(f"state dir {directory} exists and is not empty")
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    (directory / STATE_FILE).write_text(json.dumps({"harness": STATE_MARKER,
                                                    "status": "starting"}) + "\n")
    return directory


def _read_state(directory: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise NodeError(f"{directory} is not a node state dir ({exc})") from exc
    if state.get("harness") != STATE_MARKER:
        raise NodeError(f"{directory} is not a node state dir")
    return state


def _conflist_source(conflist: Path | None) -> dict[str, Any]:
    """The node's conflist: FILE, or the veth-pod example (VRF isolation only if the kernel
    has VRF; `table` otherwise)."""
    if conflist is not None:
        loaded: dict[str, Any] = json.loads(conflist.read_text())
        return loaded
    nad = yaml.safe_load((EXAMPLES / "nad-veth-pod.yaml").read_text())
    example: dict[str, Any] = json.loads(nad["spec"]["config"])
    if not kernel_has_vrf():
        example = copy.deepcopy(example)
        for plugin in example["plugins"]:
            if plugin.get("isolation") == "vrf":
                log.info("this kernel has no VRF link type: the node's conflist uses "
                         "isolation `table`")
                plugin["isolation"] = "table"
    return example


def kernel_has_vrf() -> bool:
    """Whether `ip link add ... type vrf` works here (probed in a throwaway netns)."""
    probe = subprocess.run(["unshare", "--net", "ip", "link", "add", "probe", "type", "vrf",
                            "table", "10"], capture_output=True, timeout=10, check=False)
    return probe.returncode == 0


def _cri_ref(image_ref: str) -> str:
    """The reference containerd stores for `vpc-attach:TAG` (kubelet normalises the same)."""
    return image_ref if "/" in image_ref.split(":")[0] else f"docker.io/library/{image_ref}"
