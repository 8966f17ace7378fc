"""`vpc-attach agent`: serve the verbs on a Unix socket with warm clients and caches.

One thread per connection runs `dispatch.run` — the same code the executable runs in-process.
Once a verb is answered, its metrics are counted and an ADD's Event is queued (`metrics.py`,
`events.py`); `/metrics`, `/healthz` and `/readyz` are served over HTTP (`health.py`).
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
from typing import TYPE_CHECKING

from cni_plugin import dispatch
from cni_plugin.agent.events import DENIED, EventRecorder, PodEvent
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
from cni_plugin.kube.events import truncated
from cni_plugin.policy.services import PolicyServices
from cni_plugin.tenancy import Denial
from cni_plugin.verbs.collaborators import Collaborators
from netconf.errors import CniError
from netconf.host import NodeSettings, lenient_host_settings, resolve_host_settings

if TYPE_CHECKING:
    from cni_plugin.agent.health import HealthServer
    from cni_plugin.agent.metrics import AgentMetrics
    from cni_plugin.agent.policies import PolicyKeeper
    from cni_plugin.kubevirt.claim_watch import DeletedClaimReleaser

log = logging.getLogger(__name__)
DRAIN_SECONDS = 120.0
REAPER_DRAIN_SECONDS = 30.0
EVENTS_DRAIN_SECONDS = 10.0
IDLE_READ_SECONDS = 10.0
SEND_SECONDS = 10.0
ACCEPT_POLL_SECONDS = 0.5
# The accept loop has gone round within this long, or the agent is not alive (/healthz).
ACCEPT_STALL_SECONDS = 10.0


class Agent:
    """The listening socket, the in-flight count, the warm cluster source, the reaper, and
    what hears about answered verbs (metrics, Events)."""

    def __init__(self, path: str, cluster: WarmCluster, reaper: Reaper,
                 metrics: AgentMetrics | None = None,
                 events: EventRecorder | None = None,
                 policy: PolicyServices | None = None) -> None:
        self.path = path
        self.cluster = cluster
        self.reaper = reaper
        self.metrics = metrics
        self.events = events
        self.verbs = dispatch.plugin_verbs(Collaborators(
            cluster=cluster, delete_retired_later=reaper.submit,
            rollback_finished=metrics.rollback_finished if metrics is not None else None,
            tenancy_denied=self._denied, migration_targets=cluster,
            policy=policy or PolicyServices()))
        self.stopping = threading.Event()
        self._inflight = 0
        self._cond = threading.Condition()
        self._listener = _bind(path)
        self._inode = os.stat(path).st_ino
        self._beat = time.monotonic()

    def _denied(self, denial: Denial) -> None:
        """An ADD no VPCBinding admitted: counted; under audit its Event is queued here (a
        refused one's comes with its answer, code 106)."""
        if self.metrics is not None:
            self.metrics.tenancy_denied(denial.mode)
        if self.events is not None and denial.mode == "audit" and denial.namespace and \
                denial.pod and denial.node:
            self.events.audited(PodEvent(denial.kubeconfig, denial.node, denial.namespace,
                                         denial.pod, denial.uid, DENIED, "Warning",
                                         truncated(denial.note)))

    def accepting(self) -> bool:
        """Whether the accept loop runs (for /healthz; the socket itself is probed too)."""
        return not self.stopping.is_set() and \
            time.monotonic() - self._beat < ACCEPT_STALL_SECONDS

    def serve(self) -> None:
        """Accept until stopped, then drain."""
        self._listener.settimeout(ACCEPT_POLL_SECONDS)
        log.info("agent listening on %s (pid %d)", self.path, os.getpid())
        while not self.stopping.is_set():
            self._beat = time.monotonic()
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
        if self.events is not None:
            self.events.drain(EVENTS_DRAIN_SECONDS)
        self.cluster.close()
        log.info("agent stopped")

    def _handle(self, conn: socket.socket) -> None:
        outcome: dispatch.Outcome | None = None
        try:
            outcome = self._serve(conn)
        finally:
            conn.close()  # the runtime has its answer; what follows is off its path
            if outcome is not None:
                self._after_answer(outcome)
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def _serve(self, conn: socket.socket) -> dispatch.Outcome | None:
        """Read one request, run its verb and answer; its outcome (also when the answer could
        not be sent: the verb ran)."""
        outcome: dispatch.Outcome | None = None
        try:
            conn.settimeout(IDLE_READ_SECONDS)
            try:
                if not conn.recv(1, socket.MSG_PEEK):
                    return None  # connected and closed: the liveness probe
                environ, stdin = read_request(conn)
            except VersionMismatch as exc:
                log.info("refusing a client of another protocol version: %s", exc)
                conn.sendall(REFUSAL)
                return None
            except (OSError, ProtocolError) as exc:
                log.info("dropping a connection: %s", exc)
                return None
            request = _request(environ, stdin)
            oplog.configure(request)
            outcome = dispatch.run(request, self.verbs)
            answer = json.dumps(outcome.payload).encode() if outcome.payload is not None else b""
            conn.settimeout(SEND_SECONDS)
            conn.sendall(encode_reply(outcome.status, answer))
        except OSError as exc:
            log.warning("could not answer a client: %s", exc)
        return outcome

    def _after_answer(self, outcome: dispatch.Outcome) -> None:
        """Count the verb and queue an ADD's Event, from its outcome (never raises into the
        verb thread)."""
        try:
            if self.metrics is not None:
                self.metrics.verb_answered(outcome.command, outcome.code, outcome.seconds)
                if outcome.command == "ADD" and outcome.status == 0 and \
                        outcome.invocation is not None:  # its dataDir passed the root check
                    self.metrics.pools.learn(outcome.invocation.raw)
            if self.events is not None:
                self.events.answered(outcome)
        except Exception:
            log.exception("agent: after answering %s", outcome.command)


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
    import cni_plugin.attachment.check
    import cni_plugin.attachment.create
    import cni_plugin.attachment.detach
    import cni_plugin.attachment.sid
    import cni_plugin.publish.bgp.advertisement
    import cni_plugin.publish.bgp.check
    import cni_plugin.publish.bgp.instance
    import cni_plugin.publish.bgp.router
    import cni_plugin.publish.endpointslice
    import cni_plugin.verbs.add
    import cni_plugin.verbs.check
    import cni_plugin.verbs.delete
    import cni_plugin.verbs.gc
    import cni_plugin.verbs.status  # noqa: F401


def _protect_host() -> None:
    """(Re)write the node's host protection with the current hostAccess and
    allowedSourcePrefixes (SPEC §14), before the first ADD can arrive."""
    from cni_plugin.attachment.node import set_up_node
    from netconf.host import resolve_datapath_settings
    try:
        host = resolve_host_settings({}, os.environ)
        adopted = set_up_node(resolve_datapath_settings(os.environ), host.lock_dir,
                              host.timeout_seconds)
        if adopted:
            log.info("adopted %d attachment(s) of an earlier version: %s", len(adopted),
                     ", ".join(adopted))
    except CniError as exc:
        raise SystemExit(f"vpc-attach agent: host protection: {exc.msg} ({exc.details})"
                         ) from None


def main(argv: list[str]) -> int:
    """`vpc-attach agent [--socket PATH]`."""
    from cni_plugin.agent.health import METRICS_ADDRESS_ENV, metrics_address

    parser = argparse.ArgumentParser(
        prog="vpc-attach agent", description=__doc__,
        epilog=f"{METRICS_ADDRESS_ENV}: host:port of /metrics, /healthz and /readyz "
        "(default 127.0.0.1:9471; empty: not served).")
    parser.add_argument("--socket", help="Unix socket to listen on (default: "
                        "VPC_ATTACH_AGENT_SOCKET, the host file's agentSocket, "
                        "/run/vpc-attach/agent.sock)")
    args = parser.parse_args(argv)
    path = args.socket or lenient_host_settings({}, os.environ).agent_socket
    oplog.configure(Request(environ=dict(os.environ), stdin=b""))
    try:
        address = metrics_address(os.environ)
    except ValueError as exc:
        raise SystemExit(f"vpc-attach agent: {exc}") from None
    _warm_up()
    reaper = Reaper()
    # Before the socket exists: once it answers, a killed agent's retired links are gone (a
    # second agent's pending ones would be deleted early, which is all they wait for).
    reaper.sweep()
    _protect_host()
    metrics = endpoint = None
    if address is not None:
        from cni_plugin.agent.metrics import AgentMetrics
        metrics = AgentMetrics(reaper.pending)
        endpoint = _bind_endpoint(address, metrics)
    cluster = WarmCluster(metrics.api_exchange if metrics is not None else None)
    keeper = _keep_policies(metrics)
    try:  # refuses to start next to a running agent
        agent = Agent(path, cluster, reaper, metrics, EventRecorder(cluster),
                      keeper.services() if keeper is not None else None)
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        if keeper is not None:
            keeper.stop()
        raise
    if keeper is not None:
        keeper.start()
    own_kubeconfig = _prime(cluster)
    releaser = _release_deleted_claims(own_kubeconfig, metrics)
    if endpoint is not None:
        from cni_plugin.agent.health import Probes
        endpoint.start(Probes(path, agent.accepting, cluster, own_kubeconfig))
    reaper.start()  # from this thread: it is in the host netns

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("agent got signal %d", signum)
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.serve()
    finally:
        if keeper is not None:
            keeper.stop()
        if releaser is not None:
            releaser.stop()
        if endpoint is not None:
            endpoint.close()
    return 0


def _release_deleted_claims(kubeconfig: str | None,
                            metrics: AgentMetrics | None) -> DeletedClaimReleaser | None:
    """Watch IPAMClaims with the agent's own kubeconfig and free deleted claims' addresses on
    this node (none without a kubeconfig: GC frees them then)."""
    from cni_plugin.ipam.plugin.config import node_data_root
    from cni_plugin.kube.config import load_kubeconfig
    from cni_plugin.kubevirt.claim_watch import DeletedClaimReleaser
    from netconf.host import NodeSettings
    if not kubeconfig:
        return None
    try:
        creds = load_kubeconfig(kubeconfig)
        root = node_data_root(NodeSettings.read(os.environ))
    except (OSError, CniError) as exc:
        log.warning("agent: deleted IPAMClaims' addresses are left to GC: %s",
                    getattr(exc, "msg", exc))
        return None
    observe = metrics.api_exchange if metrics is not None else None
    return DeletedClaimReleaser(creds, root, observe).start()


def _keep_policies(metrics: AgentMetrics | None) -> PolicyKeeper | None:
    """The policy keeper of the node (SPEC §17), with the agent's own kubeconfig, node name
    and lock directory; none without them (ADDs still enforce what they find, doctor says
    that later changes are not followed)."""
    from cni_plugin.agent.policies import PolicyKeeper
    from cni_plugin.kube.config import load_kubeconfig
    try:
        node = NodeSettings.read(os.environ)
        host, network_policy = node.host({}), node.policy.network_policy
        enforced = network_policy or node.policy.multi_network_policy
    except CniError as exc:
        log.warning("agent: policies not kept, host settings unusable: %s", exc.msg)
        return None
    if not enforced or not host.kubeconfig or not host.node_name:
        return None
    try:
        creds = load_kubeconfig(host.kubeconfig)
    except (OSError, CniError) as exc:
        log.warning("agent: policies not kept, kubeconfig %r: %s", host.kubeconfig,
                    getattr(exc, "msg", exc))
        return None
    return PolicyKeeper(creds, host.lock_dir, host.node_name,
                        network_policy=network_policy,
                        observe=metrics.api_exchange if metrics is not None else None,
                        synced=metrics.policy_synced if metrics is not None else None)


def _bind_endpoint(address: tuple[str, int], metrics: AgentMetrics) -> HealthServer:
    from cni_plugin.agent.health import METRICS_ADDRESS_ENV, HealthServer
    try:
        return HealthServer(address, metrics.registry)
    except OSError as exc:
        raise SystemExit(f"vpc-attach agent: cannot serve metrics on {address[0]}:{address[1]}"
                         f": {exc.strerror or exc} (another agent running? "
                         f"{METRICS_ADDRESS_ENV} sets the address, empty turns it off)") from None


def _prime(cluster: WarmCluster) -> str | None:
    """Start the watches of this node's routers and Pods when the agent's own settings name a
    kubeconfig and node (the DaemonSet's host file does); that kubeconfig, if any."""
    try:
        host = resolve_host_settings({}, os.environ)
    except CniError as exc:
        log.warning("agent: host settings unusable, watches start with the first Pod: %s",
                    exc.msg)
        return None
    if not host.kubeconfig or not host.node_name:
        return host.kubeconfig
    try:
        cluster.prime(host.kubeconfig, host.namespace, host.node_name, host.lock_dir)
    except (OSError, CniError) as exc:
        log.warning("agent: cannot watch with kubeconfig %r yet: %s", host.kubeconfig, exc)
    return host.kubeconfig
