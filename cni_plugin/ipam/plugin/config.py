"""The `vpc-attach-ipam` block of a network config (SPEC §4), validated into an `IpamConfig`.

The whole network config arrives on stdin; only `cniVersion`, `name`, `ipam`,
`allowPersistentIPs` and (per verb) `prevResult` or the GC attachment list are read from it.
Every problem is code 7 naming the key as `ipam.<key>`; see README.md next to this file for the
keys and the decisions behind them.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field, ValidationError

from cni_plugin.ipam.plugin.pool import DEFAULT_IPV6_BLOCK_PREFIX, IPAddress, IPNetwork, Pool
from netconf.config import _Strict, config_version, lookup_ci
from netconf.errors import INVALID_CONFIG, CniError, quoted
from netconf.host import IPAM_DATA_ROOT_ENV, IPAM_DATA_ROOT_KEY, NodeSettings
from netconf.result import Route

PLUGIN_TYPES = ("vpc-attach-ipam", "galactic-ipam")  # galactic-ipam: drop-in under its name
DEFAULT_DATA_DIR = "/var/lib/cni/vpc-attach-ipam"
DEFAULT_LOCK_TIMEOUT_SECONDS = 10.0
# The CNI spec's rule for network names; it also keeps `name` a safe path component.
NETWORK_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
IPV4_MAX_POOL_PREFIX = 30  # room for network, gateway, broadcast and one address
FAMILIES = {"ipv4": 4, "ipv6": 6}
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
Mode = Literal["addresses", "static_ip", "pools"]
Scope = Literal["node", "cluster"]
# `node`: today's on-node pools (galactic-ipam's behaviour); `cluster`: addresses unique across
# every node using the pool, through IPAMBlock claims (cluster.py). Not the default: switching a
# pool in use to `cluster` would not see the node-local records other nodes already hold.
DEFAULT_SCOPE: Scope = "node"
_MODE_KEYS: tuple[Mode, ...] = ("addresses", "static_ip", "pools")


class AddressEntry(_Strict):
    """One entry of `ipam.addresses`."""

    address: str
    gateway: str | None = None


class RouteEntry(_Strict):
    """One entry of `ipam.routes` (passed through to the result)."""

    dst: str
    gw: str | None = None


class IpamBlock(_Strict):
    """The `ipam` object as written; shape and types only (semantics in `parse_ipam`)."""

    type: str
    addresses: list[AddressEntry] | None = None
    static_ip: str | None = None
    ipv6_subnet: str | None = None
    ipv6_prefix_length: int | None = None
    ipv6_gateway: str | None = None
    ipv4_subnet: str | None = None
    ipv4_gateway: str | None = None
    address_families: list[str] | None = None
    routes: list[RouteEntry] | None = None
    data_dir: str | None = Field(default=None, alias="dataDir", min_length=1)
    lock_timeout_seconds: float = Field(default=DEFAULT_LOCK_TIMEOUT_SECONDS, gt=0, le=600,
                                        alias="lockTimeoutSeconds")
    scope: Scope | None = None


@dataclass(frozen=True)
class FixedAddress:
    """An address handed out as configured (`addresses`, `static_ip`): nothing is stored."""

    address: IPInterface
    gateway: IPAddress | None = None


@dataclass(frozen=True)
class IpamConfig:
    """A validated IPAM block plus what the verbs need from the rest of the network config."""

    cni_version: str
    network: str
    mode: Mode
    fixed: tuple[FixedAddress, ...] = ()
    pools: tuple[Pool, ...] = ()  # active pools, IPv6 first, after `address_families`
    routes: tuple[Route, ...] = ()
    data_dir: str = DEFAULT_DATA_DIR  # unset in the config: the node's ipamDataRoot
    data_dir_given: bool = False
    data_root: str = ""  # the node's ipamDataRoot, resolved (set by confine_data_dir)
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
    scope: Scope = DEFAULT_SCOPE
    # The network config's top-level `allowPersistentIPs`: its IPAMClaims' addresses are kept
    # by a node claiming a cluster block (block_claims.Keeping), not only by the node that held it.
    persistent_ips: bool = False

    @property
    def network_dir(self) -> str:
        """Where this network's pools keep their state: `dataDir/<network name>`."""
        return os.path.join(self.data_dir, self.network)


def _invalid(key: str, why: str) -> CniError:
    return CniError(INVALID_CONFIG, f"invalid config key 'ipam.{key}': {why}")


def parse_network(data: Mapping[str, Any]) -> IpamConfig:
    """Validate the network config's version, name and `ipam` block (codes 1, 7)."""
    version = config_version(data)
    name = lookup_ci(data, "name")
    if not isinstance(name, str) or not name:
        raise CniError(INVALID_CONFIG, "missing config key 'name'",
                       "vpc-attach-ipam keeps its state per network name")
    if not NETWORK_NAME.match(name):
        raise CniError(INVALID_CONFIG, f"invalid config key 'name': {name!r}",
                       "must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
    ipam = lookup_ci(data, "ipam")
    if ipam is None:
        raise CniError(INVALID_CONFIG, "missing config key 'ipam'")
    if not isinstance(ipam, Mapping):
        raise CniError(INVALID_CONFIG, "invalid config key 'ipam': must be an object")
    conf = parse_ipam(ipam, cni_version=version, network=name)
    return replace(conf, persistent_ips=lookup_ci(data, "allowPersistentIPs") is True)


def parse_ipam(ipam: Mapping[str, Any], cni_version: str, network: str) -> IpamConfig:
    """Validate one `ipam` object (code 7 naming the key)."""
    try:
        block = IpamBlock.model_validate(dict(ipam))
    except ValidationError as exc:
        raise _shape_error(exc) from None
    if block.type not in PLUGIN_TYPES:
        raise _invalid("type", f"{block.type!r} is not one of {', '.join(PLUGIN_TYPES)}")
    if block.data_dir is not None and not os.path.isabs(block.data_dir):
        raise _invalid("dataDir", f"{block.data_dir!r} is not an absolute path")
    mode = _mode(block)
    families = _families(block.address_families)
    routes = tuple(_route(i, entry) for i, entry in enumerate(block.routes or ()))
    base = IpamConfig(cni_version=cni_version, network=network, mode=mode, routes=routes,
                      data_dir=block.data_dir or DEFAULT_DATA_DIR,
                      data_dir_given=block.data_dir is not None,
                      lock_timeout=block.lock_timeout_seconds,
                      scope=block.scope or DEFAULT_SCOPE)
    if block.scope is not None and mode != "pools":
        raise _invalid("scope", "only applies to the pools 'ipam.ipv6_subnet'/'ipam.ipv4_subnet'")
    if mode == "addresses":
        return replace(base, fixed=_addresses(block.addresses or [], families))
    if mode == "static_ip":
        if families is not None and 6 not in families:
            raise _invalid("address_families", "excludes IPv6, the family of 'ipam.static_ip'")
        return replace(base, fixed=(FixedAddress(_static_ip(block.static_ip or "")),))
    return replace(base, pools=_pools(block, families))


class DataDirOutsideRoot(CniError):
    """A dataDir outside the node's ipamDataRoot (code 7)."""


def node_data_root(node: NodeSettings) -> str:
    """The node's ipamDataRoot, resolved (symlinks, `..`): every dataDir is in it (code 7
    unless it is an absolute path)."""
    return os.path.realpath(node.ipam_data_root)


def confine_data_dir(conf: IpamConfig, node: NodeSettings) -> IpamConfig:
    """conf with its dataDir resolved (symlinks and `..`), which must be the node's
    ipamDataRoot or below it (code 7 naming both otherwise): a network config is tenant input
    and never chooses where this plugin writes (SPEC §14). Every write uses the resolved path."""
    root = node.ipam_data_root
    real_root = node_data_root(node)
    if not conf.data_dir_given:
        return replace(conf, data_dir=real_root, data_root=real_root)
    # A directory not made yet resolves through its nearest existing ancestor.
    real = os.path.realpath(conf.data_dir)
    if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
        shown = "" if real == conf.data_dir else f" (it resolves to {real!r})"
        raise DataDirOutsideRoot(
            INVALID_CONFIG, f"invalid config key 'ipam.dataDir': {conf.data_dir!r} is not in "
            f"the node's ipamDataRoot {root!r}{shown}", f"the node sets that root: host file key "
            f"{IPAM_DATA_ROOT_KEY}, environment {IPAM_DATA_ROOT_ENV}")
    return replace(conf, data_dir=real, data_root=real_root)


def _shape_error(exc: ValidationError) -> CniError:
    err = exc.errors()[0]
    where = ".".join(["ipam", *(str(p) for p in err["loc"])])
    if err["type"] == "extra_forbidden":
        return CniError(INVALID_CONFIG, f"unknown config key {quoted(where)}")
    if err["type"] == "missing":
        return CniError(INVALID_CONFIG, f"missing config key {quoted(where)}")
    message = err["msg"].removeprefix("Value error, ")
    return CniError(INVALID_CONFIG, f"invalid config key {quoted(where)}: {message}")


def _blank(value: str | None) -> bool:
    # galactic-ipam treats an empty string like an absent key (Go's omitempty).
    return value is None or value == ""


def _mode(block: IpamBlock) -> Mode:
    present: dict[Mode, list[str]] = {
        "addresses": ["addresses"] if block.addresses else [],
        "static_ip": ["static_ip"] if not _blank(block.static_ip) else [],
        "pools": [k for k in ("ipv6_subnet", "ipv4_subnet") if not _blank(getattr(block, k))],
    }
    chosen = [mode for mode in _MODE_KEYS if present[mode]]
    if len(chosen) > 1:
        keys = [f"'ipam.{key}'" for mode in chosen for key in present[mode]]
        raise CniError(INVALID_CONFIG, f"conflicting config keys {' and '.join(keys)}",
                       "choose one mode: 'addresses', 'static_ip', or the pools "
                       "'ipv6_subnet'/'ipv4_subnet'")
    if not chosen:
        raise CniError(INVALID_CONFIG, "missing config key: the ipam block needs one of "
                       "'ipam.addresses', 'ipam.static_ip', 'ipam.ipv6_subnet', "
                       "'ipam.ipv4_subnet'")
    for key, needs in (("ipv6_prefix_length", "ipv6_subnet"), ("ipv6_gateway", "ipv6_subnet"),
                       ("ipv4_gateway", "ipv4_subnet")):
        value = getattr(block, key)
        if value is not None and value != "" and _blank(getattr(block, needs)):
            raise _invalid(key, f"only applies with 'ipam.{needs}'")
    return chosen[0]


def _families(listed: list[str] | None) -> frozenset[int] | None:
    if listed is None:
        return None
    if not listed:
        raise _invalid("address_families", "must list IPv4 and/or IPv6")
    families: set[int] = set()
    for entry in listed:
        family = FAMILIES.get(entry.lower())
        if family is None:
            raise _invalid("address_families", f"{entry!r} is neither IPv4 nor IPv6")
        families.add(family)
    return frozenset(families)


def _no_scope(key: str, value: str) -> str:
    if "%" in value:
        raise _invalid(key, f"{value!r} carries a zone index")
    return value


def _address(key: str, value: str) -> IPAddress:
    try:
        return ipaddress.ip_address(_no_scope(key, value))
    except ValueError:
        raise _invalid(key, f"{value!r} is not an IP address") from None


def _cidr(key: str, value: str) -> IPNetwork:
    if "/" not in value:
        raise _invalid(key, f"{value!r} is not a CIDR (address/prefix)")
    try:
        # Host bits are masked off, as Go's net.ParseCIDR (and galactic-ipam) does.
        return ipaddress.ip_network(_no_scope(key, value), strict=False)
    except ValueError:
        raise _invalid(key, f"{value!r} is not a CIDR (address/prefix)") from None


def _addresses(entries: list[AddressEntry], families: frozenset[int] | None,
               ) -> tuple[FixedAddress, ...]:
    fixed: list[FixedAddress] = []
    for i, entry in enumerate(entries):
        key = f"addresses.{i}.address"
        try:
            address = ipaddress.ip_interface(_no_scope(key, entry.address))
        except ValueError:
            raise _invalid(key, f"{entry.address!r} is not an IP address") from None
        if address.version == 4 and address.network.prefixlen != 32:
            raise _invalid(key, f"{entry.address!r}: an IPv4 address must be a /32")
        if any(other.address.version == address.version for other in fixed):
            raise _invalid("addresses", f"more than one IPv{address.version} address")
        if families is not None and address.version not in families:
            raise _invalid("address_families",
                           f"excludes IPv{address.version}, the family of {entry.address!r}")
        gateway = None
        if not _blank(entry.gateway):
            gw_key = f"addresses.{i}.gateway"
            gateway = _address(gw_key, entry.gateway or "")
            if gateway.version != address.version:
                raise _invalid(gw_key, f"{gateway} is not IPv{address.version}")
            if gateway == address.ip:
                raise _invalid(gw_key, f"{gateway} is the address itself")
        fixed.append(FixedAddress(address, gateway))
    return tuple(fixed)


def _static_ip(value: str) -> IPInterface:
    address = _address("static_ip", value)
    if address.version != 6:
        raise _invalid("static_ip", f"{value!r} is not an IPv6 address")
    return ipaddress.IPv6Interface(f"{address}/64")


def _pools(block: IpamBlock, families: frozenset[int] | None) -> tuple[Pool, ...]:
    configured: dict[int, Pool] = {}
    if not _blank(block.ipv6_subnet):
        configured[6] = _ipv6_pool(block)
    if not _blank(block.ipv4_subnet):
        configured[4] = _ipv4_pool(block)
    if families is None:
        families = frozenset(configured)
    missing = sorted(families - set(configured))
    if missing:
        raise _invalid("address_families", f"lists IPv{missing[0]} but "
                       f"'ipam.ipv{missing[0]}_subnet' is not set")
    return tuple(configured[f] for f in (6, 4) if f in families)


def _ipv6_pool(block: IpamBlock) -> Pool:
    subnet = _cidr("ipv6_subnet", block.ipv6_subnet or "")
    if subnet.version != 6:
        raise _invalid("ipv6_subnet", f"{block.ipv6_subnet!r} is not an IPv6 CIDR")
    length = block.ipv6_prefix_length
    if length is None:
        length = DEFAULT_IPV6_BLOCK_PREFIX
    if not subnet.prefixlen <= length <= 128:
        raise _invalid("ipv6_prefix_length", f"{length} must be between the subnet's prefix "
                       f"length {subnet.prefixlen} and 128")
    return _pool("ipv6", subnet, length, block.ipv6_gateway)


def _ipv4_pool(block: IpamBlock) -> Pool:
    subnet = _cidr("ipv4_subnet", block.ipv4_subnet or "")
    if subnet.version != 4:
        raise _invalid("ipv4_subnet", f"{block.ipv4_subnet!r} is not an IPv4 CIDR")
    if subnet.prefixlen > IPV4_MAX_POOL_PREFIX:
        raise _invalid("ipv4_subnet", f"{subnet} is too small: at most "
                       f"/{IPV4_MAX_POOL_PREFIX} (network, gateway and broadcast are reserved)")
    return _pool("ipv4", subnet, 32, block.ipv4_gateway)


def _pool(family: str, subnet: IPNetwork, length: int, gateway: str | None) -> Pool:
    key = f"{family}_gateway"
    if _blank(gateway):
        try:
            return Pool.with_default_gateway(subnet, length)
        except ValueError as exc:
            raise _invalid(f"{family}_subnet", str(exc)) from None
    address = _address(key, gateway or "")
    if address.version != subnet.version or address not in subnet:
        raise _invalid(key, f"{address} is not in {subnet}")
    if address == subnet.network_address or (
            subnet.version == 4 and address == subnet.broadcast_address):
        raise _invalid(key, f"{address} is the network or broadcast address of {subnet}")
    return Pool(subnet, length, address)


def _route(index: int, entry: RouteEntry) -> Route:
    dst = _cidr(f"routes.{index}.dst", entry.dst)
    if _blank(entry.gw):
        return Route(dst=str(dst))
    gw = _address(f"routes.{index}.gw", entry.gw or "")
    if gw.version != dst.version:
        raise _invalid(f"routes.{index}.gw", f"{gw} is not IPv{dst.version}")
    return Route(dst=str(dst), gw=str(gw))
