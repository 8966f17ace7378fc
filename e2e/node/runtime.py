"""containerd v2 + runc for the node, run in the node's mount namespace (see mountns.py).

Its root, state, runc root and sockets are under the state dir; the CNI dirs are the usual
`/opt/cni/bin` and `/etc/cni/net.d` of the node's namespace (bound to the state dir), so the
DaemonSet installs into the directories the runtime reads, as on a real node. Network
namespaces are made under `/run/netns`, which is the state dir's `host/run/netns`.
"""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.cluster import processes
from e2e.harness.cri import cleanup
from e2e.harness.cri.client import CriClient, CriError
from e2e.harness.cri.pause import PauseImage
from e2e.harness.wait import wait_until
from e2e.node.mountns import MountNamespace

log = logging.getLogger(__name__)

NAME = "containerd"
CRI_NAMESPACE = "k8s.io"
READY_S = 60.0
IMPORT_S = 300.0
SOCKET_PATH_LIMIT = 100  # sun_path is 108 bytes; containerd adds ".ttrpc" to a sibling
CNI_BIN_DIR = "/opt/cni/bin"
CNI_CONF_DIR = "/etc/cni/net.d"


class NodeRuntimeError(RuntimeError):
    """containerd could not be configured, started or stopped."""


def _toml(value: str | int | bool | list[str]) -> str:
    """A TOML value (JSON strings are valid TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


@dataclass(frozen=True)
class Runtime:
    """The node's containerd: paths, binaries, and how to reach it."""

    state_dir: Path
    binaries: dict[str, Path]  # containerd, containerd-shim-runc-v2, ctr, runc
    pause: PauseImage
    namespace: MountNamespace

    @property
    def workdir(self) -> Path:
        return self.state_dir / "containerd"

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.toml"

    @property
    def runc_root(self) -> Path:
        return self.workdir / "runc"

    @property
    def endpoint(self) -> str:
        """The CRI endpoint as kubelet's `containerRuntimeEndpoint` wants it."""
        return f"unix://{self.socket}"

    def config(self) -> str:
        """containerd v2's config.toml (version 3)."""
        w = self.workdir
        runtime = '[plugins."io.containerd.cri.v1.runtime"'
        images = '[plugins."io.containerd.cri.v1.images"'
        return "\n".join([
            "version = 3",
            f"root = {_toml(str(w / 'root'))}",
            f"state = {_toml(str(w / 'state'))}",
            "disabled_plugins = " + _toml([
                "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs",
                "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]),
            "[grpc]",
            f"  address = {_toml(str(self.socket))}",
            "[ttrpc]",
            f"  address = {_toml(str(self.socket) + '.ttrpc')}",
            "[debug]",
            '  address = ""',
            '  level = "info"',
            "[metrics]",
            '  address = ""',
            runtime + "]",
            "  restrict_oom_score_adj = true",
            "  enable_selinux = false",
            "  disable_apparmor = true",
            runtime + ".cni]",
            f"  bin_dirs = {_toml([CNI_BIN_DIR])}",
            f"  conf_dir = {_toml(CNI_CONF_DIR)}",
            "  max_conf_num = 1",
            runtime + ".containerd]",
            '  default_runtime_name = "runc"',
            runtime + ".containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            runtime + ".containerd.runtimes.runc.options]",
            f"  BinaryName = {_toml(str(self.binaries['runc']))}",
            f"  Root = {_toml(str(self.runc_root))}",
            "  SystemdCgroup = false",
            images + "]",
            '  snapshotter = "overlayfs"',
            images + ".pinned_images]",
            f"  sandbox = {_toml(self.pause.ref)}",
            '[plugins."io.containerd.grpc.v1.cri"]',
            "  disable_tcp_service = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "",
        ])

    def environment(self) -> dict[str, str]:
        """containerd's whole environment: CNI plugins inherit it (nothing of the test's)."""
        shim_dir = self.binaries["containerd-shim-runc-v2"].parent
        return {"PATH": f"{shim_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(self.workdir)}

    def start(self) -> processes.Component:
        """Start containerd in the node's namespace; wait for the CRI; import the pause image."""
        if len(str(self.socket)) > SOCKET_PATH_LIMIT:
            raise NodeRuntimeError(f"socket path too long for a Unix socket: {self.socket}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config())
        argv = self.namespace.enter([str(self.binaries["containerd"]), "--config",
                                     str(self.config_path)])
        component = processes.start(NAME, argv, self.state_dir, self.environment())
        self.wait_ready(component)
        self.import_image(self.pause.archive, self.pause.ref)
        return component

    def restart(self, component: processes.Component) -> processes.Component:
        """Stop containerd (SIGTERM; Pods and shims keep running) and start it again."""
        started = processes.restart(component)
        self.wait_ready(started)
        return started

    def client(self) -> CriClient:
        """A CRI client of this containerd (close it after use)."""
        return CriClient(self.socket)

    def wait_ready(self, component: processes.Component) -> None:
        """Until the CRI answers and reports RuntimeReady."""
        def ready() -> bool:
            if not self.socket.exists():
                return False
            with self.client() as cri:
                try:
                    conditions, _ = cri.status(timeout=5)
                except CriError:
                    return False
                return bool(conditions.get("RuntimeReady"))

        wait_until("containerd's CRI RuntimeReady", ready, READY_S, interval=0.1,
                   alive=component.check_alive)

    def ctr(self, *args: str, timeout: float = IMPORT_S) -> str:
        """`ctr` against this containerd, in the CRI namespace, inside the node's namespace."""
        argv = self.namespace.enter([str(self.binaries["ctr"]), "--address", str(self.socket),
                                     "--namespace", CRI_NAMESPACE, *args])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
        if proc.returncode != 0:
            raise NodeRuntimeError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def import_image(self, archive: Path, ref: str) -> None:
        """`ctr images import` an OCI archive; wait until the CRI image store has `ref`."""
        self.ctr("images", "import", str(archive))

        def present() -> bool:
            with self.client() as cri:
                return cri.image_present(ref)

        wait_until(f"image {ref} in the CRI", present, READY_S)

    # -- teardown ----------------------------------------------------------------------------

    def remove_sandboxes(self) -> list[str]:
        """Stop and remove every sandbox through the CRI (each runs the CNI DEL)."""
        with self.client() as cri:
            return cleanup.remove_sandboxes(cri)

    def delete_containers(self) -> list[str]:
        """Containers runc still knows under our root (after containerd is gone)."""
        return cleanup.delete_containers(self.namespace.enter([str(self.binaries["runc"])]),
                                         self.runc_root / CRI_NAMESPACE)

    def kill_shims(self) -> list[str]:
        """Shims serving our socket (their command line names it)."""
        return cleanup.kill_shims(self.socket)
