"""The verbs of `vpc-attach-ipam` as plain functions over a Request; no stdin/stdout here."""

from __future__ import annotations

import ipaddress
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Request
from cni_plugin.ipam.plugin import allocator
from cni_plugin.ipam.plugin.caller import Caller
from cni_plugin.ipam.plugin.config import (
    DataDirOutsideRoot,
    FixedAddress,
    IpamConfig,
    confine_data_dir,
    parse_network,
)
from cni_plugin.ipam.plugin.kubeblocks import (
    KubeBlockApi,
    block_api,
    lent_block_api,
    node_identity,
)
from cni_plugin.ipam.plugin.pool import Pool
from cni_plugin.ipam.plugin.requests import PoolRequest, match_pools
from cni_plugin.ipam.plugin.store import Attachment, ClaimOwner
from netconf.capabilities import (
    RequestedIps,
    invalid_request,
    parse_requested_address,
    requested_ips,
)
from netconf.config import lookup_ci
from netconf.errors import (
    CHECK_MISMATCH,
    DECODE_FAILURE,
    INCOMPATIBLE_VERSION,
    INVALID_CONFIG,
    STATUS_NOT_AVAILABLE,
    CniError,
)
from netconf.host import HostSettings, NodeSettings
from netconf.result import IPConfig, Result, Route
from netconf.runtime import RuntimeEnv, check_known_args
from netconf.versions import CHECK_MIN_VERSION, GC_STATUS_MIN_VERSION, at_least

log = logging.getLogger(__name__)
VALID_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")
DEFAULT_DST = {4: "0.0.0.0/0", 6: "::/0"}


@dataclass(frozen=True)
class IpamInvocation:
    """A validated request: runtime env, IPAM config and the raw network config."""

    env: RuntimeEnv
    conf: IpamConfig
    raw: dict[str, Any]
    node: NodeSettings  # the node's settings (its data root, name and kubeconfig)
    requested: Mapping[Pool, PoolRequest]  # the `ips` capability, by the pool it names
    caller: Caller | None = None  # vpc-attach's verb, when it runs this one in-process

    @classmethod
    def parse(cls, request: Request, caller: Caller | None = None) -> IpamInvocation:
        """Validate env, config and CNI_ARGS (codes 1, 2, 4, 6, 7). caller: the vpc-attach
        verb that runs this one in-process, whose node settings it reads (the executable reads
        its own)."""
        env = RuntimeEnv.from_environ(request.environ, request.cni_args)
        raw = request.config()
        conf = parse_network(raw)
        check_known_args(env.cni_args, _config_cni_args(raw))  # args.cni wins (SPEC §3)
        node = caller.node if caller is not None \
            else NodeSettings.read(request.environ, request.host_file())
        conf = confine_data_dir(conf, node)  # before anything touches the disk
        requested: Mapping[Pool, PoolRequest] = {}
        if env.command in ("ADD", "CHECK"):  # DEL and GC release whatever is held
            requested = match_pools(conf, requested_ips(raw, env.cni_args))
        return cls(env=env, conf=conf, raw=raw, node=node, requested=requested, caller=caller)

    @property
    def attachment(self) -> Attachment:
        """The (container ID, ifname) this invocation is about."""
        return Attachment(self.env.container_id, self.env.ifname)

    def blocks(self, required: bool) -> KubeBlockApi | None:
        """The cluster's IPAMBlocks for a pool of `scope: cluster` (None for node pools).
        required: code 7 without the node's name or kubeconfig (ADD); otherwise None then
        (DEL and GC still release what is on disk)."""
        if self.conf.mode != "pools" or self.conf.scope != "cluster":
            return None
        try:
            if self.caller is not None:  # the verb's session and deadline
                return lent_block_api(self.caller, self.env.container_id, self.env.ifname)
            return block_api(self.node, self.env.container_id, self.env.ifname)
        except CniError as exc:
            if required:
                raise
            log.warning("cluster pools of network %s keep their blocks: %s", self.conf.network,
                        exc.msg)
            return None

    def host(self) -> HostSettings:
        """The host settings of this verb (the caller's; the executable's node's own)."""
        return self.caller.host if self.caller is not None else self.node.host({})

    def require_version(self, minimum: str, verb: str) -> None:
        """Code 1 when the config's version predates `verb`."""
        if not at_least(self.conf.cni_version, minimum):
            raise CniError(INCOMPATIBLE_VERSION, f"config version does not allow {verb}",
                           f"cniVersion {self.conf.cni_version} < {minimum}")


def add(request: Request, caller: Caller | None = None) -> Result:
    """Addresses for the attachment: as configured, or one block per pool (idempotent)."""
    return add_owned(request, caller=caller).result


@dataclass(frozen=True)
class OwnedAdd:
    """An ADD done in-process: its result, and what `undo` needs to give back only what it
    did."""

    result: Result
    conf: IpamConfig
    attachment: Attachment
    allocations: list[allocator.Allocation]
    node: NodeSettings = field(default_factory=lambda: NodeSettings({}))  # the node's settings
    caller: Caller | None = None

    def undo(self, deadline: Deadline | None = None) -> None:
        """The created-only undo (a failed ADD's rollback, within its deadline): a fresh
        record is freed, an adopted claim's record put back as it was, a lend this ADD made
        deleted (on the caller's session); best effort."""
        blocks = None
        if any(a.lend is not None for a in self.allocations):
            container_id, ifname = self.attachment.container_id, self.attachment.ifname
            try:
                blocks = lent_block_api(self.caller, container_id, ifname, deadline) \
                    if self.caller is not None else block_api(self.node, container_id, ifname)
            except CniError as exc:
                log.warning("cannot undo this ADD's lends (GC deletes them): %s", exc.msg)
        try:
            allocator.undo(self.conf, self.attachment, self.allocations, blocks)
        finally:
            if blocks is not None:
                blocks.close()


def add_owned(request: Request, claim: ClaimOwner | None = None,
              claim_ips: tuple[str, ...] = (), *, caller: Caller | None = None) -> OwnedAdd:
    """ADD, its records owned by claim when given (vpc-attach in-process only: never from a
    network config). claim_ips: the claim's `status.ips`, requested exactly (code 7 outside
    the pools, or when the `ips` capability asks for others)."""
    inv = IpamInvocation.parse(request, caller)
    conf = inv.conf
    if conf.mode != "pools":
        result = Result(ips=[_fixed_ip(fixed) for fixed in conf.fixed], routes=list(conf.routes))
        return OwnedAdd(result, conf, inv.attachment, [])
    requested = inv.requested
    if claim is not None and claim_ips:
        requested = claim_requests(conf, claim, claim_ips, inv.requested)
    blocks = inv.blocks(required=True)  # code 7 before any change without a node identity
    try:
        allocations = allocator.allocate_all(conf, inv.attachment, blocks, requested, claim)
    finally:
        if blocks is not None:
            blocks.close()
    return OwnedAdd(_pool_result(conf, allocations), conf, inv.attachment, allocations,
                    inv.node, caller)


def claim_requests(conf: IpamConfig, claim: ClaimOwner, claim_ips: tuple[str, ...],
                   asked: Mapping[Pool, PoolRequest]) -> Mapping[Pool, PoolRequest]:
    """The claim's addresses as requests by pool: code 7 naming the claim when one is not an
    allocation of the pools, naming both when the `ips` capability asks for others."""
    source = f"IPAMClaim {claim} status.ips"
    addresses = tuple(parse_requested_address(source, ip) for ip in claim_ips)
    matched = match_pools(conf, RequestedIps(addresses, source))
    uncovered = [pool for pool in conf.pools if pool not in matched]
    if uncovered:  # its status would never take a second family: every ADD would be 11
        raise invalid_request(source, f"it holds {', '.join(claim_ips)}, no address of pool "
                              f"{uncovered[0].subnet} of network {conf.network!r}",
                              "the claim's addresses are kept as they are: a pool added "
                              "since (or an address_families change) does not fit it")
    if asked and {r.requested.ip for r in asked.values()} != {a.ip for a in addresses}:
        first = next(iter(asked.values()))
        raise CniError(INVALID_CONFIG, f"invalid config key '{first.source}': it asks for "
                       f"{', '.join(r.requested.text for r in asked.values())}, but {source} "
                       f"holds {', '.join(claim_ips)}",
                       "a Pod of a claim gets the claim's addresses: request those or none")
    return matched


def _pool_result(conf: IpamConfig, allocations: list[allocator.Allocation]) -> Result:
    ips = [IPConfig(address=a.address, gateway=str(a.pool.gateway)) for a in allocations]
    configured = {ipaddress.ip_network(route.dst) for route in conf.routes}
    defaults = [Route(dst=DEFAULT_DST[a.pool.family]) for a in allocations
                if ipaddress.ip_network(DEFAULT_DST[a.pool.family]) not in configured]
    return Result(ips=ips, routes=[*defaults, *conf.routes])


def delete(request: Request, caller: Caller | None = None) -> None:
    """Release this (container, ifname)'s records; succeeds when there are none."""
    try:
        inv = IpamInvocation.parse(request, caller)
    except DataDirOutsideRoot as exc:
        # Nothing was ever allocated there (ADD refuses it too): DEL after a failed ADD
        # succeeds (SPEC §3), touching nothing.
        log.warning("DEL with a dataDir outside ipamDataRoot changes nothing: %s", exc.msg)
        return
    blocks = inv.blocks(required=False)
    try:
        allocator.release(inv.conf, inv.attachment, blocks)
    finally:
        if blocks is not None:
            blocks.close()


def check(request: Request, caller: Caller | None = None) -> None:
    """Code 103 unless the attachment holds a block in every pool (and prevResult lists it)."""
    inv = IpamInvocation.parse(request, caller)
    inv.require_version(CHECK_MIN_VERSION, "CHECK")
    prev_data = lookup_ci(inv.raw, "prevResult")
    prev = Result.from_wire(prev_data) if prev_data is not None else None
    listed = {ip.ip.ip for ip in prev.ips} if prev is not None else None
    diffs: list[str] = []
    expected: list[str] = [str(fixed.address) for fixed in inv.conf.fixed]
    for pool in inv.conf.pools:
        held = allocator.held(inv.conf, pool, inv.attachment)
        requested = inv.requested.get(pool)
        if held is None:
            diffs.append(f"no allocation for container {inv.env.container_id!r} ifname "
                         f"{inv.env.ifname!r} in pool {pool.subnet}")
        else:
            expected.append(held.address)
            if requested is not None and requested.index != held.index:
                diffs.append(f"{held.address} is held in pool {pool.subnet}, "
                             f"{requested.requested.text} was requested")
    if listed is not None:
        diffs.extend(f"address {address} is missing from prevResult" for address in expected
                     if ipaddress.ip_interface(address).ip not in listed)
    if diffs:
        raise CniError(CHECK_MISMATCH, f"CHECK found {len(diffs)} difference(s): {diffs[0]}",
                       "; ".join(diffs))


def status(request: Request, caller: Caller | None = None) -> None:
    """Code 50 unless allocation state can be written (pools only: other modes store nothing)."""
    inv = IpamInvocation.parse(request, caller)
    inv.require_version(GC_STATUS_MIN_VERSION, "STATUS")
    if inv.conf.mode != "pools":
        return
    if inv.conf.scope == "cluster":
        try:
            node_identity(inv.host())
        except CniError as exc:
            raise CniError(STATUS_NOT_AVAILABLE, exc.msg, exc.details) from None
    directory = inv.conf.network_dir
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tmp-status-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CniError(STATUS_NOT_AVAILABLE, f"dataDir {inv.conf.data_dir!r} is not writable",
                       f"{directory}: {exc.strerror or exc}") from None


def gc(request: Request, caller: Caller | None = None) -> None:
    """Release the records of every attachment the runtime did not list as valid."""
    inv = IpamInvocation.parse(request, caller)
    inv.require_version(GC_STATUS_MIN_VERSION, "GC")
    blocks = inv.blocks(required=False)
    try:
        allocator.collect_garbage(inv.conf, valid_attachments(inv.raw), blocks)
    finally:
        if blocks is not None:
            blocks.close()


def valid_attachments(raw: Mapping[str, Any]) -> set[Attachment]:
    """Attachments the runtime still uses, from `cni.dev/valid-attachments` (code 6 if bad)."""
    listed: Any = next((raw[key] for key in VALID_KEYS if key in raw), [])
    if not isinstance(listed, list):
        raise CniError(DECODE_FAILURE, f"{VALID_KEYS[0]} must be a list")
    valid: set[Attachment] = set()
    for item in listed:
        if not isinstance(item, dict) or not isinstance(item.get("containerID"), str) \
                or not isinstance(item.get("ifname", ""), str):
            raise CniError(DECODE_FAILURE, f"invalid {VALID_KEYS[0]} entry {item!r}")
        valid.add(Attachment(item["containerID"], item.get("ifname", "")))
    return valid


def _fixed_ip(fixed: FixedAddress) -> IPConfig:
    gateway = str(fixed.gateway) if fixed.gateway is not None else None
    return IPConfig(address=str(fixed.address), gateway=gateway)


def _config_cni_args(raw: Mapping[str, Any]) -> dict[str, str]:
    args = lookup_ci(raw, "args")
    cni = args.get("cni") if isinstance(args, dict) else None
    return {str(k): str(v) for k, v in cni.items()} if isinstance(cni, dict) else {}
