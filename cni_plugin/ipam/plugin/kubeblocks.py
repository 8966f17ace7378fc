"""IPAMBlock objects through the API server, and how a verb reaches it (`scope: cluster`).

The node's name and kubeconfig are host settings (netconf/host.py: the runtime's environment,
the host file), never the network config: a tenant's config does not choose who the node is.
The requests go through the verb's session (`kube/session.py`: vpc-attach's, when it runs this
plugin in-process; the executable's own otherwise), whose client is made on first use, so an
ADD served from the node's blocks connects to nothing; and they end by the verb's deadline.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, TypeVar

from cni_plugin.core.deadline import Deadline
from cni_plugin.ipam.plugin.block_claims import POOL_LABEL
from cni_plugin.ipam.plugin.blocks import ClusterBlock, pool_hash
from cni_plugin.ipam.plugin.caller import Caller
from cni_plugin.ipam.plugin.pool import Pool
from cni_plugin.kube.client import (
    CREATED_BY_ANNOTATION,
    ApiError,
    KubeClient,
    Resource,
    api_failure,
)
from cni_plugin.kube.kinds import IPAMCLAIMS, NODES
from cni_plugin.kube.session import ColdCluster, VerbCluster
from netconf.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError
from netconf.host import HostSettings, NodeSettings

GROUP = "vpc-attach.datum.net"
VERSION = "v1alpha1"
IPAM_BLOCKS = Resource(GROUP, VERSION, "ipamblocks", "IPAMBlock", namespaced=False)
T = TypeVar("T")
NODE_FIELD = "spec.node"  # a selectable field of the CRD: node names may exceed label limits


class KubeBlockApi:
    """`claims.BlockApi` on the verb's session, inside the verb's deadline."""

    def __init__(self, node: str, cluster: VerbCluster, deadline: Deadline, created_by: str,
                 *, own_session: bool = False) -> None:
        self.node = node
        self.cluster = cluster
        self.deadline = deadline
        self.created_by = created_by
        self._own_session = own_session  # the executable's: ended with this

    @property
    def client(self) -> KubeClient:
        """The session's API client (connected on first use)."""
        return self.cluster.session().client()

    def close(self) -> None:
        """End the session if it is this one's own (the verb ends the one it lent)."""
        if self._own_session:
            self.cluster.close()

    def node_uid(self) -> str:
        """The UID of this node's Node (code 11 while it is not registered)."""
        node = self._call("claim an IPAM block", lambda: self.client.get(NODES, self.node,
                                                          deadline=self.deadline))
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if not uid:
            raise CniError(TRY_AGAIN_LATER, f"cannot claim an IPAM block: Node {self.node!r} "
                           "does not exist (yet)", "an IPAMBlock is owned by its Node, so it "
                           "goes with it; the node's name is host setting nodeName")
        return str(uid)

    def pool_blocks(self, network: str, pool: Pool) -> list[dict[str, Any]]:
        """Every IPAMBlock of the pool (by its hash label)."""
        return self._call("claim an IPAM block", lambda: self.client.list(
            IPAM_BLOCKS, deadline=self.deadline,
            labels=f"{POOL_LABEL}={pool_hash(network, pool)}"))

    def node_blocks(self) -> list[dict[str, Any]]:
        """Every IPAMBlock naming this node."""
        return self._call("collect IPAM blocks", lambda: self.client.list(
            IPAM_BLOCKS, deadline=self.deadline, fields=f"{NODE_FIELD}={self.node}"))

    def create(self, block: ClusterBlock, node_uid: str) -> dict[str, Any] | None:
        """Create the block's object for this node; None on 409 (the name exists)."""
        return self._create(block_object(block, self.node, node_uid, self.created_by),
                            f"claim IPAM block {block.cidr}")

    def create_lend(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a lend (lending.lend_object); None on 409 (the address is lent already)."""
        return self._create(body, f"lend {body['spec']['cidr']}")

    def network_claims(self, network: str) -> list[dict[str, Any]]:
        """Every IPAMClaim of network, in every namespace (none while the IPAMClaim CRD is not
        installed: no claim can hold an address then)."""
        try:
            claims = self.client.list(IPAMCLAIMS, deadline=self.deadline)
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise api_failure(exc, "list the IPAMClaims whose addresses a block keeps") \
                from None
        return [c for c in claims if (c.get("spec") or {}).get("network") == network]

    def _create(self, body: dict[str, Any], doing: str) -> dict[str, Any] | None:
        try:
            created: dict[str, Any] = self.client.create(IPAM_BLOCKS, body,
                                                         deadline=self.deadline)
            return created
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise api_failure(exc, doing) from None

    def get(self, name: str) -> dict[str, Any] | None:
        """The object, or None."""
        return self._call("read an IPAM block", lambda: self.client.get(IPAM_BLOCKS, name,
                                                          deadline=self.deadline))

    def delete(self, name: str, uid: str) -> bool:
        """Delete it if it still has uid (code 11 when the API cannot be reached)."""
        return self._call("release an IPAM block", lambda: self.client.delete(
            IPAM_BLOCKS, name, deadline=self.deadline, uid=uid or None))

    def _call(self, doing: str, request: Callable[[], T]) -> T:
        try:
            return request()
        except ApiError as exc:
            raise api_failure(exc, doing) from None


def block_object(block: ClusterBlock, node: str, node_uid: str, created_by: str,
                 ) -> dict[str, Any]:
    """The IPAMBlock for block held by node, owned by its Node (the API server's garbage
    collector deletes it with the Node)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "IPAMBlock",
        "metadata": {
            "name": block.name,
            "labels": {POOL_LABEL: pool_hash(block.network, block.pool)},
            "annotations": {CREATED_BY_ANNOTATION: created_by},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                 "uid": node_uid}],
        },
        "spec": {"network": block.network, "subnet": str(block.pool.subnet),
                 "allocationPrefixLength": block.pool.block_prefix, "cidr": str(block.cidr),
                 "node": node},
    }


def node_identity(settings: HostSettings) -> HostSettings:
    """The host settings a cluster pool needs: node name and kubeconfig (code 7 naming the
    missing one)."""
    for value, key, env in ((settings.node_name, "nodeName", "VPC_ATTACH_NODE_NAME"),
                            (settings.kubeconfig, "kubeconfig", "VPC_ATTACH_KUBECONFIG")):
        if not value:
            raise CniError(INVALID_CONFIG, "invalid config key 'ipam.scope': 'cluster' needs "
                           f"the node's host setting {key}", f"set it in the host file or "
                           f"{env}; a node without one can only use 'scope': 'node'")
    return settings


def block_api(node: NodeSettings, container_id: str, ifname: str) -> KubeBlockApi:
    """The API of this node's blocks for one verb of the executable: a session and a deadline
    of its own (code 7 without node name or kubeconfig)."""
    settings = node_identity(node.host({}))
    return KubeBlockApi(str(settings.node_name),
                        VerbCluster(ColdCluster(), settings.kubeconfig, container_id),
                        Deadline(settings.timeout_seconds), _created_by(container_id, ifname),
                        own_session=True)


def lent_block_api(caller: Caller, container_id: str, ifname: str,
                   deadline: Deadline | None = None) -> KubeBlockApi:
    """The API of this node's blocks on the session and deadline (the caller's, unless given:
    a rollback's) of the verb running this plugin in-process (code 7 without node name or
    kubeconfig)."""
    settings = node_identity(caller.host)
    return KubeBlockApi(str(settings.node_name), caller.cluster, deadline or caller.deadline,
                        _created_by(container_id, ifname))


def _created_by(container_id: str, ifname: str) -> str:
    return f"{container_id}/{ifname}/{secrets.token_hex(4)}"
