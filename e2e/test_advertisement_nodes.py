"""Each node's BGPAdvertisement of an attachment on the real control plane (issue 21 items 2
and 3): the shared `{hex(vpc)}-{hex(att)}` form earlier versions wrote is converted by the next
ADD, DEL or GC of the attachment on a node — that node's live containers are announced by its
own object before the shared one lets them go (proved by the order of the API server's watch
events) — and the objects that belong to one node carry an ownerReference to its Node, so the
API server's garbage collector removes them with the Node."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.kube.client import CREATED_BY_ANNOTATION
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    GROUP,
    NETNS_KEY,
    NODE_KEY,
    SUBNET_V6_KEY,
    VERSION,
)
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES
from e2e.harness.plugin import Plugin
from e2e.harness.publishing import BGP_NS, Node, advertisement, make_node, vrf_instance
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
GONE_NETNS = "/var/run/netns/vpa-never-existed"


@pytest.fixture
def node(kube: Kube, cluster: Any, plugin: Plugin) -> Iterator[Node]:
    """This node, registered as a Node object (the owner of its BGP objects)."""
    made = make_node(kube, cluster, plugin)
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": made.name}})
    yield made
    kube.delete(f"{NODES}/{made.name}")


@pytest.fixture
def other(kube: Kube, cluster: Any, plugin: Plugin) -> Node:
    """Another node, with its own router (it never runs anything here)."""
    return make_node(kube, cluster, Plugin(plugin.cni_bin, plugin.lock_dir,
                                           agent_socket=plugin.agent_socket))


def publish_only(on: Node, vpc: str, att: str, cid: str, address: str, netns: str,
                 verb: str = "ADD") -> None:
    """ADD (or DEL) publishing an address another plugin configured: no kernel work, BGP only."""
    prev = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": netns}],
            "ips": [{"address": address, "interface": 0}]}
    on.plugin.ok(verb, {"cniVersion": "1.1.0", "name": "convert", "type": "vpc-attach",
                        "vpc": vpc, "vpcattachment": att, "attachment": "existing",
                        "prevResult": prev, "publish": {"bgp": True, "endpointSlice": False}},
                 container_id=cid, netns=netns, CNI_ARGS=on.cni_args(cid))


def gc(on: Node, vpc: str, att: str, *valid: str) -> None:
    """GC of the publish-only network with these containers valid."""
    on.plugin.ok("GC", {"cniVersion": "1.1.0", "name": "convert", "type": "vpc-attach",
                        "vpc": vpc, "vpcattachment": att, "attachment": "existing",
                        "publish": {"bgp": True, "endpointSlice": False},
                        "cni.dev/valid-attachments": [{"containerID": c, "ifname": "eth0"}
                                                      for c in valid]})


def write_shared(kube: Kube, vpc: str, att: str, router: str,
                 containers: dict[str, tuple[str, str, str]]) -> None:
    """The shared advertisement as an earlier version wrote it: {cid: (node, netns, /128)},
    routerRef naming whichever node wrote last."""
    annotations = {CREATED_BY_ANNOTATION: "ctr-earlier/eth0/older-version"}
    for cid, (node, netns, prefix) in containers.items():
        key = naming.annotation_cid(cid)
        annotations.update({NETNS_KEY + key: netns, NODE_KEY + key: node,
                            SUBNET_V6_KEY + key: prefix})
    kube.create(ADVERTISEMENTS.path(BGP_NS), {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPAdvertisement",
        "metadata": {"name": naming.shared_advertisement_name(vpc, att),
                     "annotations": annotations},
        "spec": {"routerRef": {"name": router}, "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
                 "prefixes": sorted(p for _, _, p in containers.values()),
                 "communities": [naming.route_target(65000, vpc)], "vrfID": 1,
                 "function": "End.DT46"}})


def cids_of(adv: dict[str, Any] | None) -> set[str]:
    """The containers an advertisement records."""
    assert adv is not None
    return {key[len(NODE_KEY):] for key in adv["metadata"].get("annotations") or {}
            if key.startswith(NODE_KEY)}


def first(events: Sequence[tuple[str, str]], name: str) -> int:
    """Index of the first event of the object."""
    return next(i for i, (_, named) in enumerate(events) if named == name)


@contextlib.contextmanager
def live_netns(count: int) -> Iterator[list[str]]:
    """Network namespaces that exist on this machine (live containers' netns paths)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(temporary_netns("vpa-conv")) for _ in range(count)]


def test_add_announces_this_nodes_containers_from_its_own_object_before_the_shared_one_drops_them(
        kube: Kube, node: Node, other: Node, vpc: str) -> None:
    att = "61"
    shared, own = naming.shared_advertisement_name(vpc, att), \
        naming.advertisement_name(vpc, att, node.name)
    with live_netns(2) as (old_here, new_here):
        write_shared(kube, vpc, att, other.router, {
            "ctr-old-here": (node.name, old_here, "fd00:61:1::/128"),
            "ctr-dead-here": (node.name, GONE_NETNS, "fd00:61:9::/128"),
            "ctr-old-there": (other.name, GONE_NETNS, "fd00:61:2::/128")})
        with kube.watching(ADVERTISEMENTS.path(BGP_NS)) as events:
            publish_only(node, vpc, att, "ctr-new-here", "fd00:61:3::5/64", new_here)
            wait_until("the shared advertisement rewritten",
                       lambda: ("MODIFIED", shared) in events)
        print(f"watch events: {events}")
        assert events[first(events, own)] == ("ADDED", own)
        assert first(events, own) < events.index(("MODIFIED", shared)), \
            "the shared advertisement let a live container go before this node's announced it"

        mine = advertisement(kube, own)
        assert mine is not None and mine["spec"]["routerRef"] == {"name": node.router}
        assert mine["spec"]["prefixes"] == ["fd00:61:1::/128", "fd00:61:3::5/128"]
        assert cids_of(mine) == {"ctr-old-here", "ctr-new-here"}
        theirs = advertisement(kube, shared)
        assert theirs is not None and cids_of(theirs) == {"ctr-old-there"}, \
            "only this node's containers leave the shared form (the dead one is dropped)"
        assert theirs["spec"]["prefixes"] == ["fd00:61:2::/128"]
        assert theirs["spec"]["routerRef"] == {"name": other.router}, "its router never changes"

        # A later ADD finds this node's object: the shared one is not read again, nor changed.
        version = theirs["metadata"]["resourceVersion"]
        publish_only(node, vpc, att, "ctr-newer-here", "fd00:61:4::5/64", new_here)
        after = advertisement(kube, shared)
        assert after is not None and after["metadata"]["resourceVersion"] == version
        for cid in ("ctr-old-here", "ctr-new-here", "ctr-newer-here"):
            publish_only(node, vpc, att, cid, "fd00:61::1/64", new_here, verb="DEL")
        assert advertisement(kube, own) is None, "the last DEL on this node deletes its object"


def test_del_of_a_container_in_the_shared_form_first_moves_this_nodes_others(
        kube: Kube, node: Node, other: Node, vpc: str) -> None:
    att = "62"
    shared, own = naming.shared_advertisement_name(vpc, att), \
        naming.advertisement_name(vpc, att, node.name)
    with live_netns(3) as (staying, leaving, anchor):
        # The VPC's instance on this node, as the older version's ADDs left it.
        publish_only(node, vpc, "60", "ctr-anchor", "fd00:60::5/64", anchor)
        write_shared(kube, vpc, att, node.router, {
            "ctr-staying": (node.name, staying, "fd00:62:1::/128"),
            "ctr-leaving": (node.name, leaving, "fd00:62:2::/128"),
            "ctr-there": (other.name, GONE_NETNS, "fd00:62:3::/128")})
        with kube.watching(ADVERTISEMENTS.path(BGP_NS)) as events:
            publish_only(node, vpc, att, "ctr-leaving", "fd00:62:2::/64", leaving, verb="DEL")
            wait_until("the shared advertisement rewritten",
                       lambda: ("MODIFIED", shared) in events)
        print(f"watch events: {events}")
        assert first(events, own) < events.index(("MODIFIED", shared))
        assert cids_of(advertisement(kube, own)) == {"ctr-staying"}
        assert cids_of(advertisement(kube, shared)) == {"ctr-there"}
        # The routerRef of the shared object named this node's router: it is still unchanged
        # (it announces only the other node's container until that node converts it).
        theirs = advertisement(kube, shared)
        assert theirs is not None and theirs["spec"]["routerRef"] == {"name": node.router}
        # A DEL repeated finds nothing of this container anywhere: no change, no error.
        publish_only(node, vpc, att, "ctr-leaving", "fd00:62:2::/64", leaving, verb="DEL")
        assert cids_of(advertisement(kube, own)) == {"ctr-staying"}
        publish_only(node, vpc, "60", "ctr-anchor", "fd00:60::5/64", anchor, verb="DEL")


def test_gc_converts_the_shared_form_and_drops_containers_no_longer_valid(
        kube: Kube, node: Node, vpc: str) -> None:
    att = "63"
    shared, own = naming.shared_advertisement_name(vpc, att), \
        naming.advertisement_name(vpc, att, node.name)
    # GC needs the VPC's instance on this node to move a container (its VRF ID): an ADD of
    # another attachment of the VPC made it.
    with live_netns(3) as (valid, invalid, anchor):
        publish_only(node, vpc, "64", "ctr-anchor", "fd00:64::5/64", anchor)
        write_shared(kube, vpc, att, node.router, {
            "ctr-valid": (node.name, valid, "fd00:63:1::/128"),
            "ctr-invalid": (node.name, invalid, "fd00:63:2::/128")})
        with kube.watching(ADVERTISEMENTS.path(BGP_NS)) as events:
            gc(node, vpc, att, "ctr-valid", "ctr-anchor")
            wait_until("the shared advertisement deleted", lambda: ("DELETED", shared) in events)
        print(f"watch events: {events}")
        assert first(events, own) < events.index(("DELETED", shared))
        mine = advertisement(kube, own)
        assert mine is not None and cids_of(mine) == {"ctr-valid"}
        assert mine["spec"]["prefixes"] == ["fd00:63:1::/128"]
        assert advertisement(kube, shared) is None

        gc(node, vpc, att, "ctr-anchor")
        assert advertisement(kube, own) is None, "GC withdraws what the runtime no longer runs"
        assert cids_of(advertisement(kube, naming.advertisement_name(vpc, "64", node.name))) \
            == {"ctr-anchor"}, "another attachment's advertisement is not this GC's"
        publish_only(node, vpc, "64", "ctr-anchor", "fd00:64::5/64", anchor, verb="DEL")


def test_a_nodes_instance_and_advertisement_are_owned_by_its_node_and_go_with_it(
        kube: Kube, node: Node, vpc: str) -> None:
    uid = (kube.get(f"{NODES}/{node.name}") or {})["metadata"]["uid"]
    with live_netns(1) as (netns,):
        publish_only(node, vpc, "65", "ctr-owned", "fd00:65::5/64", netns)
        instance = vrf_instance(kube, naming.vrf_instance_name(vpc, node.name))
        adv = advertisement(kube, naming.advertisement_name(vpc, "65", node.name))
        owner = [{"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid}]
        assert instance is not None and instance["metadata"]["ownerReferences"] == owner
        assert adv is not None and adv["metadata"]["ownerReferences"] == owner

        kube.delete(f"{NODES}/{node.name}")
        wait_until("the garbage collector to delete the node's BGP objects",
                   lambda: vrf_instance(kube, naming.vrf_instance_name(vpc, node.name)) is None
                   and advertisement(kube, naming.advertisement_name(vpc, "65", node.name))
                   is None, 60.0)
        # The node's DEL later finds nothing to withdraw and succeeds.
        publish_only(node, vpc, "65", "ctr-owned", "fd00:65::5/64", netns, verb="DEL")


def test_without_a_node_object_the_objects_are_written_unowned_and_gc_gives_them_to_it(
        kube: Kube, cluster: Any, plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    unregistered = make_node(kube, cluster, plugin)
    log = tmp_path / "vpc-attach.log"
    plugin.environ["VPC_ATTACH_LOG_FILE"] = str(log)
    cid = f"ctr-{secrets.token_hex(2)}"
    instance_name = naming.vrf_instance_name(vpc, unregistered.name)
    adv_name = naming.advertisement_name(vpc, "66", unregistered.name)
    with live_netns(1) as (netns,):
        publish_only(unregistered, vpc, "66", cid, "fd00:66::5/64", netns)
        instance, adv = vrf_instance(kube, instance_name), advertisement(kube, adv_name)
        assert instance is not None and "ownerReferences" not in instance["metadata"]
        assert adv is not None and "ownerReferences" not in adv["metadata"]
        assert f"Node {unregistered.name} not found" in log.read_text()

        # The Node registers (or an earlier version wrote the objects): GC gives them to it.
        node = kube.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": unregistered.name}})
        try:
            gc(unregistered, vpc, "66", cid)
            owner = [{"apiVersion": "v1", "kind": "Node", "name": unregistered.name,
                      "uid": node["metadata"]["uid"]}]
            instance, adv = vrf_instance(kube, instance_name), advertisement(kube, adv_name)
            assert instance is not None and instance["metadata"]["ownerReferences"] == owner
            assert adv is not None and adv["metadata"]["ownerReferences"] == owner
            assert cids_of(adv) == {cid}, "GC with the container valid keeps it"
        finally:
            kube.delete(f"{NODES}/{unregistered.name}")
        wait_until("the garbage collector to delete the node's BGP objects",
                   lambda: vrf_instance(kube, instance_name) is None
                   and advertisement(kube, adv_name) is None, 60.0)
        publish_only(unregistered, vpc, "66", cid, "fd00:66::5/64", netns, verb="DEL")
