"""STATUS for publishing: reachability and RBAC, asked with SelfSubjectAccessReviews."""

from __future__ import annotations

from cni_plugin.publish.context import PublishContext
from cni_plugin.publish.resources import ACCESS_REVIEWS, REQUIRED_PERMISSIONS
from netconf.errors import STATUS_NOT_AVAILABLE, CniError


def check_access(ctx: PublishContext) -> None:
    """Code 50 naming the first permission the plugin's identity lacks."""
    deadline = ctx.inv.deadline
    pod_namespace = ctx.inv.pod.namespace
    for group, resource, verbs in REQUIRED_PERMISSIONS:
        namespace = ctx.namespace if group.startswith("network.") else pod_namespace
        for verb in verbs:
            attrs = {"group": group, "resource": resource, "verb": verb}
            if namespace:
                attrs["namespace"] = namespace
            body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attrs}}
            review = ctx.client.create(ACCESS_REVIEWS, body, deadline=deadline)
            if not (review.get("status") or {}).get("allowed"):
                where = f" in namespace {namespace!r}" if namespace else ""
                raise CniError(STATUS_NOT_AVAILABLE, f"missing RBAC permission: {verb} "
                               f"{resource}{'.' + group if group else ''}{where}",
                               "apply packaging/rbac and bind the ClusterRole to the plugin's "
                               "identity")
