"""What an ADD that creates this node's advertisement reads: the Node's ownerReference learnt
from the VPC's BGPVRFInstance, and the shared form skipped when the agent's one listing knows
it holds none of this node's containers."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cni_plugin.agent import warm
from cni_plugin.agent.warm import WarmCluster
from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, KubeClient, Resource
from cni_plugin.kube.session import ClusterSession, ColdSession
from cni_plugin.publish.bgp.advertisement import read_found
from cni_plugin.publish.context import PublishContext
from cni_plugin.publish.resources import ADVERTISEMENTS, NODE_KEY

NODE = "node-a"
VPC, ATT = "21", "40"
SHARED = naming.shared_advertisement_name(VPC, ATT)
NODE_REF = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1"}


class Recording:
    """A client answering GETs from `objects` (None: 404) and LISTs with `items`, or with
    `refuse` as an ApiError; every request recorded."""

    def __init__(self, objects: dict[str, dict[str, Any]] | None = None,
                 items: list[dict[str, Any]] | None = None, refuse: int | None = None) -> None:
        self.objects = objects or {}
        self.items = items or []
        self.refuse = refuse
        self.seen: list[str] = []

    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            deadline: Deadline) -> dict[str, Any] | None:
        self.seen.append(f"GET {resource.plural} {name}")
        return self.objects.get(name)

    def list(self, resource: Resource, *, namespace: str | None = None,
             deadline: Deadline) -> list[dict[str, Any]]:
        self.seen.append(f"LIST {resource.plural}")
        if self.refuse is not None:
            raise ApiError(self.refuse, "Forbidden", "no", "GET", resource.path(namespace))
        return self.items


def advertisement(name: str, *nodes: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {
        f"{NODE_KEY}c{index}": node for index, node in enumerate(nodes)}}}


class Session(ColdSession):
    def __init__(self, client: Recording, holding: frozenset[str] | None = None) -> None:
        super().__init__("unused")
        self._fake = client
        self.holding = holding

    def client(self) -> KubeClient:
        return cast(KubeClient, self._fake)

    def advertisements_holding(self, namespace: str, node: str,
                               deadline: Deadline) -> frozenset[str] | None:
        return self.holding


def context(session: ClusterSession) -> PublishContext:
    inv = SimpleNamespace(namespace="galactic-system",
                          conf=SimpleNamespace(vpc=VPC, vpcattachment=ATT))
    return PublishContext(cast(Any, inv), session, NODE)


# The Node's ownerReference -------------------------------------------------------------------

def test_the_node_owner_is_learnt_from_this_nodes_instance_without_reading_the_node() -> None:
    client = Recording()
    ctx = context(Session(client))
    ctx.learn_node_owner({"metadata": {"ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": NODE, "uid": "x"},
        {"apiVersion": "v1", "kind": "Node", "name": "node-b", "uid": "y"},
        {**NODE_REF, "controller": True}]}})
    assert ctx.node_owner(Deadline(5)) == [NODE_REF]
    assert client.seen == []


def test_an_instance_without_this_nodes_owner_leaves_the_node_to_be_read() -> None:
    client = Recording({NODE: {"metadata": {"name": NODE, "uid": "u-2"}}})
    ctx = context(Session(client))
    ctx.learn_node_owner({"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": "node-b", "uid": "y"}]}})
    ctx.learn_node_owner({"metadata": {}})
    assert ctx.node_owner(Deadline(5)) == [{**NODE_REF, "uid": "u-2"}]
    assert client.seen == [f"GET nodes {NODE}"]


# The shared form -----------------------------------------------------------------------------

def test_an_absent_advertisement_reads_the_shared_form_unless_the_session_knows_better() -> None:
    own = naming.advertisement_name(VPC, ATT, NODE)
    client = Recording({SHARED: advertisement(SHARED, NODE)})
    found = read_found(context(Session(client)), Deadline(5))
    assert found.own is None and found.shared is not None
    assert client.seen == [f"GET bgpadvertisements {own}", f"GET bgpadvertisements {SHARED}"]

    client = Recording({SHARED: advertisement(SHARED, NODE)})
    found = read_found(context(Session(client, frozenset({SHARED}))), Deadline(5))
    assert found.own is None and found.shared is not None  # listed as holding this node's
    assert client.seen == [f"GET bgpadvertisements {own}", f"GET bgpadvertisements {SHARED}"]

    client = Recording({SHARED: advertisement(SHARED, NODE)})
    found = read_found(context(Session(client, frozenset({f"{SHARED}-x"}))), Deadline(5))
    assert found.own is None and found.shared is None
    assert client.seen == [f"GET bgpadvertisements {own}"]


def agent(client: Recording, monkeypatch: pytest.MonkeyPatch) -> WarmCluster:
    """The agent's cluster source, every verb's client the recording one."""
    cluster = WarmCluster()
    monkeypatch.setattr(cluster, "client", lambda _: client)
    monkeypatch.setattr(cluster, "release", lambda *_: None)
    return cluster


def test_the_agent_lists_advertisements_once_and_knows_which_hold_this_nodes_containers(
        kubeconfig: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = Recording(items=[advertisement(SHARED, "node-b", NODE),
                              advertisement("3e-3e", "node-b"),
                              advertisement(f"{SHARED}-{NODE}", NODE)])
    session = agent(client, monkeypatch).session(kubeconfig)
    holding_this_nodes = frozenset({SHARED, f"{SHARED}-{NODE}"})  # not 3e-3e: node-b's only
    assert session.advertisements_holding("ns", NODE, Deadline(5)) == holding_this_nodes
    assert session.advertisements_holding("ns", NODE, Deadline(5)) == holding_this_nodes
    assert client.seen == [f"LIST {ADVERTISEMENTS.plural}"]
    holding_node_bs = frozenset({SHARED, "3e-3e"})  # per node: listed again
    assert session.advertisements_holding("ns", "node-b", Deadline(5)) == holding_node_bs
    assert client.seen == [f"LIST {ADVERTISEMENTS.plural}"] * 2


@pytest.mark.parametrize("status", [403, 404])
def test_a_refused_listing_reads_the_shared_form_each_time(
        kubeconfig: str, status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    client = Recording(refuse=status)
    session = agent(client, monkeypatch).session(kubeconfig)
    assert session.advertisements_holding("ns", NODE, Deadline(5)) is None  # not known
    assert session.advertisements_holding("ns", NODE, Deadline(5)) is None
    assert client.seen == [f"LIST {ADVERTISEMENTS.plural}"] * 2


def test_the_agent_lists_them_at_start_so_its_first_add_asks_nothing_more(
        kubeconfig: str, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoWatch:
        def __init__(self, *_: object, **__: object) -> None:
            pass

        def start(self) -> NoWatch:
            return self

    monkeypatch.setattr(warm, "WatchCache", NoWatch)
    client = Recording(items=[advertisement(SHARED, NODE)])
    cluster = agent(client, monkeypatch)
    cluster.prime(kubeconfig, "ns", NODE)
    for thread in threading.enumerate():  # the start-up listing runs on a thread of its own
        if thread.name == "list advertisements":
            thread.join(10)
    assert client.seen == [f"LIST {ADVERTISEMENTS.plural}"]  # before any ADD
    session = cluster.session(kubeconfig)
    assert session.advertisements_holding("ns", NODE, Deadline(5)) == frozenset({SHARED})
    assert client.seen == [f"LIST {ADVERTISEMENTS.plural}"]
