"""The compiler's inputs read off Pods, namespaces and EndpointSlices (cni_plugin/policy/world)."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from cni_plugin.kube.networks import NetworkName
from cni_plugin.policy.compile import PRIMARY, Endpoint
from cni_plugin.policy.networks import UNKNOWN_NETWORK, network_of
from cni_plugin.policy.world import build_world, pod_facts, slice_endpoint
from cni_plugin.publish.resources import ATTACHMENT_LABEL, IFNAME_ANNOTATION, MANAGED_BY_LABEL


def pod(name: str, networks: Any = None, uid: str = "u1", **spec: Any) -> dict[str, Any]:
    annotations = {} if networks is None else {"k8s.v1.cni.cncf.io/networks": networks}
    return {"metadata": {"name": name, "namespace": "ns1", "uid": uid, "labels": {"app": name},
                         "annotations": annotations}, "spec": spec}


@pytest.mark.parametrize("networks, ifname, network", [
    (None, "eth0", PRIMARY),
    ("net-a", "net1", NetworkName("ns1", "net-a")),
    ("net-a, other/net-b", "net2", NetworkName("other", "net-b")),
    ("net-a@data", "data", NetworkName("ns1", "net-a")),
    ("net-a@data", "net1", PRIMARY),  # the element asked for another interface
    (json.dumps([{"name": "net-b", "namespace": "other", "interface": "vm0"}]), "vm0",
     NetworkName("other", "net-b")),
    ("[not json", "net1", UNKNOWN_NETWORK),
    ("net-a@x, net-b@x", "x", UNKNOWN_NETWORK),  # two networks claim one interface
])
def test_the_network_an_interface_was_made_from(networks: Any, ifname: str,
                                                network: Any) -> None:
    assert network_of(pod("p", networks), ifname) == network


def test_named_ports_count_containers_and_sidecars_with_their_protocol() -> None:
    facts = pod_facts(pod("p", containers=[
        {"name": "app", "ports": [{"name": "http", "containerPort": 8080},
                                  {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                  {"containerPort": 9}]}],
        initContainers=[{"name": "proxy", "restartPolicy": "Always",
                         "ports": [{"name": "admin", "containerPort": 15000}]},
                        {"name": "setup", "ports": [{"name": "once", "containerPort": 1}]}]))
    assert dict(facts.named_ports) == {("http", "TCP"): 8080, ("dns", "UDP"): 53,
                                       ("admin", "TCP"): 15000}
    assert facts.labels == {"app": "p"}


def slice_of(name: str, address: str, uid: str = "u1", ifname: str = "net1",
             managed: bool = True) -> dict[str, Any]:
    labels = {ATTACHMENT_LABEL: "vpc7-1"}
    if managed:
        labels[MANAGED_BY_LABEL] = "vpc-attach"
    return {"metadata": {"name": f"{name}-s", "namespace": "ns1", "labels": labels,
                         "annotations": {IFNAME_ANNOTATION: ifname}},
            "endpoints": [{"addresses": [address],
                           "targetRef": {"kind": "Pod", "namespace": "ns1", "name": name,
                                         "uid": uid}}]}


def test_a_slice_names_its_pods_attachment_only_while_the_pod_is_the_same() -> None:
    pods = {("ns1", "web"): pod("web", "net-a")}
    assert slice_endpoint(slice_of("web", "10.0.0.5"), pods) == Endpoint(
        "ns1", "web", NetworkName("ns1", "net-a"), "vpc7", (ipaddress.ip_address("10.0.0.5"),))
    assert slice_endpoint(slice_of("web", "10.0.0.5", uid="old"), pods) is None
    assert slice_endpoint(slice_of("web", "10.0.0.5", managed=False), pods) is None
    assert slice_endpoint(slice_of("gone", "10.0.0.5"), pods) is None


def test_the_world_merges_a_pods_addresses_from_slices_and_this_nodes_records() -> None:
    web = pod("web", "net-a")
    local = Endpoint("ns1", "web", NetworkName("ns1", "net-a"), "vpc7",
                     (ipaddress.ip_address("10.0.0.5"),))
    world = build_world([], [web], [{"metadata": {"name": "ns1", "labels": {"team": "a"}}}],
                        [slice_of("web", "fd00::5")], [local], network_policy=True)
    assert [e.addresses for e in world.endpoints] == [
        (ipaddress.ip_address("10.0.0.5"), ipaddress.ip_address("fd00::5"))]
    assert world.namespaces == {"ns1": {"team": "a"}} and world.network_policy
