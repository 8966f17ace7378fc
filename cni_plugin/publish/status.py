"""STATUS's publishing: reachability and RBAC, asked with SelfSubjectAccessReviews, and whether
this node's router gives the VPCs SIDs."""

from __future__ import annotations

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation
from cni_plugin.kube.client import KubeClient
from cni_plugin.kube.kinds import ACCESS_REVIEWS
from cni_plugin.kube.session import VerbCluster
from cni_plugin.publish.boundary import api_boundary, connected
from cni_plugin.publish.context import PublishContext
from cni_plugin.publish.resources import REQUIRED_PERMISSIONS
from netconf.errors import STATUS_NOT_AVAILABLE, CniError


def check_access(ctx: PublishContext) -> None:
    """Code 50 naming the first permission the plugin's identity lacks."""
    pod_namespace = ctx.inv.pod.namespace
    for group, resource, verbs in REQUIRED_PERMISSIONS:
        namespace = ctx.namespace if group.startswith("network.") else pod_namespace
        for verb in verbs:
            api_review_access(ctx.client, group, resource, verb, namespace=namespace,
                              deadline=ctx.inv.deadline)


def api_review_access(client: KubeClient, group: str, resource: str, verb: str, *,
                      namespace: str | None = None, subresource: str = "",
                      deadline: Deadline) -> None:
    """Code 50 unless a SelfSubjectAccessReview says the plugin's identity may do verb."""
    attrs = {"group": group, "resource": resource, "verb": verb}
    if namespace:
        attrs["namespace"] = namespace
    if subresource:
        attrs["subresource"] = subresource
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    review = client.create(ACCESS_REVIEWS, body, deadline=deadline)
    if not (review.get("status") or {}).get("allowed"):
        where = f" in namespace {namespace!r}" if namespace else ""
        what = f"{resource}/{subresource}" if subresource else resource
        raise CniError(STATUS_NOT_AVAILABLE, f"missing RBAC permission: {verb} "
                       f"{what}{'.' + group if group else ''}{where}",
                       "apply packaging/rbac and bind the ClusterRole to the plugin's "
                       "identity")


def router_has_sids(inv: Invocation, cluster: VerbCluster) -> bool:
    """Whether this node's router has an SRv6 locator and node ID (STATUS)."""
    if not inv.conf.publish.bgp:
        return False
    from cni_plugin.publish.bgp.router import find_router
    with connected(inv, cluster) as ctx, api_boundary("find the node's BGPRouter"):
        if ctx is None:
            return False
        router = find_router(ctx, inv.deadline)
        return bool(router.srv6_locator and router.node_id)


def publishing_status(inv: Invocation, cluster: VerbCluster) -> None:
    """Code 50 unless the kubeconfig works, the API answers and RBAC allows what ADD does."""
    from cni_plugin.publish.bgp.router import find_router
    try:
        with connected(inv, cluster) as ctx, api_boundary("check access"):
            if ctx is None:
                return
            check_access(ctx)
            if inv.conf.publish.bgp:  # ADD would fail with code 7 without exactly one
                find_router(ctx, inv.deadline)
    except CniError as exc:
        if exc.code == STATUS_NOT_AVAILABLE:
            raise
        raise CniError(STATUS_NOT_AVAILABLE, exc.msg, exc.details) from None
