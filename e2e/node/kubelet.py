"""kube-scheduler and the kubelet of the node.

The kubelet runs in the node's mount namespace with its root dir, certificates and cgroup root
of its own: `cgroupDriver: cgroupfs` under a dedicated `cgroupRoot` (this kernel has cgroup v1
hierarchies: `failCgroupV1: false`), `makeIPTablesUtilChains: false`, and a non-loopback node
IP. It reaches the API server with a client certificate for `system:node:NAME`.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import secrets
import socket
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.cluster import processes
from e2e.harness.cluster.kubeconfig import write_cert_kubeconfig
from e2e.harness.cluster.pki import Pki, issue_client_cert, issue_serving_cert
from e2e.harness.kube import Kube
from e2e.harness.wait import wait_until
from e2e.node.mountns import MountNamespace

log = logging.getLogger(__name__)

KUBELET = "kubelet"
SCHEDULER = "kube-scheduler"
READY_S = 120.0
HEALTHY_S = 60.0
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Kernel settings kubelet writes when protectKernelDefaults is off; `down` puts them back.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")


def free_port() -> int:
    """A TCP port free on all addresses right now."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
        return port


def node_ip() -> str:
    """The address of the interface that holds the default route (kubelet refuses loopback)."""
    routes = json.loads(subprocess.run(["ip", "-j", "route", "get", "1.1.1.1"],
                                       capture_output=True, text=True, timeout=10,
                                       check=True).stdout)
    address: str = routes[0]["prefsrc"]
    return address


def start_scheduler(state_dir: Path, binary: Path, pki: Pki, server: str) -> processes.Component:
    """kube-scheduler as `system:kube-scheduler`, serving /healthz on a loopback port."""
    issue_client_cert(pki, "scheduler", "system:kube-scheduler", [])
    cert, key = issue_serving_cert(pki, "kube-scheduler")
    kubeconfig = write_cert_kubeconfig(state_dir / "scheduler.kubeconfig", server, pki.ca_cert,
                                       "system:kube-scheduler", pki.client_cert("scheduler"),
                                       pki.client_key("scheduler"))
    port = free_port()
    argv = [str(binary), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={port}", f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}", "--v=1"]
    component = processes.start(SCHEDULER, argv, state_dir)
    health = Kube.anonymous(f"https://127.0.0.1:{port}", pki.ca_cert)
    with health:
        wait_until("kube-scheduler /healthz", lambda: health.get_text("/healthz")[0] == 200,
                   READY_S, interval=0.5, alive=component.check_alive)
    return component


@dataclass(frozen=True)
class Kubelet:
    """The kubelet's identity, paths and configuration."""

    state_dir: Path
    binary: Path
    node_name: str
    node_ip: str
    cgroup_root: str  # e.g. /vpc-attach-node-1a2b3c4d
    runtime_endpoint: str
    namespace: MountNamespace

    @classmethod
    def plan(cls, state_dir: Path, binary: Path, runtime_endpoint: str,
             namespace: MountNamespace) -> Kubelet:
        suffix = secrets.token_hex(4)
        return cls(state_dir, binary, f"vpc-attach-node-{suffix}", node_ip(),
                   f"/vpc-attach-node-{suffix}", runtime_endpoint, namespace)

    @property
    def root_dir(self) -> Path:
        return self.state_dir / "kubelet"

    def configuration(self, ca_file: Path) -> dict[str, object]:
        """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1)."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(ca_file)}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": self.runtime_endpoint,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": True,
            "failCgroupV1": False,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "protectKernelDefaults": False,
            # The imported images are the only ones: never garbage-collected, never evicted.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "volumePluginDir": str(self.root_dir / "volume-plugins"),
            "podLogsDir": "/var/log/pods",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s",
            "shutdownGracePeriod": "0s",
            "registerNode": True,
        }

    def start(self, pki: Pki, server: str) -> processes.Component:
        """Write certificates and config, make the cgroup root, start the kubelet."""
        issue_client_cert(pki, "kubelet", f"system:node:{self.node_name}", ["system:nodes"])
        kubeconfig = write_cert_kubeconfig(self.state_dir / "kubelet.kubeconfig", server,
                                           pki.ca_cert, f"system:node:{self.node_name}",
                                           pki.client_cert("kubelet"), pki.client_key("kubelet"))
        self.root_dir.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "kubelet-config.json"
        config.write_text(json.dumps(self.configuration(pki.ca_cert), indent=2) + "\n")
        save_kernel_tunables(self.state_dir)
        make_cgroup_root(self.cgroup_root)
        argv = self.namespace.enter([
            str(self.binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.root_dir}", f"--cert-dir={self.root_dir / 'pki'}",
            f"--hostname-override={self.node_name}", f"--node-ip={self.node_ip}", "--v=2"])
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(self.root_dir)}
        return processes.start(KUBELET, argv, self.state_dir, env)


def wait_healthy(component: processes.Component, timeout: float = HEALTHY_S) -> None:
    """Until the kubelet's /healthz answers 200 (it has connected to the runtime and its sync
    loop runs); raises ProcessExited if it exits first."""
    config = json.loads((component.state_dir / "kubelet-config.json").read_text())
    url = f"http://127.0.0.1:{config['healthzPort']}/healthz"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, http.client.HTTPException):
            return False

    wait_until("kubelet /healthz", healthy, timeout, interval=0.2, alive=component.check_alive)


def make_cgroup_root(cgroup_root: str) -> None:
    """The kubelet's cgroup root in every v1 hierarchy (kubelet requires it to exist)."""
    relative = cgroup_root.strip("/")
    for hierarchy in _hierarchies():
        directory = hierarchy / relative
        directory.mkdir(exist_ok=True)
        if (hierarchy / "cpuset.cpus").exists():  # a new cpuset has no CPUs until given some
            for name in ("cpuset.cpus", "cpuset.mems"):
                (directory / name).write_text((hierarchy / name).read_text())


def remove_cgroup_root(cgroup_root: str) -> list[str]:
    """Remove the cgroup root and everything below it, deepest first; the problems met."""
    problems = []
    relative = cgroup_root.strip("/")
    for hierarchy in _hierarchies():
        parent = hierarchy / relative
        if not parent.is_dir():
            continue
        below = sorted((d for d in parent.rglob("*") if d.is_dir()),
                       key=lambda d: len(d.parts), reverse=True)
        for directory in [*below, parent]:
            try:
                directory.rmdir()
            except OSError as exc:
                problems.append(f"cgroup {directory}: {exc}")
    return problems


def _hierarchies() -> list[Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    return [h for h in CGROUP_ROOT.iterdir() if h.is_dir() and (h / "cgroup.procs").exists()]


def save_kernel_tunables(state_dir: Path) -> None:
    """Record the kernel settings the kubelet may change (once per state dir)."""
    record = state_dir / "kernel-tunables.json"
    if record.exists():
        return
    values = {}
    for name in KERNEL_TUNABLES:
        path = Path("/proc/sys") / name
        if path.exists():
            values[name] = path.read_text().strip()
    record.write_text(json.dumps(values, indent=2) + "\n")


def restore_kernel_tunables(state_dir: Path) -> list[str]:
    """Put back what `save_kernel_tunables` recorded; the settings that differed."""
    record = state_dir / "kernel-tunables.json"
    if not record.exists():
        return []
    restored = []
    for name, value in json.loads(record.read_text()).items():
        path = Path("/proc/sys") / name
        if path.read_text().strip() != value:
            path.write_text(value + "\n")
            restored.append(f"{name} restored to {value}")
    os.unlink(record)
    return restored
