"""Simulated nodes: each a network namespace the plugin runs in, with its own node name.

The API server listens on the host's loopback only, so each node namespace gets a small
forwarder: a socket listening on the node's 127.0.0.1 at the API server's port, relaying to the
host's. The plugin inside the node sees the same URL and certificate as on the host.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import urllib.parse
from collections.abc import Iterator

from cni_plugin.kernel.netns import entered
from e2e.harness.kernel import run_ip
from e2e.harness.kube import Kube

NODES = "/api/v1/nodes"


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _join(client: socket.socket, upstream: tuple[str, int]) -> None:
    try:
        server = socket.create_connection(upstream, timeout=10)
    except OSError:
        client.close()
        return
    server.settimeout(None)
    client.settimeout(None)
    threading.Thread(target=_pump, args=(server, client), daemon=True).start()
    _pump(client, server)


def _serve(listener: socket.socket, upstream: tuple[str, int], stop: threading.Event) -> None:
    """Accept until stopped; each connection is joined to upstream on a thread of its own, so a
    slow connect (qemu's user-mode network on a busy machine) holds up no other connection."""
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=_join, args=(client, upstream), daemon=True).start()


@contextlib.contextmanager
def node_namespace(api_port: int) -> Iterator[str]:
    """A netns acting as a node's host namespace, with the API server reachable inside."""
    name = f"vpa-node-{secrets.token_hex(3)}"
    run_ip("netns", "add", name)
    run_ip("-n", name, "link", "set", "lo", "up")
    path = f"/var/run/netns/{name}"
    with entered(path):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", api_port))
    try:
        with relay(listener, ("127.0.0.1", api_port)):
            yield name
    finally:
        run_ip("netns", "del", name, check=False)


@contextlib.contextmanager
def relay(listener: socket.socket, upstream: tuple[str, int]) -> Iterator[None]:
    """Relay every connection to ``listener`` (bound, not yet listening) to ``upstream``."""
    listener.listen(64)
    stop = threading.Event()
    thread = threading.Thread(target=_serve, args=(listener, upstream, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=2)


def in_node(name: str) -> list[str]:
    """argv prefix running a command inside the node namespace."""
    return ["ip", "netns", "exec", name]


def api_port(server: str) -> int:
    """The port of the API server URL."""
    port = urllib.parse.urlsplit(server).port
    assert port is not None
    return port


@contextlib.contextmanager
def node_objects(kube: Kube, count: int, prefix: str = "ipam-node") -> Iterator[list[str]]:
    """count Node objects (no kubelet behind them: only their names and UIDs are used)."""
    names = [f"{prefix}-{secrets.token_hex(3)}" for _ in range(count)]
    for name in names:
        kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield names
    finally:
        for name in names:
            kube.delete(f"{NODES}/{name}")
