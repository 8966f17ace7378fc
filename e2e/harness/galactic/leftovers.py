"""What galactic's GC passes (`e2e.harness.galactic.sweep`) find on a node beside vpc-attach:
leftovers planted as the positive controls (a `vrf_table` row no BGPVRFInstance names, a
BGPAdvertisement of a container whose netns is gone), a tap attached for the pass, and what
is read back (vpc-attach's rows and objects).

Layouts from galactic's ``prog/usid.c``: the `vrf_table` key is Block(48) << 12 | Argument (a
u64, host byte order); its value `struct vrf_value` (table u32, egress kind u32, then packets,
bytes, last seen, generation and dropped as u64s).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import struct
import subprocess
from collections.abc import Iterator
from typing import Any

from cni_plugin.core import naming
from e2e.harness.galactic.datapath import DatapathNode
from e2e.harness.galactic.vpc_nodes import VpcAttachNode
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import with_prev
from e2e.harness.publishing import BGP_NS, advertisement, vrf_instance

# gc.SweepEBPFVRFTable's log line when it returns without sweeping (no BGPRouter for the node).
SKIPPED = "skipping reconcile this tick"
STRAY_ARGUMENT = 4000  # no test here makes 4,000 VPCs on a node: no instance names it
VRF_VALUE = struct.Struct("<IIQQQQQ")
ADVERTISEMENTS = "/apis/network.datumapis.com/v1alpha1/namespaces/{namespace}/bgpadvertisements"


def block(locator: str) -> int:
    """The uSID Block: the locator's 48 bits."""
    return int(ipaddress.IPv6Network(locator).network_address) >> 80


def plant_vrf_row(node: DatapathNode, argument: int, table: int = 4000) -> str:
    """A `vrf_table` row of the node's Block for `argument`, written as by some earlier ADD
    (generation 1: older than any sweep's cutoff); its key (hex)."""
    key = struct.pack("<Q", block(node.locator) << 12 | argument)
    value = VRF_VALUE.pack(table, 0, 0, 0, 0, 1, 0)
    subprocess.run(["bpftool", "map", "update", "pinned", str(node.pin_dir / "vrf_table"),
                    "key", "hex", *(f"{b:02x}" for b in key), "value", "hex",
                    *(f"{b:02x}" for b in value)], check=True, capture_output=True, timeout=60)
    return key.hex()


def owned_vrf_rows(node: VpcAttachNode) -> dict[str, tuple[int, int]]:
    """`vrf_table` as its writers own it: {key: (table, egress kind)} (the counters and
    generation move with traffic and re-registration)."""
    return {key: VRF_VALUE.unpack(bytes.fromhex(value))[:2]
            for key, value in node.rows()["vrf_table"].items()}


@contextlib.contextmanager
def orphan_advertisement(kube: Kube, node: VpcAttachNode, vpc: str) -> Iterator[str]:
    """A BGPAdvertisement of `vpc` on the node's router whose one container's netns is gone,
    as a force-killed Pod leaves it (galactic's GC deletes it); deleted afterwards if left.
    Its path."""
    collection = ADVERTISEMENTS.format(namespace=BGP_NS)
    container = f"gone{os.urandom(8).hex()}"
    name = naming.advertisement_name(vpc, "1", node.name)
    kube.create(collection, {
        "apiVersion": "network.datumapis.com/v1alpha1", "kind": "BGPAdvertisement",
        "metadata": {"name": name, "annotations": {
            f"galactic.datum.net/netns.{container}": "/var/run/netns/vpa-gone-" + container,
            f"galactic.datum.net/allocated-subnet-ipv4.{container}": "10.212.0.9"}},
        "spec": {"routerRef": {"name": node.galactic.router},
                 "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
                 "prefixes": ["10.212.0.9/32"],
                 "communities": [naming.route_target(65000, vpc)],
                 "vrfID": STRAY_ARGUMENT - 1, "function": "End.DT46"}})
    path = f"{collection}/{name}"
    try:
        yield path
    finally:
        if kube.get(path) is not None:
            kube.delete(path)


@contextlib.contextmanager
def tapped(node: VpcAttachNode, conf: dict[str, Any], container: str) -> Iterator[str]:
    """A tap attachment on the node (a VM's launcher Pod netns); DEL afterwards. Its host
    link's name."""
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={container}"
    with temporary_netns("vpa-gcvm") as netns:
        result = node.plugin.ok("ADD", conf, container_id=container, netns=netns,
                                CNI_ARGS=args)
        try:
            yield str(result["interfaces"][0]["name"])
        finally:
            node.plugin.ok("DEL", with_prev(conf, result), container_id=container, netns=netns,
                           CNI_ARGS=args)


def published(kube: Kube, vpc: str, node: VpcAttachNode) -> dict[str, bool]:
    """Whether the VPC's instance and its attachments' advertisements ("1" veth, "2" tap) on
    the node exist."""
    return {"BGPVRFInstance": vrf_instance(kube, naming.vrf_instance_name(vpc, node.name))
            is not None,
            **{f"BGPAdvertisement {att}": advertisement(
                kube, naming.advertisement_name(vpc, att, node.name)) is not None
               for att in ("1", "2")}}
