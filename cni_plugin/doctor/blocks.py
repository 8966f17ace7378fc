"""`vpc-attach doctor`: the cluster blocks of vpc-attach-ipam pools (`scope: cluster`) this node
holds, how full each is, and whether the API server agrees that the node holds them."""

from __future__ import annotations

import ipaddress
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.doctor.node import API_SECONDS, FAIL, OK, SKIP, WARN, Finding, Node
from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS, NODE_FIELD
from cni_plugin.ipam.plugin.store import BlockRecord, PoolState, pool_directories
from cni_plugin.kube.client import ApiError
from netconf.errors import CniError


def ipam_blocks(node: Node) -> list[Finding]:
    """One finding per cluster pool: its blocks and their use; a block the node records but
    the API does not give it fails (another node could claim its addresses)."""
    held: dict[str, tuple[str, BlockRecord]] = {}
    findings: list[Finding] = []
    for data_dir in dict.fromkeys(node.ipam_data_dirs):
        for network, pool_dir, path in pool_directories(data_dir):
            state = PoolState(path, API_SECONDS)
            try:
                blocks, records = state.blocks(), state.records()
                blocks = [b for b in blocks if b.state != "borrowed"]  # ipam.lends (claims.py)
            except CniError as exc:
                findings.append(Finding("ipam.blocks", FAIL, f"cannot read {path}: {exc.msg}"))
                continue
            if not blocks:
                continue
            allocation = int(pool_dir.rsplit("_", 1)[-1])
            parts = [_use(block, records, allocation) for block in blocks]
            for block in blocks:
                held[block.name] = (f"{network}/{pool_dir}", block)
            findings.append(Finding("ipam.blocks", OK, f"pool {network}/{pool_dir}: "
                                    f"{len(blocks)} block(s): {'; '.join(parts)}"))
    if not held:
        return findings
    findings.extend(_agreement(node, held))
    return findings


def _use(block: BlockRecord, records: list[Any], allocation: int) -> str:
    try:
        cidr = ipaddress.ip_network(block.cidr)
    except ValueError:
        return f"{block.name} (unreadable record)"
    size = 1 << (allocation - cidr.prefixlen)
    used = sum(1 for r in records if ipaddress.ip_address(r.name) in cidr)
    pending = " claiming" if block.state != "held" else ""
    return f"{cidr} {used}/{size} used ({block.name}{pending})"


def _agreement(node: Node, held: dict[str, tuple[str, BlockRecord]]) -> list[Finding]:
    client, name = node.client, node.settings.node_name
    if client is None or not name:
        return [Finding("ipam.blocks.api", SKIP, "the API server is not reachable")]
    try:
        listed = client.list(IPAM_BLOCKS, deadline=Deadline(API_SECONDS),
                             fields=f"{NODE_FIELD}={name}")
    except (CniError, ApiError) as exc:
        return [Finding("ipam.blocks.api", FAIL, f"cannot list IPAMBlocks: {exc}",
                        "kubectl apply -f packaging/crds/vpc-attach.datum.net_ipamblocks.yaml "
                        "and packaging/rbac/")]
    in_api = {str(o["metadata"]["name"]) for o in listed}
    missing = sorted(n for n, (_, block) in held.items()
                     if block.state == "held" and n not in in_api)
    extra = sorted(in_api - set(held))
    findings = []
    if missing:
        findings.append(Finding(
            "ipam.blocks.api", FAIL, f"{len(missing)} block(s) this node allocates from have no "
            f"IPAMBlock naming it: {', '.join(missing[:10])}",
            "was this node's Node object deleted (its blocks go with it)? Drain the node, "
            "remove its vpc-attach-ipam dataDir pools of scope cluster, then restart"))
    if extra:
        findings.append(Finding("ipam.blocks.api", WARN, f"{len(extra)} IPAMBlock(s) name this "
                                f"node without a local record: {', '.join(extra[:10])}",
                                "a GC of the network deletes them (nothing was allocated "
                                "from them)"))
    if not findings:
        findings.append(Finding("ipam.blocks.api", OK, f"the API server agrees: {len(held)} "
                                "block(s) held by this node"))
    return findings
