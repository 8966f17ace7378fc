"""Reaching one containerd, whoever started it: its CRI client, `ctr`, the wait for
RuntimeReady and image import. Shared by the CRI tests' containerd (`containerd.py`) and the
node's (`e2e/node/runtime.py`); only their config templates and how they are started differ.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.cri.client import CriClient, CriError
from e2e.harness.wait import wait_until

CRI_NAMESPACE = "k8s.io"
SOCKET_PATH_LIMIT = 100  # sun_path is 108 bytes; containerd adds ".ttrpc" to a sibling
STATUS_TIMEOUT_S = 5.0


class ContainerdError(RuntimeError):
    """containerd could not be started, configured or stopped."""


def toml(value: str | int | bool | list[str]) -> str:
    """A TOML value (JSON strings are valid TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def check_socket_path(socket: Path) -> None:
    """Refuse a socket path a Unix socket cannot bind."""
    if len(str(socket)) > SOCKET_PATH_LIMIT:
        raise ContainerdError(f"socket path too long for a Unix socket: {socket}")


@dataclass(frozen=True)
class ContainerdControl:
    """One containerd's gRPC socket and how to run `ctr` against it (for the node: inside
    its mount namespace)."""

    socket: Path
    ctr_command: tuple[str, ...]
    cgroup_parent: str = ""  # for sandboxes run through client(); empty: the client's default

    def __post_init__(self) -> None:
        check_socket_path(self.socket)

    def client(self) -> CriClient:
        """A CRI client of this containerd (close it after use)."""
        return CriClient(self.socket, cgroup_parent=self.cgroup_parent)

    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        """Run `ctr` against this containerd in the CRI namespace; its stdout."""
        argv = [*self.ctr_command, "--address", str(self.socket), "--namespace", CRI_NAMESPACE,
                *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
        if proc.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def wait_ready(self, timeout: float, alive: Callable[[], None] | None = None,
                   detail: Callable[[], str] | None = None) -> None:
        """Until the socket exists and the CRI reports RuntimeReady; `alive` may raise to stop
        early (containerd exited), `detail` adds to a timeout's message (its log)."""
        def ready() -> bool:
            if not self.socket.exists():
                return False
            with self.client() as cri:
                try:
                    conditions, _ = cri.status(timeout=STATUS_TIMEOUT_S)
                except CriError:
                    return False
            return bool(conditions.get("RuntimeReady"))

        wait_until(f"containerd's CRI on {self.socket} RuntimeReady", ready, timeout,
                   interval=0.1, alive=alive, detail=detail)

    def import_image(self, archive: Path, ref: str, timeout: float) -> None:
        """`ctr images import` an OCI archive, then wait until the CRI image store has `ref`."""
        self.ctr("images", "import", str(archive), timeout=timeout)

        def present() -> bool:
            with self.client() as cri:
                return cri.image_present(ref)

        wait_until(f"image {ref} in the CRI", present, timeout, interval=0.1)
