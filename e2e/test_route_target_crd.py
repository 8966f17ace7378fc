"""On a cluster whose BGPVRFInstance CRD is galactic's own (route targets of at most 9 digits a
side; vpc-attach's CRDs take 10, SPEC §8), a VPC whose route target does not fit is refused
with code 7 naming the CRD's limit, and the ADD leaves nothing (the instance's create is the
question: the CRD refuses it, the rest is rolled back); one that fits attaches there, and the
same wide VPC attaches once vpc-attach's CRD is back. The cluster is this module's own control
plane (the session's keeps vpc-attach's CRDs); in the agent pass, through an agent of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni_plugin.core import naming
from cni_plugin.publish.resources import ADVERTISEMENTS, VRF_INSTANCES
from e2e.harness.agentproc import OwnAgents
from e2e.harness.cluster import Cluster
from e2e.harness.cluster.cluster import REPO_ROOT
from e2e.harness.galactic.build import ensure_galactic_built
from e2e.harness.kernel import links_in, temporary_netns
from e2e.harness.kube import Kube, crd_established
from e2e.harness.plugin import VIA_AGENT, Plugin, base_conf, host_local, host_local_reservations
from e2e.harness.publishing import BGP_NS, create_router
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until
from netconf.base62 import encode_base62

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
CRD = "bgpvrfinstances.network.datumapis.com"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_FILE = "network.datumapis.com_bgpvrfinstances.yaml"
NODE = "rt-node"
WIDE_VPC = encode_base62(4_000_000_062)  # route target 65000:4000000062: 10 digits
NARROW_VPC = encode_base62(999_000_062)  # 65000:999000062: 9 digits
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=rt-pod"


class ControlPlane:
    """This module's control plane, serving whichever BGPVRFInstance CRD a test asks for."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.serving = "vpc-attach"  # Cluster.up applies packaging/crds

    def serve(self, kube: Kube, whose: str) -> None:
        """Replace the BGPVRFInstance CRD by galactic's or vpc-attach's, unless it is already."""
        if self.serving == whose:
            return
        crd_dir = ensure_galactic_built().crd_dir if whose == "galactic" else \
            REPO_ROOT / "packaging" / "crds"
        kube.delete(f"{CRDS}/{CRD}")
        wait_until(f"{self.serving}'s {CRD} gone", lambda: kube.get(f"{CRDS}/{CRD}") is None, 60)
        kube.create(CRDS, yaml.safe_load((crd_dir / CRD_FILE).read_text()))
        wait_until(f"{whose}'s {CRD} established", lambda: crd_established(kube, CRD), 60)
        self.serving = whose


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own with this node's BGPRouter."""
    cluster = Cluster.up(tmp_path_factory.mktemp("route-target-crd"), controller_manager=False)
    try:
        with cluster.admin() as kube:
            create_router(kube, NODE)
        yield ControlPlane(cluster)
    finally:
        cluster.down()


@contextlib.contextmanager
def node_plugin(cluster: Cluster, cni_bin: Path, tmp_path: Path,
                own_agents: OwnAgents) -> Iterator[Plugin]:
    """vpc-attach as the node runs it against this module's control plane: in-process, or in
    the agent pass through an agent of this node."""
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    node_env = {"VPC_ATTACH_NODE_NAME": NODE,
                "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig)}
    plugin = Plugin(cni_bin, lock_dir, node_env)
    with contextlib.ExitStack() as stack:
        if VIA_AGENT:
            agent_dir = tmp_path / "agent"
            agent_dir.mkdir()
            agent = own_agents.enter(stack, agent_dir, env={
                **node_env, "VPC_ATTACH_LOCK_DIR": str(lock_dir),
                "VPC_ATTACH_HOST_CONFIG": str(lock_dir / "absent-host.json")})
            plugin.agent_socket = str(agent.socket)
        yield plugin


def _conf(vpc: str, tmp_path: Path) -> dict[str, Any]:
    return base_conf(vpc, "1", ipam=host_local(tmp_path / "ipam", "10.199.0.0/24"),
                     publish={"bgp": True, "endpointSlice": False})


def test_a_route_target_galactics_crd_cannot_hold_is_refused_and_leaves_nothing(
        control_plane: ControlPlane, cni_bin: Path, tmp_path: Path,
        own_agents: OwnAgents) -> None:
    cluster = control_plane.cluster
    with cluster.admin() as kube, bound(kube, WIDE_VPC), \
            node_plugin(cluster, cni_bin, tmp_path, own_agents) as plugin, \
            temporary_netns("vpa-rt") as netns:
        control_plane.serve(kube, "galactic")
        before = links_in()
        refused = plugin.call("ADD", _conf(WIDE_VPC, tmp_path), container_id="rt-wide",
                              netns=netns, CNI_ARGS=ARGS)
        print(f"\nADD of VPC {WIDE_VPC} ({naming.route_target(65000, WIDE_VPC)}) with "
              f"galactic's CRD: {refused.body}")
        assert refused.status != 0 and refused.code == 7, refused.stdout
        assert refused.body["msg"] == (
            f"invalid vpc {WIDE_VPC!r}: its route target 65000:4000000062 does not fit this "
            "cluster's BGPVRFInstance CRD, which accepts at most 9 digits on each side of the "
            "colon (galactic's CRD)"), refused.body
        assert "packaging/crds" in refused.body["details"]
        assert links_in(netns) == {"lo"} and links_in() == before
        assert host_local_reservations(tmp_path / "ipam", f"net-{WIDE_VPC}") == []
        assert _objects(kube) == ([], [])


def test_a_route_target_that_fits_attaches_with_galactics_crd(
        control_plane: ControlPlane, cni_bin: Path, tmp_path: Path,
        own_agents: OwnAgents) -> None:
    """The positive control: the cluster, galactic's CRD and the node serve a VPC that fits."""
    _attaches(control_plane, "galactic", NARROW_VPC, cni_bin, tmp_path, own_agents)


def test_the_wide_route_target_attaches_with_vpc_attachs_crd(
        control_plane: ControlPlane, cni_bin: Path, tmp_path: Path,
        own_agents: OwnAgents) -> None:
    """The same VPC that galactic's CRD refused, with vpc-attach's CRD on the same cluster."""
    _attaches(control_plane, "vpc-attach", WIDE_VPC, cni_bin, tmp_path, own_agents)


def _attaches(control_plane: ControlPlane, crd: str, vpc: str, cni_bin: Path, tmp_path: Path,
              own_agents: OwnAgents) -> None:
    """ADD of `vpc` with `crd` served creates its instance; DEL after."""
    cluster = control_plane.cluster
    with cluster.admin() as kube, bound(kube, vpc), \
            node_plugin(cluster, cni_bin, tmp_path, own_agents) as plugin, \
            temporary_netns("vpa-rt") as netns:
        control_plane.serve(kube, crd)
        conf = _conf(vpc, tmp_path)
        added = plugin.ok("ADD", conf, container_id="rt-fits", netns=netns, CNI_ARGS=ARGS)
        try:
            instances, _ = _objects(kube)
            assert [(i["metadata"]["name"], i["spec"]["importRouteTargets"]) for i in
                    instances] == [(naming.vrf_instance_name(vpc, NODE), [
                        {"value": naming.route_target(65000, vpc)}])]
        finally:
            plugin.ok("DEL", {**conf, "prevResult": added}, container_id="rt-fits",
                      netns=netns, CNI_ARGS=ARGS)


def _objects(kube: Kube) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The BGPVRFInstances and BGPAdvertisements of the BGP namespace."""
    return (kube.list(VRF_INSTANCES.path(BGP_NS)), kube.list(ADVERTISEMENTS.path(BGP_NS)))
