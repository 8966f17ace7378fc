"""Publishing edge cases on the real control plane: VRF ID collisions, an unreachable API,
STATUS with missing RBAC, GC of stale slices, pruning only this node's stale annotations."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ENDPOINT_SLICES, GROUP, ROUTERS, VERSION, VRF_INSTANCES
from e2e.harness.kernel import links_in
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, host_local, host_local_reservations
from e2e.harness.publishing import (
    BGP_NS,
    Node,
    advertisement,
    create_pod,
    endpoint_slice,
    make_node,
    vrf_instance,
)
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
NPTV6 = {"publicPrefix": "2001:db8:aa::/48", "ulaPrefix": "fd00:aa::/48"}


@pytest.fixture
def node(kube: Kube, cluster: Any, plugin: Plugin) -> Node:
    """This node."""
    return make_node(kube, cluster, plugin)


def _conf(vpc: str, att: str, tmp_path: Path, **kw: Any) -> dict[str, Any]:
    conf = base_conf(vpc, att, ipam=host_local(tmp_path / "ipam", "fd00:e3::/64"), **kw)
    conf.pop("publish")
    return conf


def _instance(kube: Kube, name: str, router: str, vrf_id: int, rt: str) -> dict[str, Any]:
    return kube.create(VRF_INSTANCES.path(BGP_NS), {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance", "metadata": {"name": name},
        "spec": {"routerRef": {"name": router}, "vrfID": vrf_id, "nptv6": NPTV6,
                 "importRouteTargets": [{"value": rt}], "exportRouteTargets": [{"value": rt}]}})


def test_field_selectors_narrow_lists_to_this_node(kube: Kube, node: Node) -> None:
    found = kube.list(ROUTERS.path(BGP_NS), fields=f"spec.targetRef.name={node.name}")
    assert [r["metadata"]["name"] for r in found] == [node.router]


def test_a_colliding_vrf_id_is_moved_by_the_later_instance(kube: Kube, node: Node, netns: str,
                                                           vpc: str, tmp_path: Path) -> None:
    created = _instance(kube, f"older-{node.name}", node.router, 5, "65000:1")
    # creationTimestamp has one-second resolution: ours must carry a later one.
    later = datetime.datetime.fromisoformat(created["metadata"]["creationTimestamp"]) + \
        datetime.timedelta(seconds=1)
    wait_until("the next creationTimestamp second",
               lambda: datetime.datetime.now(datetime.UTC) >= later, 5, interval=0.02)
    ours = naming.vrf_instance_name(vpc, node.name)
    _instance(kube, ours, node.router, 5, "65000:999")
    uid = create_pod(kube, "collide", node.name)
    node.plugin.ok("ADD", _conf(vpc, "1", tmp_path), container_id="ctr-collide", netns=netns,
                   CNI_ARGS=node.cni_args("collide", uid))
    older = vrf_instance(kube, f"older-{node.name}")
    moved = vrf_instance(kube, ours)
    assert older is not None and older["spec"]["vrfID"] == 5, "the earlier instance keeps it"
    assert moved is not None and moved["spec"]["vrfID"] == 1, "the later one takes the lowest free"
    rt = naming.route_target(65000, vpc)
    assert moved["spec"]["importRouteTargets"] == [{"value": "65000:999"}, {"value": rt}]
    assert moved["spec"]["nptv6"] == NPTV6, "other writers' fields are preserved"
    adv = advertisement(kube, naming.advertisement_name(vpc, "1", node.name))
    assert adv is not None and adv["spec"]["vrfID"] == 1


def test_unreachable_api_is_code_11_before_any_change(node: Node, netns: str, vpc: str,
                                                      tmp_path: Path, cluster: Any) -> None:
    dead = tmp_path / "dead.kubeconfig"
    text = Path(cluster.plugin_kubeconfig).read_text()
    port = cluster.server.rsplit(":", 1)[1]
    dead.write_text(text.replace(f":{port}", ":1"))  # nothing listens on port 1
    conf = _conf(vpc, "2", tmp_path)
    answer = node.plugin.call("ADD", conf, container_id="ctr-dead", netns=netns,
                              VPC_ATTACH_KUBECONFIG=str(dead), VPC_ATTACH_TIMEOUT_SECONDS="2",
                              CNI_ARGS=node.cni_args("nobody"))
    assert answer.code == 11 and "unavailable" in answer.body["msg"], answer.stdout
    assert links_in(netns) == {"lo"}
    assert naming.host_link_name(vpc, "2") not in links_in()
    assert not (tmp_path / "ipam").exists(), "IPAM was not even asked"


def test_status_reports_reachability_and_missing_rbac(kube: Kube, node: Node, vpc: str,
                                                      tmp_path: Path, cluster: Any) -> None:
    conf = _conf(vpc, "3", tmp_path)
    assert node.plugin.call("STATUS", conf, CNI_ARGS=node.cni_args("any")).status == 0
    kube.create("/api/v1/namespaces/kube-system/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": f"powerless-{vpc.lower()}"}})
    token = kube.create(f"/api/v1/namespaces/kube-system/serviceaccounts/"
                        f"powerless-{vpc.lower()}/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}})["status"]["token"]
    weak = tmp_path / "weak.kubeconfig"
    weak.write_text(Path(cluster.plugin_kubeconfig).read_text().replace(cluster.plugin_token,
                                                                        token))
    answer = node.plugin.call("STATUS", conf, VPC_ATTACH_KUBECONFIG=str(weak),
                              CNI_ARGS=node.cni_args("any"))
    assert answer.code == 50 and "missing RBAC permission" in answer.body["msg"], answer.stdout
    assert "bgprouters" in answer.body["msg"]


def test_gc_deletes_only_this_nodes_stale_slices(kube: Kube, node: Node, netns: str, vpc: str,
                                                tmp_path: Path) -> None:
    uid = create_pod(kube, "gc-1", node.name)
    conf = _conf(vpc, "4", tmp_path)
    node.plugin.ok("ADD", conf, container_id="ctr-gc", netns=netns,
                   CNI_ARGS=node.cni_args("gc-1", uid))
    name = slice_name("gc-1", vpc, "4", "IPv6")
    node.plugin.ok("GC", {**conf, "cni.dev/valid-attachments": [
        {"containerID": "ctr-gc", "ifname": "eth0"}]})
    assert endpoint_slice(kube, name) is not None
    node.plugin.ok("GC", {**conf, "cni.dev/valid-attachments": []})
    assert endpoint_slice(kube, name) is None
    assert naming.host_link_name(vpc, "4") not in links_in()


def test_gc_finds_an_ipv4_slice_an_older_version_labelled_for_galactic_only(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path) -> None:
    uid = create_pod(kube, "gc-old-1", node.name)
    conf = base_conf(vpc, "7", ipam=host_local(tmp_path / "ipam", "10.207.0.0/24"),
                     publish={"bgp": False, "endpointSlice": True,
                              "endpointSliceFamilies": ["IPv4"]})
    node.plugin.ok("ADD", conf, container_id="ctr-gc-old", netns=netns,
                   CNI_ARGS=node.cni_args("gc-old-1", uid))
    name = slice_name("gc-old-1", vpc, "7", "IPv4")
    older = endpoint_slice(kube, name)
    assert older is not None
    older["metadata"]["labels"] = {"galactic.datum.net/tenant-id": f"{vpc}-7",
                                   "endpointslice.kubernetes.io/managed-by": "vpc-attach"}
    kube.put(ENDPOINT_SLICES.path("default", name), older)
    node.plugin.ok("GC", {**conf, "cni.dev/valid-attachments": []})
    assert endpoint_slice(kube, name) is None


def test_only_this_nodes_stale_annotations_are_pruned(kube: Kube, node: Node, cluster: Any,
                                                      plugin: Plugin, netns: str, vpc: str,
                                                      tmp_path: Path) -> None:
    other = make_node(kube, cluster, Plugin(plugin.cni_bin, plugin.lock_dir,
                                            agent_socket=plugin.agent_socket))

    def publish_only(on: Node, cid: str, address: str, pod_netns: str) -> None:
        prev = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": pod_netns}],
                "ips": [{"address": address, "interface": 0}]}
        on.plugin.ok("ADD", {"cniVersion": "1.1.0", "name": "prune", "type": "vpc-attach",
                             "vpc": vpc, "vpcattachment": "5", "attachment": "existing",
                             "prevResult": prev, "publish": {"bgp": True, "endpointSlice": False}},
                     container_id=cid, netns=pod_netns, CNI_ARGS=on.cni_args("x"))

    # Two containers whose netns is gone on this machine: one recorded by this node, one by
    # another node (where, for all this node knows, it is alive).
    publish_only(node, "ctr-dead-here", "fd00:51::/96", "/var/run/netns/vpa-never-existed-1")
    publish_only(other, "ctr-dead-there", "fd00:52::/96", "/var/run/netns/vpa-never-existed-2")
    publish_only(node, "ctr-live", "fd00:53::/96", netns)
    adv = advertisement(kube, naming.advertisement_name(vpc, "5", node.name))
    theirs = advertisement(kube, naming.advertisement_name(vpc, "5", other.name))
    assert adv is not None and theirs is not None
    notes = adv["metadata"]["annotations"]
    assert not any(naming.annotation_cid("ctr-dead-here") in key for key in notes)
    assert f"galactic.datum.net/netns.{naming.annotation_cid('ctr-dead-there')}" in \
        theirs["metadata"]["annotations"]
    # publish-only: each address is advertised as a host prefix, whatever its pool; each node
    # announces its own containers
    assert adv["spec"]["prefixes"] == ["fd00:53::/128"]
    assert theirs["spec"]["prefixes"] == ["fd00:52::/128"]


def test_status_is_50_when_no_router_targets_this_node(plugin: Plugin, vpc: str, tmp_path: Path,
                                                       cluster: Any) -> None:
    plugin.environ.update({"VPC_ATTACH_NODE_NAME": "node-without-router",
                           "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig)})
    answer = plugin.call("STATUS", _conf(vpc, "6", tmp_path))
    assert answer.code == 50 and "BGPRouter" in answer.body["msg"], answer.stdout


def _fill_advertisement(kube: Kube, node: Node, vpc: str, att: str, prefixes: int,
                        annotation_bytes: int = 0) -> dict[str, Any]:
    """An advertisement of (vpc, att) holding `prefixes` containers of another node (never
    pruned here), its annotations padded up to `annotation_bytes` (keys and values)."""
    annotations: dict[str, str] = {}
    for n in range(prefixes):
        cid = naming.annotation_cid(f"other-{n:04d}")
        annotations[f"galactic.datum.net/allocated-subnet-ipv6.{cid}"] = f"fd00:77:{n:x}::/96"
        annotations[f"galactic.datum.net/netns.{cid}"] = "/var/run/netns/x"
        annotations[f"galactic.datum.net/node.{cid}"] = "some-other-node"
    spec_prefixes = sorted(v for k, v in annotations.items() if "allocated-subnet" in k)
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if annotation_bytes > size:
        key = "example.com/padding"
        annotations[key] = "p" * (annotation_bytes - size - len(key))
    return kube.create(f"/apis/{GROUP}/{VERSION}/namespaces/{BGP_NS}/bgpadvertisements", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPAdvertisement",
        "metadata": {"name": naming.advertisement_name(vpc, att, node.name),
                     "annotations": annotations},
        "spec": {"routerRef": {"name": node.router}, "prefixes": spec_prefixes or ["::/128"],
                 "addressFamily": {"afi": "l2vpn", "safi": "evpn"}, "communities": [],
                 "vrfID": 1, "function": "End.DT46"}})


@pytest.mark.parametrize(("prefixes", "annotation_bytes", "limit"), [
    (256, 0, "maxItems"), (40, 256 * 1024 - 64, "262144")])
def test_an_advertisement_at_its_limit_refuses_one_more_and_nothing_is_left(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path,
        prefixes: int, annotation_bytes: int, limit: str) -> None:
    # The API server's own limit on annotations is 256 KiB of keys and values together.
    before = _fill_advertisement(kube, node, vpc, "7", prefixes, annotation_bytes)
    pod = f"full-{prefixes}"
    uid = create_pod(kube, pod, node.name)
    answer = node.plugin.call("ADD", _conf(vpc, "7", tmp_path), container_id="ctr-full",
                              netns=netns, CNI_ARGS=node.cni_args(pod, uid))
    assert answer.code == 11 and "is full" in answer.body["msg"], answer.stdout
    assert limit in answer.body["msg"]
    after = advertisement(kube, naming.advertisement_name(vpc, "7", node.name))
    assert after is not None
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert after["spec"] == before["spec"]
    assert endpoint_slice(kube, slice_name(pod, vpc, "7", "IPv6")) is None
    assert links_in(netns) == {"lo"} and naming.host_link_name(vpc, "7") not in links_in()
    assert host_local_reservations(tmp_path / "ipam", base_conf(vpc, "7")["name"]) == []
