"""GC of the VPC's BGPVRFInstance on this node (issue 10, SPEC §7): the rule deciding what it
keeps, and the delete against a scripted API server (preconditions, users, the instance lock);
and the VRF-ID check an ADD makes on an instance it found (the agent's cache, then a fresh
list before any move)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation, Request
from cni_plugin.kube.client import CREATED_BY_ANNOTATION
from cni_plugin.kube.session import ClusterSession, ClusterSource, ColdCluster, ColdSession
from cni_plugin.publish.bgp import instance as bgp_instance
from cni_plugin.publish.bgp.spec import live_containers
from cni_plugin.publish.context import PublishContext, Router
from cni_plugin.publish.resources import NETNS_KEY, NODE_KEY, SUBNET_V6_KEY
from netconf.errors import TRY_AGAIN_LATER, CniError

VPC = "10"  # hex 3e
NODE = "worker-1"
ROUTER = Router("router-worker-1", 65000, None, None)
TARGET = [{"value": naming.route_target(65000, VPC)}]
NAME = naming.vrf_instance_name(VPC, NODE)


def instance(mark: str | None = "gone/eth0/a1b2", **spec: Any) -> dict[str, Any]:
    """An instance as ADD creates it (with overrides)."""
    annotations = {CREATED_BY_ANNOTATION: mark} if mark is not None else {}
    return {"metadata": {"name": NAME, "uid": "u1", "resourceVersion": "7",
                         "annotations": annotations},
            "spec": {"routerRef": {"name": ROUTER.name}, "vrfID": 3,
                     "importRouteTargets": TARGET, "exportRouteTargets": TARGET, **spec}}


def keeps(obj: dict[str, Any], valid: set[tuple[str, str]] | None = None,
          attached: set[tuple[str, str]] | None = None) -> str | None:
    return bgp_instance.gc_keeps_instance(obj, ROUTER, VPC, valid or set(), attached or set())


# The rule ------------------------------------------------------------------------------------

def test_an_instance_vpc_attach_created_for_a_gone_attachment_is_left_to_the_users_check() -> None:
    assert keeps(instance()) is None


def test_an_instance_without_the_created_by_mark_is_kept() -> None:
    assert keeps(instance(mark=None)) == "vpc-attach did not create it"


@pytest.mark.parametrize("mark", ["gone", "gone/eth0", "a/b/c/d", ""])
def test_an_unreadable_mark_is_kept(mark: str) -> None:
    assert "unreadable" in str(keeps(instance(mark=mark)))


def test_an_instance_of_another_router_is_kept() -> None:
    assert "router" in str(keeps(instance(routerRef={"name": "router-elsewhere"})))


@pytest.mark.parametrize("spec", [
    {"nptv6": {"publicPrefix": "2001:db8::/48"}},
    {"importRouteTargets": [*TARGET, {"value": "65000:4242"}]},
    {"exportRouteTargets": []},
])
def test_an_instance_another_writer_added_to_is_kept(spec: dict[str, Any]) -> None:
    assert keeps(instance(**spec)) == "another writer has added to it"


def test_an_instance_whose_creator_is_valid_is_kept() -> None:
    """An ADD in flight, or an L2-only tap (no advertisement names the instance)."""
    reason = keeps(instance(), valid={("gone", "eth0")})
    assert reason == "the attachment that created it (gone/eth0) is valid"
    assert keeps(instance(), valid={("gone", "net1"), ("other", "eth0")}) is None


def test_an_instance_is_kept_while_any_attachment_of_the_vpc_is_on_this_node() -> None:
    """Another container's tap found it: the creator is gone, no advertisement names it."""
    reason = keeps(instance(), attached={("vm-2", "eth0")})
    assert reason == "attachment vm-2/eth0 of the VPC is on this node"


def test_live_containers_are_this_nodes_whose_netns_is_there(tmp_path: Path) -> None:
    live = tmp_path / "netns-live"
    live.touch()
    annotations = {NODE_KEY + "a": NODE, NETNS_KEY + "a": str(live),
                   NODE_KEY + "b": NODE, NETNS_KEY + "b": str(tmp_path / "gone"),
                   NODE_KEY + "c": "worker-2", NETNS_KEY + "c": str(live),
                   SUBNET_V6_KEY + "d": "fd00::/96"}
    assert live_containers(annotations, NODE) == {"a"}


# Against a scripted API server ---------------------------------------------------------------

class Scripted(http.server.ThreadingHTTPServer):
    """Answers GET/DELETE of the instance and LISTs of advertisements from its state."""

    def __init__(self, current: dict[str, Any] | None, on_router: list[dict[str, Any]],
                 everywhere: list[dict[str, Any]], delete_status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.current = current
        self.on_router = on_router
        self.everywhere = everywhere
        self.delete_status = delete_status
        self.seen: list[tuple[str, str, Any]] = []


class Handler(http.server.BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.server.seen.append(("GET", self.path, None))
        if "/bgpvrfinstances/" in self.path:
            found = self.server.current
            self._answer(200 if found else 404, found or {"kind": "Status", "code": 404})
        elif "fieldSelector" in self.path:
            self._answer(200, {"items": self.server.on_router})
        else:
            self._answer(200, {"items": self.server.everywhere})

    def do_DELETE(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.seen.append(("DELETE", self.path, body))
        self._answer(self.server.delete_status, {"kind": "Status"})

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[list[Scripted]]:
    servers: list[Scripted] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def context(tmp_path: Path, servers: list[Scripted], server: Scripted,
            source: ClusterSource | None = None) -> PublishContext:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n")
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "vpc-attach", "vpc": VPC,
            "vpcattachment": "1", "attachment": "tap"}
    inv = Invocation.parse(Request({"CNI_COMMAND": "GC", "CNI_PATH": "/nonexistent",
                                    "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent.json"),
                                    "VPC_ATTACH_LOCK_DIR": str(tmp_path / "locks"),
                                    "VPC_ATTACH_NODE_NAME": NODE},
                                   json.dumps(conf).encode()))
    return PublishContext(inv, (source or ColdCluster()).session(str(config)), NODE)


def advertisement(name: str, vrf_id: int, annotations: dict[str, str] | None = None,
                  ) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"routerRef": {"name": ROUTER.name}, "vrfID": vrf_id}}


def collect(ctx: PublishContext) -> bool:
    return bgp_instance.collect_instance(ctx, ROUTER, set(), set(), Deadline(5))


def test_gc_deletes_an_unused_instance_with_uid_and_resource_version_preconditions(
        tmp_path: Path, api: list[Scripted]) -> None:
    server = Scripted(instance(), [advertisement("3e-1", vrf_id=9)],
                      [advertisement("4d2-1", 3, {NODE_KEY + "x": NODE})])
    assert collect(context(tmp_path, api, server))
    deletes = [body for method, _, body in server.seen if method == "DELETE"]
    assert [d["preconditions"] for d in deletes] == [{"uid": "u1", "resourceVersion": "7"}]


def test_gc_keeps_an_instance_an_advertisement_of_this_router_uses(
        tmp_path: Path, api: list[Scripted]) -> None:
    server = Scripted(instance(), [advertisement("3e-1", vrf_id=3)], [])
    assert not collect(context(tmp_path, api, server))
    assert not [s for s in server.seen if s[0] == "DELETE"]


def test_gc_keeps_an_instance_a_live_container_of_this_node_is_advertised_with(
        tmp_path: Path, api: list[Scripted]) -> None:
    """A shared advertisement names the router of its last writer, another node's."""
    netns = tmp_path / "netns"
    netns.touch()
    shared = advertisement("3e-1", 12, {NODE_KEY + "c1": NODE, NETNS_KEY + "c1": str(netns)})
    server = Scripted(instance(), [], [shared])
    assert not collect(context(tmp_path, api, server))
    assert not [s for s in server.seen if s[0] == "DELETE"]


def test_gc_keeps_an_instance_that_changed_before_its_delete(
        tmp_path: Path, api: list[Scripted]) -> None:
    server = Scripted(instance(), [], [], delete_status=409)  # a precondition failed
    assert not collect(context(tmp_path, api, server))


def test_gc_waits_for_an_add_relying_on_the_instance(tmp_path: Path, api: list[Scripted]) -> None:
    server = Scripted(instance(), [], [])
    ctx = context(tmp_path, api, server)
    with bgp_instance.instance_in_use(ctx, Deadline(5)), pytest.raises(CniError) as caught:
        bgp_instance.collect_instance(ctx, ROUTER, set(), set(), Deadline(0.2))
    assert caught.value.code == TRY_AGAIN_LATER and f"bgpvrfinstance-{NAME}" in caught.value.msg
    assert server.seen == [], "nothing is read while an ADD holds the instance"
    assert collect(ctx)


# The VRF-ID check of an instance an ADD found ----------------------------------------------

class CachedInstances(ColdCluster):
    """A source whose watch cache of the router's instances holds `items` (None: not in
    sync)."""

    def __init__(self, items: list[dict[str, Any]] | None) -> None:
        self.items = items

    def session(self, kubeconfig: str) -> ClusterSession:
        items = self.items

        class Cached(ColdSession):
            def instances(self, namespace: str, router: str) -> list[dict[str, Any]] | None:
                return items

        return Cached(kubeconfig)


def other(name: str, vrf_id: int, created: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"routerRef": {"name": ROUTER.name}, "vrfID": vrf_id}}


OURS = {**instance(), "metadata": {**instance()["metadata"],
                                   "creationTimestamp": "2026-01-02T00:00:00Z"}}


def lists(server: Scripted) -> list[str]:
    return [path for method, path, _ in server.seen if method == "GET" and "?" in path]


def test_a_found_instance_is_checked_against_a_synced_cache_without_asking_the_api(
        tmp_path: Path, api: list[Scripted]) -> None:
    server = Scripted(OURS, [], [])
    source = CachedInstances([OURS, other("b", 4, "2026-01-01T00:00:00Z")])
    ctx = context(tmp_path, api, server, source)
    assert bgp_instance._resolve_collision(ctx, ROUTER, OURS, Deadline(5), cached=True) == 3
    assert server.seen == []


def test_without_a_synced_cache_the_routers_instances_are_listed(
        tmp_path: Path, api: list[Scripted]) -> None:
    server = Scripted(OURS, [other("b", 4, "2026-01-01T00:00:00Z")], [])
    ctx = context(tmp_path, api, server, CachedInstances(None))
    assert bgp_instance._resolve_collision(ctx, ROUTER, OURS, Deadline(5), cached=True) == 3
    assert lists(server) == [f"/apis/network.datumapis.com/v1alpha1/namespaces/galactic-system/"
                             f"bgpvrfinstances?fieldSelector=spec.routerRef.name%3D{ROUTER.name}"]


def test_a_collision_seen_in_the_cache_is_decided_on_a_fresh_list(
        tmp_path: Path, api: list[Scripted]) -> None:
    """The cache still shows an earlier instance with our VRF ID; the API server says it has
    moved to 5 since: ours keeps 3 and nothing is written (the scripted server takes no PUT)."""
    server = Scripted(OURS, [other("older", 5, "2026-01-01T00:00:00Z")], [])
    ctx = context(tmp_path, api, server,
                  CachedInstances([other("older", 3, "2026-01-01T00:00:00Z")]))
    assert bgp_instance._resolve_collision(ctx, ROUTER, OURS, Deadline(5), cached=True) == 3
    assert len(lists(server)) == 1
    assert [method for method, _, _ in server.seen] == ["GET"]
