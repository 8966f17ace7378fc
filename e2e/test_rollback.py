"""Created-only rollback (SPEC §7) with failures injected by the real API server: a
ValidatingAdmissionPolicy refuses one kind of write at each publishing step, in each isolation
mode. A refused EndpointSlice (the last step) is proven once per path elsewhere: in-process and
through the agent by the fault matrix's `rb-*` rows (e2e/test_fault_matrix.py: the IPv4 slice
refused, each write of the rollback faulted), through the CRI by e2e/test_containerd.py, under
a kubelet by e2e/test_node.py, and with routers announcing by e2e/test_galactic_nodes.py."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    GROUP,
    VERSION,
    VRF_INSTANCES,
)
from e2e.harness.kernel import links_in
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, host_local, host_local_reservations
from e2e.harness.publishing import (
    BGP_NS,
    Node,
    advertisement,
    create_pod,
    deny_writes,
    make_node,
    vrf_instance,
    wait_denied,
)

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]


@pytest.fixture
def node(kube: Kube, cluster: Any, plugin: Plugin) -> Node:
    """This node."""
    return make_node(kube, cluster, plugin)


def _conf(vpc: str, att: str, tmp_path: Path, isolation: str) -> dict[str, Any]:
    conf = base_conf(vpc, att, isolation=isolation,
                     ipam=host_local(tmp_path / "ipam", "fd00:e2::/64"))
    conf.pop("publish")
    return conf


def _publish_only(on: Node, kube: Kube, vpc: str, att: str, address: str) -> str:
    """A container on node `on` publishing (vpc, att) without touching this kernel (its
    netns is PID 1's, so no node prunes it)."""
    uid = create_pod(kube, f"remote-{secrets.token_hex(3)}", on.name)
    pod = f"remote-{uid[:6]}"
    prev = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/proc/1/ns/net"}],
            "ips": [{"address": address, "interface": 0}]}
    conf = {"cniVersion": "1.1.0", "name": "remote", "type": "vpc-attach", "vpc": vpc,
            "vpcattachment": att, "attachment": "existing", "prevResult": prev,
            "publish": {"bgp": True, "endpointSlice": False}}
    on.plugin.ok("ADD", conf, container_id="ctr-remote", netns="/proc/1/ns/net",
                 CNI_ARGS=on.cni_args(pod))
    return naming.annotation_cid("ctr-remote")


def _assert_nothing_kept(node_plugin: Plugin, vpc: str, att: str, netns: str,
                         tmp_path: Path) -> None:
    assert naming.host_link_name(vpc, att) not in links_in()
    assert links_in(netns) == {"lo"}
    assert host_local_reservations(tmp_path / "ipam", f"net-{vpc}") == []


def _existing(found: dict[str, Any] | None) -> dict[str, Any]:
    assert found is not None
    return found


def _dry_run(kube: Kube, path: str, body: dict[str, Any]) -> object:
    return kube.create(path, body, dry_run=True)


def test_denied_vrf_instance_create_leaves_nothing(kube: Kube, node: Node, netns: str,
                                                   vpc: str, tmp_path: Path,
                                                   isolation: str) -> None:
    prefix = naming.hex_id(vpc) + "-"
    remove = deny_writes(kube, f"deny-vrf-{vpc.lower()}", "bgpvrfinstances", GROUP,
                         ["CREATE", "UPDATE"], prefix)
    try:
        wait_denied(lambda: _dry_run(kube, VRF_INSTANCES.path(BGP_NS), {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
            "metadata": {"name": prefix + "probe"},
            "spec": {"routerRef": {"name": node.router}, "vrfID": 9,
                     "importRouteTargets": [{"value": "1:1"}],
                     "exportRouteTargets": [{"value": "1:1"}]}}))
        uid = create_pod(kube, "deny-vrf", node.name)
        answer = node.plugin.call("ADD", _conf(vpc, "7", tmp_path, isolation), container_id="ctr-f",
                                  netns=netns, CNI_ARGS=node.cni_args("deny-vrf", uid))
        assert answer.code == 104 and "BGPVRFInstance" in answer.body["msg"], answer.stdout
        _assert_nothing_kept(node.plugin, vpc, "7", netns, tmp_path)
        assert vrf_instance(kube, naming.vrf_instance_name(vpc, node.name)) is None
        assert advertisement(kube, naming.advertisement_name(vpc, "7", node.name)) is None
    finally:
        remove()


def test_denied_advertisement_update_keeps_the_shared_objects_intact(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path, isolation: str) -> None:
    # Pre-existing shared state: the VPC's instance on this node (another attachment) and
    # this node's advertisement of the attachment, which another container already uses.
    sibling_uid = create_pod(kube, "sibling", node.name)
    node.plugin.ok("ADD", _conf(vpc, "5", tmp_path, isolation), container_id="ctr-sibling",
                   netns=netns, ifname="net5", CNI_ARGS=node.cni_args("sibling", sibling_uid))
    remote_cid = _publish_only(node, kube, vpc, "7", "fd00:99::/96")
    instance_before = vrf_instance(kube, naming.vrf_instance_name(vpc, node.name))
    adv_name = naming.advertisement_name(vpc, "7", node.name)
    adv_before = advertisement(kube, adv_name)
    assert instance_before is not None and adv_before is not None

    remove = deny_writes(kube, f"deny-adv-{vpc.lower()}", "bgpadvertisements", GROUP,
                         ["UPDATE"], adv_name)
    try:
        wait_denied(lambda: kube.put(ADVERTISEMENTS.path(BGP_NS, adv_name),
                                     _existing(advertisement(kube, adv_name)), dry_run=True))
        uid = create_pod(kube, "deny-adv", node.name)
        answer = node.plugin.call("ADD", _conf(vpc, "7", tmp_path, isolation), container_id="ctr-f",
                                  netns=netns, CNI_ARGS=node.cni_args("deny-adv", uid))
        assert answer.code == 104 and "BGPAdvertisement" in answer.body["msg"], answer.stdout
    finally:
        remove()
    assert naming.host_link_name(vpc, "7") not in links_in()
    after = advertisement(kube, adv_name)
    assert after is not None and after["spec"] == adv_before["spec"]
    assert f"galactic.datum.net/netns.{remote_cid}" in after["metadata"]["annotations"]
    instance_after = vrf_instance(kube, naming.vrf_instance_name(vpc, node.name))
    assert instance_after is not None
    assert instance_after["metadata"]["uid"] == instance_before["metadata"]["uid"]
    assert instance_after["spec"] == instance_before["spec"]
