"""The API client against a scripted HTTP server on loopback: which requests it repeats after a
lost answer, and how it honours Retry-After inside the deadline."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube import client as kube_client
from cni_plugin.kube.client import (
    CREATED_BY_ANNOTATION,
    KubeClient,
    Resource,
    Target,
    repeatable,
    update_with_retry,
)
from cni_plugin.kube.config import load_kubeconfig
from netconf.errors import TRY_AGAIN_LATER, CniError

# What the server does with the n-th request: ("drop",) closes the connection without an
# answer; (status, headers, body) answers.
Action = tuple[Any, ...]


class Scripted(http.server.ThreadingHTTPServer):
    """Answers requests from a script and records (method, path) of each."""

    def __init__(self, script: list[Action]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.script = script
        self.seen: list[tuple[str, str]] = []


class Handler(http.server.BaseHTTPRequestHandler):
    server: Scripted

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, self.path))
        action = self.server.script.pop(0) if self.server.script else (200, {}, {})
        if action[0] == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        status, headers, body = action
        data = json.dumps(body).encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[list[Action]], tuple[Scripted, KubeClient]]]:
    servers: list[Scripted] = []

    def start(script: list[Action]) -> tuple[Scripted, KubeClient]:
        server = Scripted(script)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        config = tmp_path / f"kubeconfig-{len(servers)}"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\n")
        return server, KubeClient(load_kubeconfig(str(config)))

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def marked(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "metadata": {"name": "x", "annotations": {CREATED_BY_ANNOTATION: "c/eth0/1"}}}


def test_a_create_without_the_created_by_mark_is_not_repeated_after_a_lost_answer(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]]) -> None:
    server, client = serve([("drop",)])
    with pytest.raises(CniError) as caught:
        client.request("POST", "/api/v1/namespaces/a/configmaps", Deadline(10),
                       body={"metadata": {"name": "x"}})
    assert caught.value.code == TRY_AGAIN_LATER and "not repeated" in caught.value.details
    assert [method for method, _ in server.seen] == ["POST"]


def test_a_marked_create_is_repeated_after_a_lost_answer(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]]) -> None:
    server, client = serve([("drop",), (201, {}, {"metadata": {"uid": "u1"}})])
    created = client.request("POST", "/api/v1/namespaces/a/configmaps", Deadline(10),
                             body=marked({}))
    assert created == {"metadata": {"uid": "u1"}}
    assert [method for method, _ in server.seen] == ["POST", "POST"]


def test_a_dry_run_create_is_repeated_after_a_lost_answer_it_stored_nothing(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]]) -> None:
    server, client = serve([("drop",), (201, {}, {"metadata": {"name": "x"}})])
    answer = client.create(MAPS, {"metadata": {"name": "x"}}, namespace="a",
                           deadline=Deadline(10), dry_run=True)
    assert answer == {"metadata": {"name": "x"}}
    assert server.seen == [("POST", "/api/v1/namespaces/a/configmaps?dryRun=All")] * 2


def test_retry_after_is_honoured_when_it_fits_in_the_deadline(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(kube_client, "pause_between_tries", waits.append)
    _, client = serve([(429, {"Retry-After": "3"}, {}), (200, {}, {"ok": True})])
    assert client.request("GET", "/api/v1/pods", Deadline(10)) == {"ok": True}
    assert waits == [3.0]


def test_retry_after_beyond_the_deadline_fails_now_with_code_11(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(kube_client, "pause_between_tries", waits.append)
    server, client = serve([(503, {"Retry-After": "60"}, {})])
    with pytest.raises(CniError) as caught:
        client.request("GET", "/api/v1/pods", Deadline(5))
    assert caught.value.code == TRY_AGAIN_LATER and "retry after 60s" in caught.value.details
    assert waits == [] and len(server.seen) == 1


def test_an_unmarked_write_refused_with_429_is_repeated_the_server_did_not_act(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "pause_between_tries", lambda _: None)
    server, client = serve([(429, {}, {}), (201, {}, {"done": 1})])
    assert client.request("POST", "/api/v1/namespaces/a/configmaps", Deadline(10),
                          body={"metadata": {"name": "x"}}) == {"done": 1}
    assert len(server.seen) == 2


@pytest.mark.parametrize(("method", "body", "safe"), [
    ("GET", None, True),
    ("POST", {"metadata": {"name": "x"}}, False),
    ("POST", marked({}), True),
    ("POST", {"kind": "SelfSubjectAccessReview"}, True),
    ("PUT", {"metadata": {"name": "x"}}, False),
    ("PUT", {"metadata": {"name": "x", "resourceVersion": "7"}}, True),
    ("DELETE", {"preconditions": {}}, False),
    ("DELETE", {"preconditions": {"uid": "u"}}, True),
    ("PATCH", {"metadata": {"resourceVersion": "7"}}, False),
])
def test_only_writes_a_second_copy_cannot_harm_are_repeatable(
        method: str, body: dict[str, Any] | None, safe: bool) -> None:
    assert repeatable(method, body) is safe
    assert repeatable(method, body, {"dryRun": "All"}), "a dry run changes nothing"


MAPS = Resource("", "v1", "configmaps", "ConfigMap")


def _versioned(version: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": "m", "resourceVersion": version}, "data": data}


def _add_key(obj: dict[str, Any]) -> bool:
    obj["data"]["mine"] = "1"
    return True


def test_an_update_from_the_callers_read_writes_without_reading_again(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]]) -> None:
    read = _versioned("5")
    server, client = serve([(200, {}, _versioned("6", mine="1"))])
    updated = update_with_retry(client, MAPS, "m", namespace="a", deadline=Deadline(10),
                                mutate=_add_key, read=read)
    assert updated == _versioned("6", mine="1")
    assert [method for method, _ in server.seen] == ["PUT"]
    assert read == _versioned("5"), "the caller's read is not edited"


def test_a_stale_read_costs_a_conflict_and_a_fresh_read(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "pause_between_tries", lambda _: None)
    server, client = serve([(409, {}, {}), (200, {}, _versioned("7", other="x")),
                            (200, {}, _versioned("8", other="x", mine="1"))])
    update_with_retry(client, MAPS, "m", namespace="a", deadline=Deadline(10),
                      mutate=_add_key, read=_versioned("5"))
    assert [method for method, _ in server.seen] == ["PUT", "GET", "PUT"]


def test_a_read_of_an_object_deleted_since_ends_in_none(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]]) -> None:
    server, client = serve([(404, {}, {}), (404, {}, {})])
    assert update_with_retry(client, MAPS, "m", namespace="a", deadline=Deadline(10),
                             mutate=_add_key, read=_versioned("5")) is None
    assert [method for method, _ in server.seen] == ["PUT", "GET"]


def test_a_subresource_update_writes_there_and_rereads_the_object_after_a_conflict(
        serve: Callable[[list[Action]], tuple[Scripted, KubeClient]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "pause_between_tries", lambda _: None)
    server, client = serve([(409, {}, {}), (200, {}, _versioned("7")),
                            (200, {}, _versioned("8", mine="1"))])
    update_with_retry(client, MAPS, "m", namespace="a", deadline=Deadline(10),
                      mutate=_add_key, read=_versioned("5"), subresource="status")
    assert server.seen == [("PUT", "/api/v1/namespaces/a/configmaps/m/status"),
                           ("GET", "/api/v1/namespaces/a/configmaps/m"),
                           ("PUT", "/api/v1/namespaces/a/configmaps/m/status")]


def test_a_subresource_target_names_it_in_errors() -> None:
    target = Target(MAPS, "a", "m", "status")
    assert target.path() == "/api/v1/namespaces/a/configmaps/m/status"
    assert target.describe("PUT") == "update ConfigMap a/m/status"
