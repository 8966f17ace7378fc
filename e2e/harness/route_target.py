"""The scene of e2e/test_route_target_crd.py: a control plane of its own whose BGPVRFInstance CRD
is galactic's or vpc-attach's (`ControlPlane`), reached through a fault proxy that records each
request, and this node's plugin pointed at it (`node_plugin`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from cni_plugin.publish.resources import ADVERTISEMENTS, GROUP, VERSION, VRF_INSTANCES
from e2e.harness.agentproc import OwnAgents
from e2e.harness.cluster import Cluster
from e2e.harness.cluster.cluster import REPO_ROOT
from e2e.harness.faults import ProxiedCluster, Seen, start_proxy
from e2e.harness.galactic.build import ensure_galactic_built
from e2e.harness.kube import Kube, crd_established
from e2e.harness.plugin import VIA_AGENT, Plugin, base_conf, host_local
from e2e.harness.publishing import BGP_NS, create_router
from e2e.harness.wait import wait_until

CRD = "bgpvrfinstances.network.datumapis.com"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_FILE = "network.datumapis.com_bgpvrfinstances.yaml"
NODE = "rt-node"
ROUTER = f"router-{NODE}"  # create_router's name
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=rt-pod"
NOT_THE_VERBS = ("events", "selfsubjectaccessreviews", "leases")  # the agent's own writes


class ControlPlane:
    """This module's control plane, serving whichever BGPVRFInstance CRD a test asks for."""

    def __init__(self, cluster: Cluster, proxied: ProxiedCluster) -> None:
        self.cluster = cluster
        self.proxied = proxied  # what the node's plugin reaches it through
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


@contextlib.contextmanager
def control_plane_up(directory: Path) -> Iterator[ControlPlane]:
    """A control plane of its own with this node's BGPRouter, and a proxy in front of it."""
    cluster = Cluster.up(directory, controller_manager=False)
    try:
        with cluster.admin() as kube:
            create_router(kube, NODE)
        proxied = start_proxy(cluster, directory)
        try:
            yield ControlPlane(cluster, proxied)
        finally:
            proxied.stop()
    finally:
        cluster.down()


@contextlib.contextmanager
def node_plugin(control_plane: ControlPlane, cni_bin: Path, tmp_path: Path,
                own_agents: OwnAgents) -> Iterator[Plugin]:
    """vpc-attach as the node runs it against this module's control plane (through its
    proxy): in-process, or in the agent pass through an agent of this node."""
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    node_env = {"VPC_ATTACH_NODE_NAME": NODE,
                "VPC_ATTACH_KUBECONFIG": str(control_plane.proxied.kubeconfig)}
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


def conf(vpc: str, tmp_path: Path) -> dict[str, Any]:
    """The stanza: a veth of `vpc` publishing BGP, host-local's pool under tmp_path/ipam."""
    return base_conf(vpc, "1", ipam=host_local(tmp_path / "ipam", "10.199.0.0/24"),
                     publish={"bgp": True, "endpointSlice": False})


def requests_of(proxied: ProxiedCluster, mark: int) -> list[Seen]:
    """The requests the proxy saw since `mark` but watches and the agent's own writes."""
    wait_until("the proxy to record the ADD's requests",
               lambda: proxied.proxy.in_flight() == 0, 10, interval=0.05)
    return [s for s in proxied.proxy.seen()[mark:]
            if "watch=1" not in s.path and s.resource not in NOT_THE_VERBS]


def label(seen: Seen) -> str:
    """`METHOD resource (dry run) status` of a request."""
    return f"{seen.method} {seen.resource}{' (dry run)' if seen.dry_run else ''} {seen.status}"


def writes(seen: list[Seen]) -> list[str]:
    """The labels of the writes among `seen`."""
    return [label(s) for s in seen if s.method != "GET"]


def version(obj: dict[str, Any]) -> tuple[str, str]:
    """(name, resourceVersion) of an object: changed by any write."""
    return obj["metadata"]["name"], obj["metadata"]["resourceVersion"]


def another_writers_instance(kube: Kube, name: str) -> dict[str, Any]:
    """The VPC's instance on this node as another component made it (a route target that
    fits), as the API server stored it."""
    made: dict[str, Any] = kube.create(VRF_INSTANCES.path(BGP_NS), {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
        "metadata": {"name": name},
        "spec": {"routerRef": {"name": ROUTER}, "vrfID": 7,
                 "importRouteTargets": [{"value": "65000:7"}],
                 "exportRouteTargets": [{"value": "65000:7"}]}})
    return made


def objects(kube: Kube) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The BGPVRFInstances and BGPAdvertisements of the BGP namespace."""
    return (kube.list(VRF_INSTANCES.path(BGP_NS)), kube.list(ADVERTISEMENTS.path(BGP_NS)))
