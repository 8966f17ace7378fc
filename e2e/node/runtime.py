"""containerd v2 + runc for the node, run in the node's mount namespace (see mountns.py).

Its root, state, runc root and sockets are under the state dir; the CNI dirs are the usual
`/opt/cni/bin` and `/etc/cni/net.d` of the node's namespace (bound to the state dir), so the
DaemonSet installs into the directories the runtime reads, as on a real node. Network
namespaces are made under `/run/netns`, which is the state dir's `host/run/netns`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from e2e.harness.cluster import processes
from e2e.harness.cri import cleanup
from e2e.harness.cri.control import CRI_NAMESPACE, ContainerdControl, toml
from e2e.harness.cri.pause import PauseImage
from e2e.node.mountns import MountNamespace

NAME = "containerd"
READY_S = 60.0
IMPORT_S = 300.0
CNI_BIN_DIR = "/opt/cni/bin"
CNI_CONF_DIR = "/etc/cni/net.d"


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
    def control(self) -> ContainerdControl:
        """Its CRI client, `ctr` (inside the node's namespace), readiness and image import."""
        return ContainerdControl(self.socket,
                                 tuple(self.namespace.enter([str(self.binaries["ctr"])])))

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
            f"root = {toml(str(w / 'root'))}",
            f"state = {toml(str(w / 'state'))}",
            "disabled_plugins = " + toml([
                "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs",
                "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]),
            "[grpc]",
            f"  address = {toml(str(self.socket))}",
            "[ttrpc]",
            f"  address = {toml(str(self.socket) + '.ttrpc')}",
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
            f"  bin_dirs = {toml([CNI_BIN_DIR])}",
            f"  conf_dir = {toml(CNI_CONF_DIR)}",
            "  max_conf_num = 1",
            runtime + ".containerd]",
            '  default_runtime_name = "runc"',
            runtime + ".containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            runtime + ".containerd.runtimes.runc.options]",
            f"  BinaryName = {toml(str(self.binaries['runc']))}",
            f"  Root = {toml(str(self.runc_root))}",
            "  SystemdCgroup = false",
            images + "]",
            '  snapshotter = "overlayfs"',
            images + ".pinned_images]",
            f"  sandbox = {toml(self.pause.ref)}",
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
        control = self.control  # refuses a socket path too long
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config())
        argv = self.namespace.enter([str(self.binaries["containerd"]), "--config",
                                     str(self.config_path)])
        component = processes.start(NAME, argv, self.state_dir, self.environment())
        self.wait_ready(component)
        control.import_image(self.pause.archive, self.pause.ref, IMPORT_S)
        return component

    def restart(self, component: processes.Component) -> processes.Component:
        """Stop containerd (SIGTERM; Pods and shims keep running) and start it again."""
        started = processes.restart(component)
        self.wait_ready(started)
        return started

    def wait_ready(self, component: processes.Component) -> None:
        """Until the CRI answers and reports RuntimeReady (or containerd exits)."""
        self.control.wait_ready(READY_S, alive=component.check_alive)

    # -- teardown ----------------------------------------------------------------------------

    def remove_sandboxes(self) -> list[str]:
        """Stop and remove every sandbox through the CRI (each runs the CNI DEL)."""
        with self.control.client() as cri:
            return cleanup.remove_sandboxes(cri)

    def delete_containers(self) -> list[str]:
        """Containers runc still knows under our root (after containerd is gone)."""
        return cleanup.delete_containers(self.namespace.enter([str(self.binaries["runc"])]),
                                         self.runc_root / CRI_NAMESPACE)

    def kill_shims(self) -> list[str]:
        """Shims serving our socket (their command line names it)."""
        return cleanup.kill_shims(self.socket)
