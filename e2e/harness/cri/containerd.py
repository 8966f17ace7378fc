"""One containerd (Debian's, with runc) for tests, isolated from anything else on the machine.

Everything it owns lives under one work dir: root, state (sandbox netns mounts too), runc's
root, the gRPC socket, its config and log. It is started detached with the environment given
(the CNI plugins it runs inherit it) and stopped exactly: sandboxes removed through the CRI
(so CNI DEL runs), SIGTERM then SIGKILL to the pid we started (checked against
/proc/PID/cmdline), leftover containers deleted with runc on our root, leftover shims of our
socket killed, and leftover mounts under the work dir unmounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from e2e.harness.cri import cleanup
from e2e.harness.cri.client import CriClient
from e2e.harness.cri.control import (
    CRI_NAMESPACE,
    ContainerdControl,
    ContainerdError,
    check_socket_path,
    toml,
)
from e2e.harness.cri.pause import PauseImage
from e2e.harness.wait import wait_until

START_TIMEOUT = 30.0
STOP_GRACE = 10.0

__all__ = ["CniSettings", "Containerd", "ContainerdError"]


def _binary(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise ContainerdError(f"`{name}` is not installed (apt-get install containerd runc)")
    return found


@dataclass(frozen=True)
class CniSettings:
    """Where the CRI plugin finds CNI plugins and network configs."""

    bin_dir: Path
    conf_dir: Path
    max_conf_num: int = 1


class Containerd:
    """A test-owned containerd: `with Containerd(...) as runtime: runtime.client...`."""

    def __init__(self, workdir: Path, cni: CniSettings, pause: PauseImage,
                 env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.cni = cni
        self.pause = pause
        self.env = dict(env or {})
        self.socket = workdir / "containerd.sock"
        self.config_path = workdir / "config.toml"
        self.log_path = workdir / "containerd.log"
        self.runc_root = workdir / "runc"
        # Sandboxes get this cgroup parent (not containerd's default /k8s.io), removed on stop.
        self.cgroup_parent = f"/vpc-attach-e2e-{secrets.token_hex(4)}"
        self._process: subprocess.Popen[bytes] | None = None
        self._client: CriClient | None = None
        self._control: ContainerdControl | None = None
        check_socket_path(self.socket)

    @property
    def control(self) -> ContainerdControl:
        """Its CRI, `ctr`, readiness and image import (shared with the node's containerd)."""
        if self._control is None:
            raise ContainerdError("containerd is not started")
        return self._control

    @property
    def client(self) -> CriClient:
        """The CRI client of this containerd (after start)."""
        if self._client is None:
            raise ContainerdError("containerd is not running")
        return self._client

    @property
    def pid(self) -> int | None:
        """The pid of the containerd we started, while it runs."""
        return self._process.pid if self._process and self._process.poll() is None else None

    def config(self) -> str:
        """containerd's config.toml (version 2)."""
        w = self.workdir
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return "\n".join([
            "version = 2",
            f"root = {toml(str(w / 'root'))}",
            f"state = {toml(str(w / 'state'))}",
            "disabled_plugins = " + toml([
                "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]),
            "[grpc]",
            f"  address = {toml(str(self.socket))}",
            "[ttrpc]",
            f"  address = {toml(str(self.socket) + '.ttrpc')}",
            "[debug]",
            '  address = ""',
            '  level = "info"',
            "[metrics]",
            '  address = ""',
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {toml(str(w / 'opt'))}",
            cri + "]",
            f"  sandbox_image = {toml(self.pause.ref)}",
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",  # sandbox netns under our state dir
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "  disable_apparmor = true",
            "  enable_selinux = false",
            cri + ".cni]",
            f"  bin_dir = {toml(str(self.cni.bin_dir))}",
            f"  conf_dir = {toml(str(self.cni.conf_dir))}",
            f"  max_conf_num = {self.cni.max_conf_num}",
            '  conf_template = ""',
            cri + ".containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            cri + ".containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            cri + ".containerd.runtimes.runc.options]",
            f"  BinaryName = {toml(_binary('runc'))}",
            f"  Root = {toml(str(self.runc_root))}",
            "  SystemdCgroup = false",
            "",
        ])

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Containerd:
        """Start containerd, wait for its CRI, import the pause image."""
        if self._process is not None:
            raise ContainerdError("already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cni.conf_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config())
        self._control = ContainerdControl(self.socket, (_binary("ctr"),), self.cgroup_parent)
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(self.workdir), **self.env}
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [_binary("containerd"), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True, preexec_fn=_term_with_parent)
        try:
            self._wait_ready()
            self.import_image(self.pause)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        self.control.wait_ready(START_TIMEOUT, alive=self._check_alive, detail=self.log_tail)
        self._client = self.control.client()

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise ContainerdError(f"containerd exited with status {self._process.returncode}\n"
                                  + self.log_tail())

    def ctr(self, *args: str, timeout: float = 60) -> str:
        """Run `ctr` against this containerd in the CRI namespace."""
        return self.control.ctr(*args, timeout=timeout)

    def import_image(self, image: PauseImage) -> None:
        """`ctr images import` the archive, then wait until the CRI image store has it."""
        self.control.import_image(image.archive, image.ref, START_TIMEOUT)

    def wait_networks(self, sources: list[dict[str, Any]], timeout: float = 30) -> None:
        """Wait until the CRI has loaded exactly these conflists (after a conf dir change)."""
        wanted = [json.dumps(source, sort_keys=True) for source in sources]
        loaded: list[str] = []

        def exactly_these() -> bool:
            _, info = self.client.status()
            networks = info.get("cniconfig", {}).get("Networks") or []
            loaded[:] = [json.dumps(json.loads(n["Config"]["Source"]), sort_keys=True)
                         for n in networks if n.get("IFName") != "lo"]
            return loaded == wanted

        wait_until("the CRI to load exactly these CNI configs", exactly_these, timeout,
                   interval=0.1, detail=lambda: f"loaded: {loaded}")

    def log_tail(self, lines: int = 40) -> str:
        """The end of containerd's log (for error messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> list[str]:
        """Stop exactly what start() started; returns the problems met on the way."""
        problems: list[str] = []
        if self._client is not None and self.pid is not None:
            problems += self._remove_sandboxes()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._process is not None:
            problems += self._terminate(self._process)
            self._process = None
        problems += self._delete_containers()
        problems += self._kill_shims()
        problems += self._unmount_all()
        problems += self._remove_cgroups()
        return problems

    def __enter__(self) -> Containerd:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    # -- teardown ----------------------------------------------------------------------------

    def _remove_sandboxes(self) -> list[str]:
        return cleanup.remove_sandboxes(self.client)

    def _terminate(self, process: subprocess.Popen[bytes]) -> list[str]:
        if process.poll() is not None:
            return []
        if str(self.config_path) not in cleanup.cmdline(process.pid):
            return [f"pid {process.pid} is no longer our containerd; not signalled"]
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_GRACE)
            return [f"containerd {process.pid} ignored SIGTERM; killed"]
        return []

    def _delete_containers(self) -> list[str]:
        """Containers still known to runc under our root (a sandbox we could not remove)."""
        return cleanup.delete_containers([_binary("runc")], self.runc_root / CRI_NAMESPACE)

    def _kill_shims(self) -> list[str]:
        """Shims serving our socket only."""
        return cleanup.kill_shims(self.socket)

    def _unmount_all(self) -> list[str]:
        """Mounts under the work dir (netns, shm, rootfs) left by a crash; deepest first."""
        problems = []
        for target in sorted(_mounts_under(self.workdir), key=len, reverse=True):
            proc = subprocess.run(["umount", "--lazy", target], capture_output=True, text=True,
                                  timeout=30, check=False)
            problems.append(f"left-over mount {target} unmounted"
                            + (f" ({proc.stderr.strip()})" if proc.returncode else ""))
        return problems

    def _remove_cgroups(self) -> list[str]:
        """Our cgroup parent in every hierarchy (v1 and v2); children first if any were left."""
        problems = []
        relative = self.cgroup_parent.lstrip("/")
        root = Path("/sys/fs/cgroup")
        hierarchies = [root, *(h for h in root.iterdir() if h.is_dir())] if root.is_dir() else []
        for hierarchy in hierarchies:
            parent = hierarchy / relative
            if not parent.is_dir():
                continue
            leftovers = sorted((d for d in parent.rglob("*") if d.is_dir()),
                               key=lambda d: len(d.parts), reverse=True)
            for directory in [*leftovers, parent]:
                try:
                    directory.rmdir()
                except OSError as exc:
                    problems.append(f"cgroup {directory}: {exc}")
            if leftovers:
                problems.append(f"left-over cgroups under {parent} removed")
        return problems


def _term_with_parent() -> None:
    """In the child: SIGTERM if the test process dies, so no containerd outlives its tests."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve()) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target.startswith(prefix):
            found.append(target)
    return found
