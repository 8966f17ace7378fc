"""`vpc-attach agent`: serve the verbs on a Unix socket with warm clients and caches.

One thread per connection runs `dispatch.run` — the same code the executable runs in-process.
On SIGTERM/SIGINT the agent stops accepting (and removes its socket, so new invocations run
in-process meanwhile), lets in-flight verbs finish, then exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import stat
import threading
import time
from types import FrameType

from cni_plugin import dispatch
from cni_plugin.agent.client import socket_path
from cni_plugin.agent.protocol import (
    REFUSAL,
    ProtocolError,
    VersionMismatch,
    encode_reply,
    read_request,
)
from cni_plugin.agent.reaper import Reaper
from cni_plugin.agent.warm import WarmCluster
from cni_plugin.core import oplog
from cni_plugin.core.request import Request
from cni_plugin.verbs.environment import Environment

log = logging.getLogger(__name__)
DRAIN_SECONDS = 120.0
REAPER_DRAIN_SECONDS = 30.0
IDLE_READ_SECONDS = 10.0


class Agent:
    """The listening socket, the in-flight count, the warm cluster source and the reaper."""

    def __init__(self, path: str, cluster: WarmCluster, reaper: Reaper) -> None:
        self.path = path
        self.cluster = cluster
        self.reaper = reaper
        self.verbs = dispatch.plugin_verbs(Environment(cluster=cluster,
                                                       delete_retired_later=reaper.submit))
        self.stopping = threading.Event()
        self._inflight = 0
        self._cond = threading.Condition()
        self._listener = _bind(path)
        self._inode = os.stat(path).st_ino

    def serve(self) -> None:
        """Accept until stopped, then drain."""
        self._listener.settimeout(0.5)
        log.info("agent listening on %s (pid %d)", self.path, os.getpid())
        while not self.stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._start(conn)
        # Clients already queued in the backlog have sent their verb: serve them too.
        self._listener.setblocking(False)
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                break
            conn.setblocking(True)
            self._start(conn)
        self._listener.close()
        self._drain()

    def _start(self, conn: socket.socket) -> None:
        with self._cond:
            self._inflight += 1
        threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def stop(self) -> None:
        """Stop accepting now; in-flight verbs keep running."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._unlink()  # new invocations now run in-process; the serve loop drains the rest

    def _unlink(self) -> None:
        # Only our own socket file: a newer agent may already listen on the same path.
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    def _drain(self) -> None:
        give_up = time.monotonic() + DRAIN_SECONDS
        with self._cond:
            while self._inflight and time.monotonic() < give_up:
                log.info("agent stopping: waiting for %d in-flight verb(s)", self._inflight)
                self._cond.wait(timeout=1.0)
        self.reaper.drain(REAPER_DRAIN_SECONDS)  # pending link deletions, bounded
        self.cluster.close()
        log.info("agent stopped")

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IDLE_READ_SECONDS)
            try:
                environ, stdin = read_request(conn)
            except VersionMismatch as exc:
                log.info("refusing a client of another protocol version: %s", exc)
                conn.sendall(REFUSAL)
                return
            except (OSError, ProtocolError) as exc:
                log.info("dropping a connection: %s", exc)
                return
            request = _request(environ, stdin)
            oplog.configure(request)
            status, payload = dispatch.run(request, self.verbs)
            answer = json.dumps(payload).encode() if payload is not None else b""
            conn.settimeout(None)
            conn.sendall(encode_reply(status, answer))
        except OSError as exc:
            log.warning("could not answer a client: %s", exc)
        finally:
            conn.close()
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()


def _request(forwarded: dict[str, str], stdin: bytes) -> Request:
    # The agent's own VPC_ATTACH_* settings (from its DaemonSet) fill what the caller lacks.
    own = {k: v for k, v in os.environ.items() if k.startswith("VPC_ATTACH_")}
    return Request(environ={**own, **forwarded}, stdin=stdin)


def _bind(path: str) -> socket.socket:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise SystemExit(f"vpc-attach agent: {path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
            raise SystemExit(f"vpc-attach agent: another agent already listens on {path}")
        except OSError:
            os.unlink(path)  # stale socket of a dead agent
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)  # the runtime runs as root; nobody else may drive the plugin
    listener.listen(128)
    return listener


def _warm_up() -> None:
    # Import what every verb needs now, not on the first Pod.
    import cni_plugin.attachment
    import cni_plugin.publish.bgp
    import cni_plugin.publish.endpointslice
    import cni_plugin.verbs.add
    import cni_plugin.verbs.check
    import cni_plugin.verbs.delete
    import cni_plugin.verbs.gc
    import cni_plugin.verbs.status  # noqa: F401


def main(argv: list[str]) -> int:
    """`vpc-attach agent [--socket PATH]`."""
    parser = argparse.ArgumentParser(prog="vpc-attach agent", description=__doc__)
    parser.add_argument("--socket", help="Unix socket to listen on (default: "
                        "VPC_ATTACH_AGENT_SOCKET, the host file's agentSocket, "
                        "/run/vpc-attach/agent.sock)")
    args = parser.parse_args(argv)
    path = args.socket or socket_path(os.environ, b"")
    oplog.configure(Request(environ=dict(os.environ), stdin=b""))
    _warm_up()
    reaper = Reaper()
    # Before the socket exists: once it answers, a killed agent's retired links are gone (a
    # second agent's pending ones would be deleted early, which is all they wait for).
    reaper.sweep()
    agent = Agent(path, WarmCluster(), reaper)  # refuses to start next to a running agent
    reaper.start()  # from this thread: it is in the host netns

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("agent got signal %d", signum)
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.serve()
    return 0
