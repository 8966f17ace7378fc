"""What the bench puts into a control plane: the bench node's BGPRouter, a Pod object for every
publishing ADD, the persistent-IP rows' IPAMClaims and virt-launcher Pods, and N "foreign"
objects of each kind the plugin reads or writes.

The foreign BGPVRFInstances, BGPAdvertisements, EndpointSlices and Pods belong to other nodes,
other routers and (for Pods and slices) partly other namespaces, the way a busy cluster looks
to one node: an ADD whose selectors narrow correctly never sees them. They are created with
the admin client (`e2e.harness.kube`, thread-safe) from parallel threads. The cluster is thrown
away at the end, so nothing here is deleted one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cni_plugin.core import naming
from cni_plugin.kube.kinds import PODS
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    ENDPOINT_SLICES,
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TENANT_LABEL,
    VERSION,
    VRF_INSTANCES,
)
from e2e.harness.ipamclaims import claims_path
from e2e.harness.kube import ApiError, Kube
from e2e.harness.kubevirt.standins import (
    kubelet_reports_succeeded,
    kubevirt_claim,
    launcher_pod,
)
from e2e.harness.publishing import BGP_NS, create_pod, create_router
from e2e.harness.wait import wait_until
from netconf import base62

BENCH_NAMESPACE = "vpc-attach-bench"
OTHER_NAMESPACES = tuple(f"bench-other-{k}" for k in range(4))
OTHER_NODES = 50
FOREIGN_VPC_BASE = 1000  # our own VPC ids are random values above 10**6
CREATE_THREADS = 8
SERVICE_ACCOUNT_WAIT_S = 60.0
T = TypeVar("T")
R = TypeVar("R")


def prepare_namespaces(kube: Kube) -> None:
    """The bench's Pod namespace and the foreign ones, each with its default ServiceAccount."""
    namespaces = (BENCH_NAMESPACE, *OTHER_NAMESPACES)
    for name in namespaces:
        _create(kube, "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_until(  # Pod admission needs it
        "the bench namespaces' default ServiceAccounts",
        lambda: all(kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None
                    for name in namespaces),
        SERVICE_ACCOUNT_WAIT_S, interval=0.1)


def bench_router(kube: Kube, node: str) -> str:
    """The bench node's BGPRouter; its name."""
    return create_router(kube, node)


def bench_node(kube: Kube, node: str) -> None:
    """The bench node's Node object: a cluster pool's IPAMBlocks are owned by it."""
    kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})


def bench_pods(kube: Kube, node: str, names: Iterable[str]) -> dict[str, str]:
    """Pod objects on the bench node (nothing runs them), created in parallel; name -> uid."""
    names = list(names)

    def make(kube: Kube, name: str) -> str:
        return create_pod(kube, name, node, BENCH_NAMESPACE)

    return dict(zip(names, _parallel(kube, make, names), strict=True))


def launcher_pods(kube: Kube, node: str, claims: Mapping[str, str | None],
                  vms: Mapping[str, str]) -> dict[str, str]:
    """virt-launcher Pods on the bench node as kubevirt's webhook leaves them, each naming its
    IPAMClaim (or none: None) and labelled with its VM (vms: Pod name -> VM; the Pod's own name
    for a Pod not listed) as virt-controller labels them, created in parallel; name -> uid. A
    Pod of a claim is completed at once (phase Succeeded, as kubelet reports a virt-launcher
    that exited): the bench makes every run's Pod before the rounds, where KubeVirt runs one of
    a VM's Pods at a time, and a claim's living Pods are its holders (a third is refused, issue
    32's live migration)."""
    names = list(claims)

    def make(kube: Kube, name: str) -> str:
        body = launcher_pod(name, BENCH_NAMESPACE, node, vms.get(name, name), claims[name])
        made = kube.create(PODS.path(BENCH_NAMESPACE), body)
        if claims[name] is not None:
            kubelet_reports_succeeded(kube, BENCH_NAMESPACE, name)
        return str(made["metadata"]["uid"])

    return dict(zip(names, _parallel(kube, make, names), strict=True))


def vm_claims(kube: Kube, vms: Mapping[str, str], network: str) -> list[str]:
    """The IPAMClaim kubevirt's ipam-extensions makes for each VM's network (vm -> the
    network config's name), created in parallel; their names."""
    def make(kube: Kube, vm: str) -> str:
        made = kube.create(claims_path(BENCH_NAMESPACE),
                           kubevirt_claim(BENCH_NAMESPACE, vm, f"uid-{vm}", network, vms[vm]))
        return str(made["metadata"]["name"])

    return _parallel(kube, make, list(vms))


def foreign_objects(kube: Kube, count: int) -> dict[str, int]:
    """`count` objects of each of the four kinds, none of them the bench node's."""
    kinds: list[tuple[Callable[[int], str], Callable[[int], dict[str, Any]]]] = [
        (lambda _k: VRF_INSTANCES.path(BGP_NS), _instance),
        (lambda _k: ADVERTISEMENTS.path(BGP_NS), _advert),
        (lambda k: PODS.path(_namespace(k)), _pod),
        (lambda k: ENDPOINT_SLICES.path(_namespace(k)), _slice),
    ]

    def make(kube: Kube, task: tuple[int, int]) -> None:
        kind, k = task
        path, body = kinds[kind]
        _create(kube, path(k), body(k))

    _parallel(kube, make, [(kind, k) for k in range(count) for kind in range(len(kinds))])
    return {"BGPVRFInstance": count, "BGPAdvertisement": count, "Pod": count,
            "EndpointSlice": count}


def _parallel(kube: Kube, work: Callable[[Kube, T], R], items: list[T]) -> list[R]:
    with ThreadPoolExecutor(CREATE_THREADS, thread_name_prefix="bench-create") as pool:
        return list(pool.map(lambda item: work(kube, item), items))


def _create(kube: Kube, path: str, body: dict[str, Any]) -> None:
    try:
        kube.create(path, body)
    except ApiError as exc:
        if exc.status != 409:  # already there (a retried create that had succeeded)
            raise


# Half of the foreign Pods and slices share the bench's namespace: only the node narrows them.
def _namespace(k: int) -> str:
    return BENCH_NAMESPACE if k % 2 == 0 else OTHER_NAMESPACES[k % len(OTHER_NAMESPACES)]


def _node(k: int) -> str:
    return f"other-node-{k % OTHER_NODES}"


def _vpc(k: int) -> str:
    return base62.encode_base62(FOREIGN_VPC_BASE + k)


def _address(k: int) -> str:
    return f"198.19.{k // 250 % 250}.{k % 250 + 1}"


def _instance(k: int) -> dict[str, Any]:
    target = f"65001:{FOREIGN_VPC_BASE + k}"
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
            "metadata": {"name": naming.vrf_instance_name(_vpc(k), _node(k))},
            "spec": {"routerRef": {"name": f"router-{_node(k)}"}, "vrfID": k // OTHER_NODES + 1,
                     "importRouteTargets": [{"value": target}],
                     "exportRouteTargets": [{"value": target}]}}


def _advert(k: int) -> dict[str, Any]:
    cid = naming.annotation_cid(f"foreign-{k:06d}")
    notes = {f"galactic.datum.net/netns.{cid}": f"/var/run/netns/foreign-{k}",
             f"galactic.datum.net/allocated-subnet-ipv4.{cid}": _address(k),
             f"galactic.datum.net/node.{cid}": _node(k)}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPAdvertisement",
            "metadata": {"name": naming.advertisement_name(_vpc(k), "1", _node(k)),
                         "annotations": notes},
            "spec": {"routerRef": {"name": f"router-{_node(k)}"},
                     "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
                     "prefixes": [f"{_address(k)}/32"], "communities": [f"65001:{k}"],
                     "vrfID": k // OTHER_NODES + 1, "function": "End.DT46"}}


def _pod(k: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"foreign-{k}"},
            "spec": {"nodeName": _node(k), "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "registry.invalid/pause:1"}]}}


def _slice(k: int) -> dict[str, Any]:
    tenant = naming.tenant_id(_vpc(k), "1")
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"foreign-{k}-ipv4",
                         "labels": {TENANT_LABEL: tenant, MANAGED_BY_LABEL: MANAGED_BY},
                         "annotations": {TENANT_LABEL: tenant}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [_address(k)], "nodeName": _node(k),
                           "conditions": {"ready": True, "serving": True},
                           "targetRef": {"kind": "Pod", "namespace": _namespace(k),
                                         "name": f"foreign-{k}"}}]}
