"""This node's BGPRouter, and listing a router's objects by a selectable field."""

from __future__ import annotations

from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, Resource
from cni_plugin.publish.context import PublishContext, Router
from cni_plugin.publish.resources import ROUTERS
from netconf.errors import INVALID_CONFIG, CniError


def list_selected(ctx: PublishContext, resource: Resource, field: str, value: str,
                  deadline: Deadline) -> list[dict[str, Any]]:
    """Objects whose `field` equals value, narrowed by the API server when the CRD allows."""
    try:
        return ctx.client.list(resource, namespace=ctx.namespace, deadline=deadline,
                               fields=f"{field}={value}")
    except ApiError as exc:
        if exc.status != 400:  # 400: this CRD declares no selectable field (upstream's)
            raise
    keys = field.split(".")
    items = []
    for item in ctx.client.list(resource, namespace=ctx.namespace, deadline=deadline):
        node: Any = item
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node == value:
            items.append(item)
    return items


def find_router(ctx: PublishContext, deadline: Deadline) -> Router:
    """The one BGPRouter whose targetRef names this node (code 7 otherwise)."""
    cached = ctx.session.routers(ctx.namespace, ctx.node)
    candidates = cached if cached is not None else \
        list_selected(ctx, ROUTERS, "spec.targetRef.name", ctx.node, deadline)
    found = [r for r in candidates
             if (r.get("spec", {}).get("targetRef") or {}).get("kind", "Node") == "Node"]
    if len(found) != 1:
        names = ", ".join(sorted(r["metadata"]["name"] for r in found)) or "none"
        raise CniError(INVALID_CONFIG, f"expected exactly one BGPRouter targeting node "
                       f"{ctx.node!r} in namespace {ctx.namespace!r}, found {len(found)}",
                       f"found: {names}")
    return Router.from_object(found[0])
