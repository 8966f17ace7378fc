"""The agent's HTTP endpoint (SPEC §12) on `VPC_ATTACH_METRICS_ADDRESS`: `/metrics` (the
library's exposition of the agent's registry), `/healthz` and `/readyz`.

- `/healthz`: 200 while the verb server accepts connections on its socket.
- `/readyz`: 200 only when, besides, the API server answered this probe and every watch cache
  the agent relies on is in sync; otherwise 503 with a one-line reason.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cni_plugin.agent.warm import WarmCluster
from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError
from netconf.errors import CniError

log = logging.getLogger(__name__)
METRICS_ADDRESS_ENV = "VPC_ATTACH_METRICS_ADDRESS"
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9471"
# A probe must answer within the kubelet's timeoutSeconds (5 s in packaging/daemonset).
API_PROBE_SECONDS = 2.0
SOCKET_PROBE_SECONDS = 1.0
REQUEST_READ_SECONDS = 10.0

Probe = Callable[[], "str | None"]  # None: healthy; else the one-line reason


def metrics_address(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """(host, port) to serve on: the environment's (empty: none), else the default.

    ValueError names a malformed value."""
    text = environ.get(METRICS_ADDRESS_ENV, DEFAULT_METRICS_ADDRESS).strip()
    return parse_address(text) if text else None


def parse_address(text: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `v6:port` (the last colon separates the port)."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{METRICS_ADDRESS_ENV}={text!r} is not host:port")
    return host, int(port)


class Probes:
    """Liveness and readiness of a running agent."""

    def __init__(self, agent_socket: str, accepting: Callable[[], bool], cluster: WarmCluster,
                 own_kubeconfig: str | None) -> None:
        self.agent_socket = agent_socket
        self.accepting = accepting
        self.cluster = cluster
        self.own_kubeconfig = own_kubeconfig

    def live(self) -> str | None:
        """Why the verb server does not accept connections, or None."""
        if not self.accepting():
            return "the verb server is not accepting connections"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(SOCKET_PROBE_SECONDS)
        try:
            probe.connect(self.agent_socket)
        except OSError as exc:
            return f"cannot connect to the agent socket {self.agent_socket}: {exc}"
        finally:
            probe.close()
        return None

    def ready(self) -> str | None:
        """Why the agent is not ready to serve verbs well, or None."""
        reason = self.live()
        if reason is not None:
            return reason
        kubeconfigs = [self.own_kubeconfig] if self.own_kubeconfig else \
            self.cluster.kubeconfigs()
        for kubeconfig in kubeconfigs:
            reason = self._api_answers(kubeconfig, required=kubeconfig == self.own_kubeconfig)
            if reason is not None:
                return reason
        unsynced = self.cluster.unsynced()
        if unsynced:
            return f"watch cache not in sync: {unsynced[0]}"
        return None

    def _api_answers(self, kubeconfig: str, required: bool) -> str | None:
        try:
            client = self.cluster.client(kubeconfig)
        except FileNotFoundError as exc:
            # A kubeconfig only a past request named is not the agent's to require.
            return f"kubeconfig {kubeconfig!r}: {exc.strerror}" if required else None
        except (OSError, CniError) as exc:
            return f"kubeconfig {kubeconfig!r} is not usable: {_one_line(exc)}"
        try:
            client.request("GET", "/version", Deadline(API_PROBE_SECONDS))
        except CniError as exc:
            return f"{exc.msg} ({_one_line(exc.details)})" if exc.details else exc.msg
        except ApiError as exc:
            return f"the API server answered GET /version with {exc.status} {exc.reason}"
        finally:
            self.cluster.release(kubeconfig, client)
        return None


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


class _Server4(ThreadingHTTPServer):
    daemon_threads = True  # a probe in flight never holds up the agent's exit


class _Server6(_Server4):
    address_family = socket.AF_INET6


class HealthServer:
    """The HTTP server, bound at construction (so a taken address fails the start), serving
    on a thread of its own once started."""

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry) -> None:
        self.registry = registry
        self.probes: Probes | None = None
        server_class = _Server6 if ":" in address[0] else _Server4
        self._server: ThreadingHTTPServer = server_class(address, _handler_for(self))
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """Where it listens, `host:port` (the real port when 0 was asked for)."""
        host, port = self._server.server_address[:2]
        host = str(host)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self, probes: Probes) -> None:
        """Serve with these probes."""
        self.probes = probes
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.5},
                                        name="vpc-attach-metrics", daemon=True)
        self._thread.start()
        log.info("agent serves /metrics, /healthz and /readyz on http://%s", self.address)

    def close(self) -> None:
        """Stop serving and release the address."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def answer(self, path: str, accept: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of path."""
        if path == "/metrics":
            encoder, content_type = choose_encoder(accept)
            return 200, content_type, encoder(self.registry)
        probe: Probe | None = None
        if self.probes is not None and path == "/healthz":
            probe = self.probes.live
        elif self.probes is not None and path == "/readyz":
            probe = self.probes.ready
        if probe is None:
            return 404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz, " \
                b"/readyz\n"
        reason = probe()
        if reason is None:
            return 200, "text/plain; charset=utf-8", b"ok\n"
        return 503, "text/plain; charset=utf-8", (_one_line(reason) + "\n").encode()


def _handler_for(server: HealthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_READ_SECONDS  # a client that sends nothing holds no thread for long
        server_version = "vpc-attach-agent"

        def do_GET(self) -> None:
            try:
                status, content_type, body = server.answer(self.path.split("?", 1)[0],
                                                           self.headers.get("Accept", ""))
            except Exception as exc:  # a failing collector or probe: a 500, not a dead thread
                log.exception("agent HTTP endpoint: %s failed", self.path)
                status, content_type = 500, "text/plain; charset=utf-8"
                body = f"{type(exc).__name__}: {exc}\n".encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("agent HTTP endpoint: " + format, *args)

    return Handler
