"""On a cluster whose BGPVRFInstance CRD is galactic's own (route targets of at most 9 digits a
side; vpc-attach's CRDs take 10, SPEC §8), a VPC whose route target does not fit is refused
with code 7 naming the CRD's limit before anything is made; one that fits attaches there.
The cluster is this module's own control plane (the session's keeps vpc-attach's CRDs)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni_plugin.core import naming
from cni_plugin.publish.resources import ADVERTISEMENTS, VRF_INSTANCES
from e2e.harness.cluster import Cluster
from e2e.harness.galactic.build import ensure_galactic_built
from e2e.harness.kernel import links_in, temporary_netns
from e2e.harness.kube import Kube, crd_established
from e2e.harness.plugin import Plugin, base_conf, host_local, host_local_reservations
from e2e.harness.publishing import BGP_NS, create_router
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until
from netconf.base62 import encode_base62

pytestmark = [pytest.mark.root, pytest.mark.cluster]
CRD = "bgpvrfinstances.network.datumapis.com"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NODE = "rt-node"
WIDE_VPC = encode_base62(4_000_000_062)  # route target 65000:4000000062: 10 digits
NARROW_VPC = encode_base62(999_000_062)  # 65000:999000062: 9 digits
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=rt-pod"


@pytest.fixture(scope="module")
def galactic_crds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane of its own whose BGPVRFInstance CRD is galactic's, and this node's
    BGPRouter."""
    cluster = Cluster.up(tmp_path_factory.mktemp("galactic-crds"), controller_manager=False)
    try:
        with cluster.admin() as kube:
            kube.delete(f"{CRDS}/{CRD}")
            wait_until(f"vpc-attach's {CRD} gone", lambda: kube.get(f"{CRDS}/{CRD}") is None,
                       60)
            manifest = yaml.safe_load((ensure_galactic_built().crd_dir /
                                       "network.datumapis.com_bgpvrfinstances.yaml").read_text())
            kube.create(CRDS, manifest)
            wait_until(f"galactic's {CRD} established", lambda: crd_established(kube, CRD), 60)
            create_router(kube, NODE)
        yield cluster
    finally:
        cluster.down()


@contextlib.contextmanager
def node_plugin(cluster: Cluster, cni_bin: Path, tmp_path: Path) -> Iterator[Plugin]:
    """vpc-attach as the node runs it, against this module's control plane."""
    (tmp_path / "locks").mkdir()
    yield Plugin(cni_bin, tmp_path / "locks", {
        "VPC_ATTACH_NODE_NAME": NODE, "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig)})


def _conf(vpc: str, tmp_path: Path) -> dict[str, Any]:
    return base_conf(vpc, "1", ipam=host_local(tmp_path / "ipam", "10.199.0.0/24"),
                     publish={"bgp": True, "endpointSlice": False})


def test_a_route_target_galactics_crd_cannot_hold_is_refused_before_anything_is_made(
        galactic_crds: Cluster, cni_bin: Path, tmp_path: Path) -> None:
    with galactic_crds.admin() as kube, bound(kube, WIDE_VPC), \
            node_plugin(galactic_crds, cni_bin, tmp_path) as plugin, \
            temporary_netns("vpa-rt") as netns:
        before = links_in()
        refused = plugin.call("ADD", _conf(WIDE_VPC, tmp_path), container_id="rt-wide",
                              netns=netns, CNI_ARGS=ARGS)
        print(f"\nADD of VPC {WIDE_VPC} ({naming.route_target(65000, WIDE_VPC)}) with "
              f"galactic's CRD: {refused.body}")
        assert refused.status != 0 and refused.code == 7, refused.stdout
        assert "at most 9 digits" in refused.body["msg"] and \
            "vpc" in refused.body["msg"], refused.body
        assert "packaging/crds" in refused.body["details"]
        assert links_in(netns) == {"lo"} and links_in() == before
        assert host_local_reservations(tmp_path / "ipam", f"net-{WIDE_VPC}") == []
        assert _objects(kube) == ([], [])


def test_a_route_target_that_fits_attaches_on_the_same_cluster(
        galactic_crds: Cluster, cni_bin: Path, tmp_path: Path) -> None:
    """The positive control: the cluster, its CRD and the node serve a VPC that fits."""
    with galactic_crds.admin() as kube, bound(kube, NARROW_VPC), \
            node_plugin(galactic_crds, cni_bin, tmp_path) as plugin, \
            temporary_netns("vpa-rt") as netns:
        conf = _conf(NARROW_VPC, tmp_path)
        added = plugin.ok("ADD", conf, container_id="rt-narrow", netns=netns, CNI_ARGS=ARGS)
        try:
            instances, _ = _objects(kube)
            assert [i["metadata"]["name"] for i in instances] == [
                naming.vrf_instance_name(NARROW_VPC, NODE)]
        finally:
            plugin.ok("DEL", {**conf, "prevResult": added}, container_id="rt-narrow",
                      netns=netns, CNI_ARGS=ARGS)


def _objects(kube: Kube) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The BGPVRFInstances and BGPAdvertisements of the BGP namespace."""
    return (kube.list(VRF_INSTANCES.path(BGP_NS)), kube.list(ADVERTISEMENTS.path(BGP_NS)))
