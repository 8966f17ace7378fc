"""What every publishing step needs: the invocation, an API client, the node and its router."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import (
    CREATED_BY_ANNOTATION,
    ApiError,
    KubeClient,
    Resource,
    update_with_retry,
)
from cni_plugin.kube.kinds import NODES
from cni_plugin.kube.session import ClusterSession

log = logging.getLogger(__name__)


@dataclass
class PublishContext:
    """One invocation's view of the cluster through the verb's session (client and caches),
    which the verb holds and ends."""

    inv: Invocation
    session: ClusterSession
    node: str
    _node_owner: list[dict[str, Any]] | None = field(default=None, init=False, repr=False)

    @classmethod
    def open(cls, inv: Invocation, session: ClusterSession, node: str) -> PublishContext:
        """A context on session, its client borrowed now (settings were checked before)."""
        session.client()
        return cls(inv, session, node)

    @property
    def client(self) -> KubeClient:
        """The session's API client."""
        return self.session.client()

    @property
    def namespace(self) -> str:
        """Namespace of the BGP resources."""
        return self.inv.namespace

    @cached_property
    def instance_name(self) -> str:
        """The VPC's BGPVRFInstance on this node."""
        return naming.vrf_instance_name(self.inv.conf.vpc, self.node)

    @cached_property
    def advertisement_name(self) -> str:
        """This node's BGPAdvertisement of the attachment."""
        return naming.advertisement_name(self.inv.conf.vpc, self.inv.conf.vpcattachment,
                                         self.node)

    @cached_property
    def shared_advertisement_name(self) -> str:
        """The attachment's advertisement as earlier versions shared it between nodes."""
        return naming.shared_advertisement_name(self.inv.conf.vpc, self.inv.conf.vpcattachment)

    def node_owner(self, deadline: Deadline) -> list[dict[str, Any]]:
        """ownerReferences naming this node's Node, so the API server's garbage collector
        removes a node-owned object (its BGPVRFInstances and advertisements) with the Node.
        Read once per invocation and only when such an object is created, unless learnt from
        the VPC's BGPVRFInstance (an ADD that finds its objects asks nothing more). [] when
        the Node does not exist or may not be read: the object is written without one, and
        the operator log says so."""
        if self._node_owner is None:
            self._node_owner = self._read_node_owner(deadline)
        return self._node_owner

    def learn_node_owner(self, owned: dict[str, Any]) -> None:
        """Take this node's Node ownerReference from an object of this node that carries one
        (its BGPVRFInstance of the VPC, read anyway), so creating the advertisement next does
        not read the Node. Only an entry naming this node's Node counts."""
        if self._node_owner:
            return
        for ref in (owned.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("apiVersion") == "v1" and ref.get("kind") == "Node" and \
                    ref.get("name") == self.node and ref.get("uid"):
                self._node_owner = [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                     "uid": str(ref["uid"])}]
                return

    def _read_node_owner(self, deadline: Deadline) -> list[dict[str, Any]]:
        try:
            node = self.client.get(NODES, self.node, deadline=deadline)
        except ApiError as exc:
            if exc.status != 403:
                raise
            node = None
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if not uid:
            log.warning("Node %s not found (or not readable): its BGP objects carry no "
                        "ownerReference, so deleting the Node will not remove them (a GC on "
                        "this node adds it once the Node exists)", self.node)
            return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": str(uid)}]

    def give_to_node(self, resource: Resource, name: str, deadline: Deadline) -> None:
        """GC: add the Node's ownerReference to this node's object of `resource` that
        vpc-attach created without one (an earlier version, or the Node not registered yet).
        Objects others made, or already owned, are left alone."""
        def own(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            if created_by(obj) is None or meta.get("ownerReferences"):
                return False
            meta["ownerReferences"] = self.node_owner(deadline)
            return bool(meta["ownerReferences"])

        if update_with_retry(self.client, resource, name, namespace=self.namespace,
                             deadline=deadline, mutate=own) is not None and \
                self._node_owner:
            log.info("%s %s is owned by Node %s", resource.kind, name, self.node)

    @cached_property
    def cid(self) -> str:
        """The container ID as it appears in the advertisement's annotation keys."""
        return naming.annotation_cid(self.inv.env.container_id)


@dataclass(frozen=True)
class Router:
    """The BGPRouter targeting this node."""

    name: str
    local_asn: int
    srv6_locator: str | None
    node_id: int | None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Router:
        """Read the fields we use."""
        spec = obj.get("spec") or {}
        return cls(obj["metadata"]["name"], int(spec["localASN"]), spec.get("srv6Locator"),
                   spec.get("nodeID"))


def create(ctx: PublishContext, resource: Resource, body: dict[str, Any], rollback: Rollback,
           undo: Callable[[dict[str, Any], Deadline], object],
           deadline: Deadline) -> dict[str, Any] | None:
    """Create body, marked with this invocation's created-by; the object, or None when someone
    else created it first (409).

    The undo is recorded before the request, so a create whose answer is lost (however it was
    lost) is still undone; it runs only on an object that carries our mark."""
    meta = body["metadata"]
    marked = {**body, "metadata": {**meta, "annotations": {
        **(meta.get("annotations") or {}), CREATED_BY_ANNOTATION: ctx.inv.created_by}}}
    namespace, name = meta["namespace"], meta["name"]
    kind = body.get("kind", resource.kind)

    def undo_ours(d: Deadline) -> None:
        found = ctx.client.get(resource, name, namespace=namespace, deadline=d)
        if found is not None and created_by(found) == ctx.inv.created_by:
            undo(found, d)

    rollback.created(f"{kind} {namespace}/{name}", undo_ours)
    try:
        created: dict[str, Any] = ctx.client.create(resource, marked, namespace=namespace,
                                                    deadline=deadline)
        return created
    except ApiError as exc:
        if exc.status != 409:
            raise
    # Ours after a lost answer, or someone else's.
    found = ctx.client.get(resource, name, namespace=namespace, deadline=deadline)
    return found if found is not None and created_by(found) == ctx.inv.created_by else None


def created_by(obj: dict[str, Any]) -> str | None:
    """The created-by mark of an object."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(CREATED_BY_ANNOTATION)
    return value if isinstance(value, str) else None
