"""The agent's WarmCluster: API clients pooled across verb threads, watches started once."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.agent import warm
from cni_plugin.agent.warm import WarmCluster
from cni_plugin.kube import watch
from cni_plugin.kube.client import KubeClient, Resource


def on_another_thread(cluster: WarmCluster, kubeconfig: str) -> KubeClient:
    got: list[KubeClient] = []
    thread = threading.Thread(target=lambda: got.append(cluster.client(kubeconfig)))
    thread.start()
    thread.join(10)
    return got[0]


def test_a_released_client_serves_the_next_verb_on_another_thread(kubeconfig: str) -> None:
    cluster = WarmCluster()
    first = cluster.client(kubeconfig)
    assert on_another_thread(cluster, kubeconfig) is not first  # in use: a second one
    cluster.release(kubeconfig, first)
    assert on_another_thread(cluster, kubeconfig) is first


def test_a_changed_kubeconfig_retires_pooled_clients(kubeconfig: str) -> None:
    cluster = WarmCluster()
    old = cluster.client(kubeconfig)
    cluster.release(kubeconfig, old)
    stat = os.stat(kubeconfig)
    os.utime(kubeconfig, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    new = cluster.client(kubeconfig)
    assert new is not old and new.creds is not old.creds


def test_the_pool_keeps_at_most_max_idle_clients(kubeconfig: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "MAX_IDLE_CLIENTS", 2)
    cluster = WarmCluster()
    clients = [cluster.client(kubeconfig) for _ in range(3)]
    for client in clients:
        cluster.release(kubeconfig, client)
    again = {id(cluster.client(kubeconfig)) for _ in range(3)}
    assert len(again & {id(c) for c in clients}) == 2


def test_racing_first_uses_start_one_watch(kubeconfig: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []

    class CountingWatch:
        def __init__(self, _creds: object, resource: Resource, _selector: str,
                     _observe: object = None, _absent_ok: bool = False, *,
                     namespace: str | None = None, **_listeners: object) -> None:
            self.path = resource.path(namespace)

        def start(self) -> CountingWatch:
            started.append(self.path)
            return self

        def get(self, *_: str) -> None:
            return None

    monkeypatch.setattr(warm, "WatchCache", CountingWatch)
    cluster = WarmCluster()
    barrier = threading.Barrier(8)

    def first_use() -> None:
        barrier.wait(10)
        cluster.watch_pods(kubeconfig, "node-1")

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(started) == 1


def test_knowing_the_nodes_router_starts_the_watch_of_its_vrf_instances(
        kubeconfig: str, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[str, str]] = []

    class SyncedWatch:
        def __init__(self, _creds: object, resource: Resource, selector: str,
                     _observe: object = None, _absent_ok: bool = False, *,
                     namespace: str | None = None, **_listeners: object) -> None:
            self.path, self.selector = resource.path(namespace), selector

        def start(self) -> SyncedWatch:
            started.append((self.path, self.selector))
            return self

        def items(self) -> list[dict[str, Any]] | None:
            if self.path.endswith("/bgprouters"):
                return [{"metadata": {"name": "router-node-1"}}]
            return []

    monkeypatch.setattr(warm, "WatchCache", SyncedWatch)
    cluster = WarmCluster()
    session = cluster.session(kubeconfig)
    assert session.routers("galactic-system", "node-1") is not None
    assert started[1] == ("/apis/network.datumapis.com/v1alpha1/namespaces/galactic-system/"
                          "bgpvrfinstances", "spec.routerRef.name=router-node-1")
    session.routers("galactic-system", "node-1")
    assert len(started) == 2, "each watch is started once"


def _kubeconfig_for(template: str, server: str) -> str:
    path = Path(template).with_name("kubeconfig-silent")
    path.write_text(Path(template).read_text().replace("http://127.0.0.1:9", server))
    return str(path)


def test_a_watch_on_its_first_list_is_not_reported_out_of_sync_until_the_grace_ends(
        kubeconfig: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readiness right after the verb that started a watch: still listing is not a failure."""
    with socket.socket() as silent:  # accepts, never answers: the first list is in flight
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        silent_config = _kubeconfig_for(kubeconfig, f"http://127.0.0.1:{silent.getsockname()[1]}")
        cluster = WarmCluster()
        try:
            cache = cluster.watch_pods(silent_config, "node-1")
            assert cluster.unsynced() == []
            monkeypatch.setattr(watch, "FIRST_LIST_GRACE_SECONDS", 0.0)
            assert cluster.unsynced() == [cache.describe()]
        finally:
            cluster.close()



def test_an_absent_kubeconfig_is_code_7_through_the_agent_as_in_process(tmp_path: Path) -> None:
    from netconf.errors import INVALID_CONFIG, CniError
    absent = str(tmp_path / "absent.kubeconfig")
    with pytest.raises(CniError) as refused:
        WarmCluster().client(absent)
    assert refused.value.code == INVALID_CONFIG
    assert refused.value.msg == f"cannot read kubeconfig {absent!r}"
