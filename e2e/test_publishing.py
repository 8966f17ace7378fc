"""Publishing on a real control plane (etcd, kube-apiserver with RBAC, the garbage collector),
with the plugin authenticated as its ServiceAccount bound to the packaged ClusterRole only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ENDPOINT_SLICES
from e2e.harness.kernel import links_in, run_ip
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, host_local, with_prev
from e2e.harness.publishing import (
    Node,
    advertisement,
    create_pod,
    delete_pod,
    endpoint_slice,
    make_node,
    vrf_instance,
)
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]


@pytest.fixture
def node(kube: Kube, cluster: Any, plugin: Plugin) -> Node:
    """A node with a BGPRouter that has an SRv6 locator."""
    return make_node(kube, cluster, plugin, locator="2001:db8:ff01::/48", node_id=1)


def _publishing_conf(vpc: str, att: str, tmp_path: Path, **kw: Any) -> dict[str, Any]:
    conf = base_conf(vpc, att, ipam=host_local(tmp_path / "ipam", "fd00:e1::/64",
                                                "10.201.0.0/24"), **kw)
    if "publish" not in kw:
        conf.pop("publish")  # the defaults: BGP and an IPv6 EndpointSlice
    return conf


def test_veth_pod_is_published_checked_and_withdrawn(kube: Kube, node: Node, netns: str,
                                                     vpc: str, tmp_path: Path) -> None:
    uid = create_pod(kube, "web-1", node.name)
    conf = _publishing_conf(vpc, "10", tmp_path)
    args = node.cni_args("web-1", uid)
    result = node.plugin.ok("ADD", conf, container_id="ctr-web-1", netns=netns, CNI_ARGS=args)
    v6 = next(ip["address"] for ip in result["ips"] if ":" in ip["address"])

    instance = vrf_instance(kube, naming.vrf_instance_name(vpc, node.name))
    assert instance is not None
    rt = naming.route_target(65000, vpc)
    assert instance["spec"]["routerRef"] == {"name": node.router}
    assert instance["spec"]["importRouteTargets"] == [{"value": rt}]
    assert instance["spec"]["exportRouteTargets"] == [{"value": rt}]
    vrf_id = instance["spec"]["vrfID"]
    assert 1 <= vrf_id <= 4095

    adv = advertisement(kube, naming.advertisement_name(vpc, "10", node.name))
    assert adv is not None
    cid = naming.annotation_cid("ctr-web-1")
    notes = adv["metadata"]["annotations"]
    assert notes[f"galactic.datum.net/netns.{cid}"] == netns
    assert notes[f"galactic.datum.net/allocated-subnet-ipv6.{cid}"] == "fd00:e1::/64"
    assert notes[f"galactic.datum.net/allocated-subnet-ipv4.{cid}"] == "10.201.0.2"
    assert adv["spec"]["prefixes"] == ["10.201.0.2/32", "fd00:e1::/64"]
    assert adv["spec"]["communities"] == [rt] and adv["spec"]["vrfID"] == vrf_id
    assert adv["spec"]["function"] == "End.DT46"
    assert adv["spec"]["addressFamily"] == {"afi": "l2vpn", "safi": "evpn"}

    web_slice = slice_name("web-1", vpc, "10", "IPv6")
    assert web_slice == f"web-1-{naming.hex_id(vpc)}-3e-ipv6"
    eps = endpoint_slice(kube, web_slice)
    assert eps is not None
    meta = eps["metadata"]
    assert meta["labels"] == {"galactic.datum.net/tenant-id": f"{vpc}-10",
                              "vpc-attach.datum.net/tenant-id": f"{vpc}-10",
                              "endpointslice.kubernetes.io/managed-by": "vpc-attach"}
    assert meta["annotations"]["galactic.datum.net/tenant-id"] == f"{vpc}-10"
    assert meta["annotations"]["galactic.datum.net/srv6-sid"] == naming.srv6_sid(
        "2001:db8:ff01::/48", 1, vrf_id)
    assert meta["ownerReferences"][0]["uid"] == uid and meta["ownerReferences"][0]["kind"] == "Pod"
    endpoint = eps["endpoints"][0]
    assert endpoint["addresses"] == [v6.split("/")[0]] and endpoint["nodeName"] == node.name
    assert endpoint["conditions"]["ready"] and endpoint["conditions"]["serving"]
    assert endpoint["targetRef"]["uid"] == uid and eps["addressType"] == "IPv6"
    assert endpoint_slice(kube, slice_name("web-1", vpc, "10", "IPv4")) is None

    checked = with_prev(conf, result)
    assert node.plugin.call("CHECK", checked, container_id="ctr-web-1", netns=netns,
                            CNI_ARGS=args).status == 0
    kube.delete(ENDPOINT_SLICES.path("default", web_slice))
    answer = node.plugin.call("CHECK", checked, container_id="ctr-web-1", netns=netns,
                              CNI_ARGS=args)
    assert answer.code == 103 and web_slice in answer.body["details"]

    node.plugin.ok("DEL", checked, container_id="ctr-web-1", netns=netns, CNI_ARGS=args)
    assert advertisement(kube, naming.advertisement_name(vpc, "10", node.name)) is None
    assert vrf_instance(kube, naming.vrf_instance_name(vpc, node.name)) is not None
    node.plugin.ok("DEL", checked, container_id="ctr-web-1", netns=netns, CNI_ARGS=args)


def test_dual_stack_slices_and_two_attachments_of_one_pod(kube: Kube, node: Node, netns: str,
                                                         vpc: str, tmp_path: Path) -> None:
    uid = create_pod(kube, "db-1", node.name)
    args = node.cni_args("db-1", uid)
    families = {"bgp": True, "endpointSlice": True, "endpointSliceFamilies": ["IPv6", "IPv4"]}
    first = _publishing_conf(vpc, "1", tmp_path, publish=families)
    second = _publishing_conf(vpc, "2", tmp_path, publish=families)
    node.plugin.ok("ADD", first, container_id="ctr-db-1", netns=netns, CNI_ARGS=args)
    node.plugin.ok("ADD", second, container_id="ctr-db-1", netns=netns, ifname="net1",
                   CNI_ARGS=args)
    names = {slice_name("db-1", vpc, att, fam) for att in ("1", "2") for fam in ("IPv6", "IPv4")}
    found = {s["metadata"]["name"]: s for s in kube.list(ENDPOINT_SLICES.path("default"),
                                                          labels="endpointslice.kubernetes.io/"
                                                                 "managed-by=vpc-attach")}
    assert names <= set(found), "one slice per (Pod, attachment, family), no collision"
    v4 = found[slice_name("db-1", vpc, "1", "IPv4")]
    assert v4["addressType"] == "IPv4" and v4["endpoints"][0]["addresses"] == ["10.201.0.2"]
    # galactic's sidecar selects on its tenant-id label for IPv6 backends only: not on IPv4.
    assert v4["metadata"]["labels"] == {"vpc-attach.datum.net/tenant-id": f"{vpc}-1",
                                        "endpointslice.kubernetes.io/managed-by": "vpc-attach"}
    node.plugin.ok("DEL", first, container_id="ctr-db-1", netns=netns, CNI_ARGS=args)
    assert endpoint_slice(kube, slice_name("db-1", vpc, "1", "IPv6")) is None
    assert endpoint_slice(kube, slice_name("db-1", vpc, "2", "IPv6")) is not None
    node.plugin.ok("DEL", second, container_id="ctr-db-1", netns=netns, ifname="net1",
                   CNI_ARGS=args)


def test_pod_deleted_without_del_loses_its_slice_to_the_garbage_collector(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path) -> None:
    uid = create_pod(kube, "gone-1", node.name)
    conf = _publishing_conf(vpc, "3", tmp_path)
    node.plugin.ok("ADD", conf, container_id="ctr-gone", netns=netns,
                   CNI_ARGS=node.cni_args("gone-1", uid))
    name = slice_name("gone-1", vpc, "3", "IPv6")
    assert endpoint_slice(kube, name) is not None
    delete_pod(kube, "gone-1")
    wait_until("garbage collection of the slice",
               lambda: endpoint_slice(kube, name) is None, 90)


def test_late_del_of_an_old_container_keeps_the_recreated_pods_slice(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path) -> None:
    conf = _publishing_conf(vpc, "4", tmp_path)
    old_uid = create_pod(kube, "again-1", node.name)
    node.plugin.ok("ADD", conf, container_id="ctr-old", netns=netns,
                   CNI_ARGS=node.cni_args("again-1", old_uid))
    name = slice_name("again-1", vpc, "4", "IPv6")
    delete_pod(kube, "again-1")
    wait_until("garbage collection",
               lambda: endpoint_slice(kube, name) is None, 90)
    node.plugin.ok("DEL", conf, container_id="ctr-old", netns=netns,
                   CNI_ARGS=node.cni_args("again-1", old_uid))  # kubelet tears down the old one

    new_uid = create_pod(kube, "again-1", node.name)
    os.system("ip netns add vpa-again-test")
    try:
        node.plugin.ok("ADD", conf, container_id="ctr-new", netns="/var/run/netns/vpa-again-test",
                       CNI_ARGS=node.cni_args("again-1", new_uid))
        node.plugin.ok("DEL", conf, container_id="ctr-old", netns=netns,
                       CNI_ARGS=node.cni_args("again-1", old_uid))  # late, repeated
        survivor = endpoint_slice(kube, name)
        assert survivor is not None
        assert survivor["metadata"]["ownerReferences"][0]["uid"] == new_uid
        adv = advertisement(kube, naming.advertisement_name(vpc, "4", node.name))
        assert adv is not None and adv["spec"]["prefixes"]
    finally:
        os.system("ip netns del vpa-again-test")


def test_tap_vm_is_published_and_a_tap_without_ipam_publishes_nothing(
        kube: Kube, node: Node, netns: str, vpc: str) -> None:
    uid = create_pod(kube, "vm-1", node.name)
    args = node.cni_args("vm-1", uid)
    conf = base_conf(vpc, "60", attachment="tap", ipam={"type": "static", "addresses": [
        {"address": "fd20:60:ff03:0:1::/96", "gateway": "fd20:60:ff03::1"}]})
    conf.pop("publish")
    node.plugin.ok("ADD", conf, container_id="ctr-vm-1", netns=netns, CNI_ARGS=args)
    adv = advertisement(kube, naming.advertisement_name(vpc, "60", node.name))
    assert adv is not None and adv["spec"]["prefixes"] == ["fd20:60:ff03:0:1::/96"]
    assert endpoint_slice(kube, slice_name("vm-1", vpc, "60", "IPv6")) is not None
    node.plugin.ok("DEL", conf, container_id="ctr-vm-1", netns=netns, CNI_ARGS=args)

    l2 = base_conf(vpc, "61", attachment="tap")
    l2.pop("publish")
    node.plugin.ok("ADD", l2, container_id="ctr-vm-2", netns=netns, CNI_ARGS=args)
    assert advertisement(kube, naming.advertisement_name(vpc, "61", node.name)) is None
    assert endpoint_slice(kube, slice_name("vm-1", vpc, "61", "IPv6")) is None
    assert naming.host_link_name(vpc, "61") in links_in()
    node.plugin.ok("DEL", l2, container_id="ctr-vm-2", netns=netns, CNI_ARGS=args)


def test_publish_only_after_ptp_takes_addresses_from_prev_result(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path) -> None:
    uid = create_pod(kube, "ptp-1", node.name)
    args = node.cni_args("ptp-1", uid)
    ptp = {"cniVersion": "1.1.0", "name": "vpc33", "type": "ptp", "ipMasq": False,
           "ipam": host_local(tmp_path / "ptp-ipam", "10.33.0.0/24")}
    prev = node.plugin.ok("ADD", ptp, container_id="ctr-ptp", netns=netns, CNI_ARGS=args,
                          executable="ptp")
    conf = {"cniVersion": "1.1.0", "name": "vpc33", "type": "vpc-attach", "vpc": vpc,
            "vpcattachment": "1", "attachment": "existing",
            "publish": {"bgp": True, "endpointSlice": True,
                        "endpointSliceFamilies": ["IPv4"]}}
    result = node.plugin.ok("ADD", with_prev(conf, prev), container_id="ctr-ptp", netns=netns,
                            CNI_ARGS=args)
    assert result["ips"] == prev["ips"] and result["interfaces"] == prev["interfaces"]
    adv = advertisement(kube, naming.advertisement_name(vpc, "1", node.name))
    assert adv is not None and adv["spec"]["prefixes"] == ["10.33.0.2/32"]
    eps = endpoint_slice(kube, slice_name("ptp-1", vpc, "1", "IPv4"))
    assert eps is not None and eps["endpoints"][0]["addresses"] == ["10.33.0.2"]
    node.plugin.ok("DEL", with_prev(conf, result), container_id="ctr-ptp", netns=netns,
                   CNI_ARGS=args)
    assert advertisement(kube, naming.advertisement_name(vpc, "1", node.name)) is None
    node.plugin.ok("DEL", ptp, container_id="ctr-ptp", netns=netns, CNI_ARGS=args,
                   executable="ptp")
    assert run_ip("-n", os.path.basename(netns), "-o", "link").count("eth0") == 0
