"""The node's own mount namespace: host paths a node writes, backed by the state dir.

kubelet, containerd and the DaemonSet Pod see the usual host paths (`/opt/cni/bin`,
`/etc/cni/net.d`, `/etc/vpc-attach`, `/run`, `/var/lib/cni`, ...), so `packaging/` is applied as
shipped; but in this namespace those paths are bind mounts of directories under the state dir,
and the trees that hold them (`/etc`, `/opt`, `/var/lib`, `/var/log`) are overlays whose upper
layer is in the state dir too. Nothing is created on the host: the mounts live only here and
vanish with the namespace, whose last process is the holder that `down` stops.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.cluster import processes
from e2e.harness.wait import wait_until

log = logging.getLogger(__name__)

HOLDER = "mount-namespace"
COMMAND_TIMEOUT_S = 30.0
# Trees made writable through an overlay, so that mount points can be created below them.
OVERLAID = ("/etc", "/opt", "/var/lib", "/var/log")
# Node path -> directory under the state dir's `host/`, bound over it (the test reads these).
BOUND = {
    "/run": "run",
    "/opt/cni/bin": "cni/bin",
    "/etc/cni/net.d": "cni/net.d",
    "/etc/vpc-attach": "etc/vpc-attach",
    "/var/lib/cni": "var/lib/cni",
    "/var/lib/vpc-attach": "var/lib/vpc-attach",
    "/var/log/vpc-attach": "var/log/vpc-attach",
    "/var/log/pods": "var/log/pods",
    "/var/log/containers": "var/log/containers",
}


class MountNamespaceError(RuntimeError):
    """A mount in the node's namespace failed; the message names it."""


@dataclass(frozen=True)
class MountNamespace:
    """The holder process's mount namespace and the host directories behind its paths."""

    state_dir: Path
    holder_pid: int

    @property
    def host_root(self) -> Path:
        """Where the node's bound paths live on the host (`host/cni/bin`, ...)."""
        return self.state_dir / "host"

    def host_path(self, node_path: str) -> Path:
        """The host directory behind a bound node path (e.g. `/opt/cni/bin`)."""
        return self.host_root / BOUND[node_path]

    def enter(self, argv: list[str]) -> list[str]:
        """`argv` run inside this mount namespace (nsenter execs it: same pid)."""
        return ["nsenter", f"--mount=/proc/{self.holder_pid}/ns/mnt", "--", *argv]

    def run(self, argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> str:
        """Run a command inside the namespace; its stdout, or MountNamespaceError."""
        proc = subprocess.run(self.enter(argv), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        if proc.returncode != 0:
            raise MountNamespaceError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout


def create(state_dir: Path) -> MountNamespace:
    """Start the holder in a new private mount namespace and mount the node's paths in it."""
    # The holder's command line names the state dir, so `processes.stop` recognises it.
    holder = processes.start(
        HOLDER,
        ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c",
         "import signal; signal.pause()", str(state_dir / "node")],
        state_dir,
    )
    namespace = MountNamespace(state_dir, holder.pid)
    _wait_unshared(holder)
    for tree in OVERLAID:
        layer = state_dir / "overlay" / tree.strip("/").replace("/", "-")
        (layer / "upper").mkdir(parents=True, exist_ok=True)
        (layer / "work").mkdir(parents=True, exist_ok=True)
        namespace.run(["mount", "-t", "overlay", "overlay", "-o",
                       f"lowerdir={tree},upperdir={layer / 'upper'},workdir={layer / 'work'}",
                       tree])
    for node_path, relative in BOUND.items():
        source = namespace.host_root / relative
        source.mkdir(parents=True, exist_ok=True)
        namespace.run(["mkdir", "-p", node_path])
        namespace.run(["mount", "--bind", str(source), node_path])
    # Shared inside this namespace only (its peer groups are new): kubelet's volumes and the
    # netns mounts containerd makes under /run/netns reach containers (HostToContainer).
    namespace.run(["mount", "--make-rshared", "/"])
    log.info("mount namespace of pid %d: %s", holder.pid, ", ".join(BOUND))
    return namespace


def attach(state_dir: Path) -> MountNamespace | None:
    """The namespace an earlier `create` made in `state_dir`, if its holder still runs."""
    pid = processes.read_pid(state_dir, HOLDER)
    if pid is None or not processes.is_ours(pid, state_dir):
        return None
    return MountNamespace(state_dir, pid)


def _wait_unshared(holder: processes.Component) -> None:
    """Until the holder runs in its own namespace (unshare has exec'd the sleeper)."""
    own = os.readlink("/proc/self/ns/mnt")

    def unshared() -> bool:
        cmdline = Path(f"/proc/{holder.pid}/cmdline").read_bytes()
        return os.readlink(f"/proc/{holder.pid}/ns/mnt") != own and \
            not cmdline.startswith(b"unshare")

    wait_until(f"pid {holder.pid} in its own mount namespace", unshared, COMMAND_TIMEOUT_S,
               interval=0.02, alive=holder.check_alive)
