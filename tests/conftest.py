"""Shared test settings: no root, no network, no host state."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Other suites run on this machine at the same time; a slow first import must not fail a
# property test on its deadline.
settings.register_profile("vpc-attach", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("vpc-attach")


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    """A token kubeconfig for an API server that is not there (127.0.0.1:9)."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)


@pytest.fixture
def unix_listener(tmp_path: Path) -> Iterator[socket.socket]:
    """A listening Unix stream socket (at `getsockname()`) that nothing answers on."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "agent.sock"))
    listener.listen(8)
    yield listener
    listener.close()
