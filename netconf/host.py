"""Host settings: where a node's identity and credentials come from (SPEC §4, §14).

They come from the VPC_ATTACH_* environment (the runtime's), then the host file written by the
installer, then defaults. A network config is tenant input: one that sets a host setting is
code 7, unless the node allows it (`stanzaHostSettings: allow`), when the stanza comes first.
Resolving them reads at most one local file and never the network. A verb reads it once:
`NodeSettings` holds the request's VPC_ATTACH_* environment and the host file, and resolves the
settings of the node alone (galactic's, the datapath's, `ipamDataRoot`) from them when a step
first reads them.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from netconf.base62 import ATTACHMENT_LIMIT, VPC_LIMIT, decode_base62
from netconf.errors import INVALID_CONFIG, CniError
from netconf.formats import check_format

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

NODE_ENV_PREFIX = "VPC_ATTACH_"  # every setting of the node in the environment
HOST_CONFIG_ENV = "VPC_ATTACH_HOST_CONFIG"
DEFAULT_HOST_CONFIG = "/etc/vpc-attach/host.json"
DEFAULT_NAMESPACE = "galactic-system"
DEFAULT_AGENT_SOCKET = "/run/vpc-attach/agent.sock"
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_LOCK_DIR = "/run/vpc-attach/locks"
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_LOG_BACKUPS = 3
MAX_LOG_BACKUPS = 100
TENANCY_MODES = ("enforce", "audit", "off")  # SPEC §14; unset: enforce with a kubeconfig
NETWORK_POLICY_MODES = ("enforce", "off")  # SPEC §17: NetworkPolicy on conflist attachments
STANZA_HOST_SETTINGS_KEY = "stanzaHostSettings"
STANZA_HOST_SETTINGS_ENV = "VPC_ATTACH_STANZA_HOST_SETTINGS"
IPAM_DATA_ROOT_KEY = "ipamDataRoot"
IPAM_DATA_ROOT_ENV = "VPC_ATTACH_IPAM_DATA_ROOT"
DEFAULT_IPAM_DATA_ROOT = "/var/lib/cni/vpc-attach-ipam"
DEFAULT_GALACTIC_PIN_DIR = "/sys/fs/bpf/galactic"
# The smallest underlay that still carries an encapsulated IPv6 packet of the minimum MTU.
MIN_UNDERLAY_MTU = 1280 + 40

# setting -> (host-file / stanza key, environment variable)
_SOURCES: dict[str, tuple[str, str | None]] = {
    "node_name": ("nodeName", "VPC_ATTACH_NODE_NAME"),
    "kubeconfig": ("kubeconfig", "VPC_ATTACH_KUBECONFIG"),
    "namespace": ("namespace", "VPC_ATTACH_NAMESPACE"),
    "log_file": ("logFile", "VPC_ATTACH_LOG_FILE"),
    "log_level": ("logLevel", "VPC_ATTACH_LOG_LEVEL"),
    "agent_socket": ("agentSocket", "VPC_ATTACH_AGENT_SOCKET"),
    "timeout_seconds": ("timeoutSeconds", "VPC_ATTACH_TIMEOUT_SECONDS"),
    "lock_dir": ("lockDir", "VPC_ATTACH_LOCK_DIR"),
    "log_max_bytes": ("logMaxBytes", "VPC_ATTACH_LOG_MAX_BYTES"),
    "log_backups": ("logBackups", "VPC_ATTACH_LOG_BACKUPS"),
    "tenancy": ("tenancy", "VPC_ATTACH_TENANCY"),
}
# Settings of the node alone: never taken from a network config, whatever it allows (with every
# field of a node settings group, below: `node_only_keys`). Host file key -> environment variable.
_NODE_ONLY: dict[str, str | None] = {STANZA_HOST_SETTINGS_KEY: STANZA_HOST_SETTINGS_ENV,
                                     IPAM_DATA_ROOT_KEY: IPAM_DATA_ROOT_ENV,
                                     "tenancy": "VPC_ATTACH_TENANCY"}


@dataclass(frozen=True)
class HostSettings:
    """Node-level settings after precedence is applied."""

    node_name: str | None = None
    kubeconfig: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    log_file: str | None = None
    log_level: str = "info"
    agent_socket: str = DEFAULT_AGENT_SOCKET
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    lock_dir: str = DEFAULT_LOCK_DIR
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES  # 0: never rotated
    log_backups: int = DEFAULT_LOG_BACKUPS
    tenancy: str | None = None  # see `tenancy_mode`

    @property
    def tenancy_mode(self) -> str:
        """How VPCBindings are applied: as set, else `enforce` with a kubeconfig; a node with
        no kubeconfig has no bindings to read and is always `off`."""
        if not self.kubeconfig:
            return "off"
        return self.tenancy or "enforce"


def read_host_file(environ: Mapping[str, str]) -> dict[str, Any]:
    """The installer's host file; missing is empty, unreadable or not JSON is code 7, written
    by a newer release (formatVersion) code 108."""
    path = environ.get(HOST_CONFIG_ENV) or DEFAULT_HOST_CONFIG
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CniError(INVALID_CONFIG, f"cannot read host settings file {path!r}",
                       str(exc)) from None
    if not isinstance(data, dict):
        raise CniError(INVALID_CONFIG, f"host settings file {path!r} is not a JSON object")
    check_format(data, path, "the host settings file")
    return data


def resolve_host_settings(config: Mapping[str, Any], environ: Mapping[str, str]) -> HostSettings:
    """The node's settings for an invocation of network config `config` (code 7 when the
    config sets a host setting the node does not let it set)."""
    return resolve_with_sources(config, environ, read_host_file(environ))[0]


def resolve_with_sources(config: Mapping[str, Any], environ: Mapping[str, str],
                         host_file: Mapping[str, Any]) -> tuple[HostSettings, dict[str, str]]:
    """The settings, and where each came from: its stanza key, environment variable, host
    file key, or "default" (for `vpc-attach doctor`)."""
    stanza = stanza_host_values(config, environ, host_file)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting, (value, source) in _chosen(stanza, environ, host_file).items():
        values[setting], sources[setting] = value, source
    settings = HostSettings(**values)
    _check(settings)
    return settings, {setting: sources.get(setting, "default") for setting in _SOURCES}


def lenient_host_settings(config: Mapping[str, Any], environ: Mapping[str, str],
                          host_file: Mapping[str, Any] | None = None) -> HostSettings:
    """The settings as far as they are usable, for what must never fail (the operator log
    around a verb, an Event about a refused config): a config's only where the node allows
    them, an unreadable host file as absent, and an invalid value as its default (the verb
    itself reports it, code 7). host_file: as read already, if it was (unreadable: empty)."""
    if host_file is None:
        try:
            host_file = read_host_file(environ)
        except CniError:
            host_file = {}
    try:
        stanza = stanza_host_values(config, environ, host_file)
    except CniError:
        stanza = {}  # refused: the node's own settings (the verb's answer says why)
    values: dict[str, Any] = {}
    for setting, (value, _source) in _chosen(stanza, environ, host_file).items():
        try:
            _check(HostSettings(**{setting: value}))
        except CniError:
            continue
        values[setting] = value
    settings = HostSettings(**values)
    _check(settings)  # normalises: timeout as a float, counts as ints
    return settings


def _chosen(stanza: Mapping[str, Any], environ: Mapping[str, str],
            host_file: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Each setting that is set: (value, where from), the stanza first, then the environment,
    then the host file (SPEC §4); unset ones are left out (their default applies)."""
    chosen: dict[str, tuple[Any, str]] = {}
    for setting, (key, env_name) in _SOURCES.items():
        candidates = ((stanza.get(key), f"stanza {key}"),
                      (environ.get(env_name) if env_name else None, f"environment {env_name}"),
                      (host_file.get(key), f"host file {key}"))
        found = next(((value, source) for value, source in candidates
                      if value not in (None, "")), None)
        if found is not None:
            chosen[setting] = found
    return chosen


def stanza_host_values(config: Mapping[str, Any], environ: Mapping[str, str],
                       host_file: Mapping[str, Any]) -> dict[str, Any]:
    """The host settings a network config sets, by host-file key; code 7 naming the first one
    unless the node allows stanza host settings (keys match case-insensitively)."""
    allowed = stanza_host_settings_allowed(environ, host_file)  # a bad value is code 7 always
    node_only = node_only_keys()
    known = {key.lower(): key for key, _ in (*_SOURCES.values(), *node_only.items())}
    found = {known[key.lower()]: value for key, value in config.items()
             if isinstance(key, str) and key.lower() in known}
    for key, value in found.items():
        if (key in node_only or not allowed) \
                and not _is_node_value(key, value, environ, host_file):
            raise _not_in_stanza(key, environ)
    return {key: value for key, value in found.items() if key not in node_only}


def _is_node_value(key: str, value: Any, environ: Mapping[str, str],
                   host_file: Mapping[str, Any]) -> bool:
    """Whether a config's host key repeats exactly what the node set (it then chooses nothing:
    configs written before SPEC §14, e.g. `"namespace": "galactic-system"`, keep working)."""
    setting = next((name for name, (k, _) in _SOURCES.items() if k == key), None)
    if setting is None or value is None:
        return False
    env_name = _SOURCES[setting][1]
    node = (environ.get(env_name) if env_name else None) or host_file.get(key) \
        or getattr(HostSettings(), setting)
    return node is not None and str(node) == str(value)


def stanza_host_settings_allowed(environ: Mapping[str, str], host_file: Mapping[str, Any]) -> bool:
    """Whether this node lets network configs set host settings (`allow`; default `deny`)."""
    value = environ.get(STANZA_HOST_SETTINGS_ENV) or host_file.get(STANZA_HOST_SETTINGS_KEY)
    if value in (None, "", "deny"):
        return False
    if value == "allow":
        return True
    raise CniError(INVALID_CONFIG, f"invalid {STANZA_HOST_SETTINGS_KEY} {value!r}",
                   f"expected 'allow' or 'deny' (host file key {STANZA_HOST_SETTINGS_KEY}, "
                   f"environment {STANZA_HOST_SETTINGS_ENV})")


def _not_in_stanza(key: str, environ: Mapping[str, str]) -> CniError:
    node_only = node_only_keys()
    env_name = node_only[key] if key in node_only \
        else next(env for k, env in _SOURCES.values() if k == key)
    host_file = environ.get(HOST_CONFIG_ENV) or DEFAULT_HOST_CONFIG
    why = "a network config may not choose where vpc-attach writes, what it connects to or " \
          "who it is"
    if key not in node_only:
        why += f"; a single-tenant node may allow it with {STANZA_HOST_SETTINGS_KEY}: allow"
    where = f"the host file {host_file}" + (f" or the environment variable {env_name}"
                                            if env_name else "")
    return CniError(INVALID_CONFIG, f"config key {key!r} is a host setting: set it in {where}, "
                    "not in the network config", why)


def ipam_data_root(environ: Mapping[str, str], host_file: Mapping[str, Any]) -> str:
    """The directory `vpc-attach-ipam`'s dataDir must be in (code 7 unless absolute)."""
    root = environ.get(IPAM_DATA_ROOT_ENV) or host_file.get(IPAM_DATA_ROOT_KEY) \
        or DEFAULT_IPAM_DATA_ROOT
    if not isinstance(root, str) or not root.startswith("/"):
        raise CniError(INVALID_CONFIG, f"invalid {IPAM_DATA_ROOT_KEY} {root!r}",
                       f"expected an absolute path (host file key {IPAM_DATA_ROOT_KEY}, "
                       f"environment {IPAM_DATA_ROOT_ENV})")
    return root


def _check(settings: HostSettings) -> None:
    if not isinstance(settings.log_level, str) or settings.log_level.lower() not in LOG_LEVELS:
        raise CniError(INVALID_CONFIG, f"invalid log level {settings.log_level!r}",
                       f"expected one of {', '.join(LOG_LEVELS)}")
    try:
        timeout = float(settings.timeout_seconds)
    except (TypeError, ValueError):
        timeout = -1.0
    if not 0 < timeout <= 600:
        raise CniError(INVALID_CONFIG, f"invalid timeoutSeconds {settings.timeout_seconds!r}",
                       "expected a number of seconds in (0, 600]")
    object.__setattr__(settings, "timeout_seconds", timeout)
    if settings.tenancy is not None and settings.tenancy not in TENANCY_MODES:
        raise CniError(INVALID_CONFIG, f"invalid tenancy {settings.tenancy!r}",
                       f"expected one of {', '.join(TENANCY_MODES)}")
    object.__setattr__(settings, "log_max_bytes",
                       _count(settings.log_max_bytes, "logMaxBytes", 0, 2**40))
    object.__setattr__(settings, "log_backups",
                       _count(settings.log_backups, "logBackups", 0, MAX_LOG_BACKUPS))
    for name in ("node_name", "kubeconfig", "namespace", "log_file", "agent_socket", "lock_dir"):
        value = getattr(settings, name)
        if value is not None and not isinstance(value, str):
            raise CniError(INVALID_CONFIG, f"host setting {name!r} must be a string")


def _count(value: Any, key: str, low: int, high: int) -> int:
    """An integer setting (a JSON number or, from the environment, its digits) in [low, high]."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())
    if number is None or not low <= number <= high:
        raise CniError(INVALID_CONFIG, f"invalid {key} {value!r}",
                       f"expected a whole number in [{low}, {high}]")
    return number


# Settings of the node alone, in groups (SPEC §14, §15): each field is declared once with
# `node_setting` (its host-file key, environment variable, parser and default), and is then
# read from the environment, else the host file, refused in a network config, and resolved
# with its group by `NodeSettings`. A new setting is one field in its group.
T = TypeVar("T")
G = TypeVar("G", bound="DataclassInstance")


@dataclass(frozen=True)
class NodeSetting(Generic[T]):
    """Where one setting of the node comes from and how its value is read."""

    key: str  # the host file's key (refused in a network config)
    env: str | None  # the environment variable; None: the host file only
    parse: Callable[[Any, NodeSetting[T]], T]  # the value as set (never None or "") -> typed
    env_form: Callable[[str], Any] | None = None  # the variable's text -> the host file's form

    def raw(self, environ: Mapping[str, str], host_file: Mapping[str, Any]) -> Any:
        """The value as set: the environment's, else the host file's; None when unset."""
        text = environ.get(self.env) if self.env else None
        if text not in (None, ""):
            assert text is not None
            return self.env_form(text) if self.env_form else text
        value = host_file.get(self.key)
        return None if value in (None, "") else value

    @property
    def named(self) -> str:
        """Where an operator sets it, for a message."""
        return f"host file key {self.key}" + (f", environment {self.env}" if self.env else "")


def node_setting(key: str, env: str | None, parse: Callable[[Any, NodeSetting[T]], T],
                 default: T, *, env_form: Callable[[str], Any] | None = None) -> T:
    """A field of a node settings group (its default when unset)."""
    source = NodeSetting(key, env, parse, env_form)
    return field(default=default, metadata={"node_setting": source})


_GROUPS: list[type[Any]] = []


def node_settings_group(group: type[G]) -> type[G]:
    """Declare a frozen dataclass of `node_setting` fields a group of the node's settings."""
    _GROUPS.append(group)
    return group


def resolve_group(group: type[G], environ: Mapping[str, str],
                  host_file: Mapping[str, Any]) -> G:
    """A group's settings, each from the environment, else the host file, else its default;
    code 7 naming the first one malformed."""
    values: dict[str, Any] = {}
    for each in fields(group):
        source: NodeSetting[Any] = each.metadata["node_setting"]
        raw = source.raw(environ, host_file)
        if raw is not None:
            values[each.name] = source.parse(raw, source)
    return group(**values)


def node_only_keys() -> dict[str, str | None]:
    """Every setting of the node alone: host file key -> environment variable."""
    grouped = {source.key: source.env for group in _GROUPS for each in fields(group)
               for source in (each.metadata["node_setting"],)}
    return {**_NODE_ONLY, **grouped}


# Parsers of node settings: (value as set, its source) -> the typed value, or code 7.

def absolute_path(value: Any, source: NodeSetting[str]) -> str:
    """A directory or file given by its absolute path."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                       f"expected an absolute path (environment {source.env})")
    return value


def link_names(value: Any, source: NodeSetting[tuple[str, ...]]) -> tuple[str, ...]:
    """Interface names: a list, or comma-separated."""
    names = value
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    if not isinstance(names, list) or not all(_link_name(n) for n in names):
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {names!r}",
                       f"expected interface names (a list, or comma-separated in {source.env})")
    return tuple(names)


def underlay_mtu(value: Any, source: NodeSetting[int | None]) -> int | None:
    """An MTU that still carries an encapsulated IPv6 packet of the minimum MTU."""
    return _count(value, source.key, MIN_UNDERLAY_MTU, 65535)


def on_or_off(value: Any, source: NodeSetting[bool]) -> bool:
    """`on` (True) or `off` (False); the host file may hold a JSON boolean too."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("on", "off"):
        return value.strip().lower() == "on"
    raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                   f"expected 'on' or 'off' (environment {source.env})")


def ipv6_sids(value: Any, source: NodeSetting[tuple[str, ...]]) -> tuple[str, ...]:
    """IPv6 SIDs: a list, or comma-separated (blanks skipped)."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        if not isinstance(items, list):
            raise ValueError("not a list")
        sids = [ipaddress.IPv6Address(str(item).strip()) for item in items if str(item).strip()]
        if any(sid.is_unspecified for sid in sids):
            raise ValueError("the unspecified address is no SID")
    except ValueError as exc:
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                       f"{exc}; expected IPv6 SIDs (a list, or comma-separated in "
                       f"{source.env})") from None
    return tuple(str(sid) for sid in sids)


def _link_name(name: Any) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 15 and name not in (".", "..") and \
        not any(c in name for c in "/: \t\n")


# Datapath settings (SPEC §14): the node's operator alone opens host ports or widens the source
# check, so these come from the environment and the host file only, never from a stanza.
HOST_ACCESS_PROTOCOLS = ("tcp", "udp", "sctp")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PortRange:
    """One `hostAccess` entry: protocol/port or protocol/first-last."""

    protocol: str
    first: int
    last: int

    def __str__(self) -> str:
        ports = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{self.protocol}/{ports}"


@dataclass(frozen=True)
class AllowedSources:
    """One `allowedSourcePrefixes` entry: extra source prefixes of a VPC's attachment (or of
    all its attachments when vpcattachment is None)."""

    vpc: str
    vpcattachment: str | None
    prefixes: tuple[IPNetwork, ...]


def parse_port_range(text: Any) -> PortRange:
    """`udp/53` or `tcp/8000-8080` (code 7 otherwise)."""
    protocol, _, ports = str(text).strip().lower().partition("/")
    first_text, _, last_text = ports.partition("-")
    last_text = last_text or first_text
    if protocol in HOST_ACCESS_PROTOCOLS and first_text.isdigit() and last_text.isdigit():
        first, last = int(first_text), int(last_text)
        if 1 <= first <= last <= 65535:
            return PortRange(protocol, first, last)
    raise CniError(INVALID_CONFIG, f"invalid hostAccess entry {text!r}",
                   "expected protocol/port or protocol/first-last, protocol one of "
                   f"{', '.join(HOST_ACCESS_PROTOCOLS)}, ports 1-65535")


def port_ranges(value: Any, source: NodeSetting[tuple[PortRange, ...]]) -> tuple[PortRange, ...]:
    """`hostAccess`: a list of `parse_port_range` entries (comma-separated in the
    environment)."""
    if not isinstance(value, list):
        raise CniError(INVALID_CONFIG, f"host setting {source.key!r} must be a list",
                       'e.g. ["udp/53", "tcp/53"]')
    return tuple(parse_port_range(item) for item in value)


def _comma_list(text: str) -> list[str]:
    return [item for item in text.split(",") if item.strip()]


def allowed_sources(value: Any, source: NodeSetting[tuple[AllowedSources, ...]]
                    ) -> tuple[AllowedSources, ...]:
    """`allowedSourcePrefixes`: a list of {vpc, vpcattachment (optional), prefixes}."""
    if not isinstance(value, list):
        raise CniError(INVALID_CONFIG, f"host setting {source.key!r} must be a list")
    return tuple(_allowed_sources(item) for item in value)


def _allowed_sources(item: Any) -> AllowedSources:
    hint = 'expected {"vpc": "…", "vpcattachment": "…" (optional), "prefixes": ["…/…"]}'
    if not isinstance(item, dict) or not isinstance(item.get("prefixes"), list):
        raise CniError(INVALID_CONFIG, f"invalid allowedSourcePrefixes entry {item!r}", hint)
    vpc, attachment = item.get("vpc"), item.get("vpcattachment")
    try:
        if not isinstance(vpc, str) or decode_base62(vpc) >= VPC_LIMIT:
            raise ValueError("vpc")
        if attachment is not None and (not isinstance(attachment, str)
                                       or decode_base62(attachment) >= ATTACHMENT_LIMIT):
            raise ValueError("vpcattachment")
        prefixes = tuple(ipaddress.ip_network(p, strict=False) for p in item["prefixes"])
    except (ValueError, TypeError) as exc:
        raise CniError(INVALID_CONFIG, f"invalid allowedSourcePrefixes entry {item!r}",
                       f"{exc}; {hint}") from None
    return AllowedSources(vpc, attachment, prefixes)


@node_settings_group
@dataclass(frozen=True)
class DatapathSettings:
    """What the node's host protection lets through beyond the defaults."""

    host_access: tuple[PortRange, ...] = node_setting(
        "hostAccess", "VPC_ATTACH_HOST_ACCESS", port_ranges, (), env_form=_comma_list)
    allowed_sources: tuple[AllowedSources, ...] = node_setting(
        "allowedSourcePrefixes", None, allowed_sources, ())


def resolve_datapath_settings(environ: Mapping[str, str],
                              host_file: Mapping[str, Any] | None = None) -> DatapathSettings:
    """hostAccess (VPC_ATTACH_HOST_ACCESS, comma-separated, over the host file's list) and
    allowedSourcePrefixes (host file only); code 7 for anything malformed."""
    host_file = read_host_file(environ) if host_file is None else host_file
    return resolve_group(DatapathSettings, environ, host_file)


@node_settings_group
@dataclass(frozen=True)
class GalacticSettings:
    """Where galactic's datapath is pinned, and the underlay its packets cross (SPEC §15)."""

    pin_dir: str = node_setting("galacticPinDir", "VPC_ATTACH_GALACTIC_PIN_DIR", absolute_path,
                                DEFAULT_GALACTIC_PIN_DIR)
    # empty: the IPv6 default route's devices
    underlay_interfaces: tuple[str, ...] = node_setting(
        "underlayInterfaces", "VPC_ATTACH_UNDERLAY_INTERFACES", link_names, ())
    # None: the smallest MTU of the underlay interfaces
    underlay_mtu: int | None = node_setting("underlayMTU", "VPC_ATTACH_UNDERLAY_MTU",
                                            underlay_mtu, None)
    # a VRF's default egress goes to the first reachable
    nat66_shard_sids: tuple[str, ...] = node_setting(
        "nat66ShardSIDs", "VPC_ATTACH_NAT66_SHARD_SIDS", ipv6_sids, ())
    # off: a registered veth's Pod side segments before usid_egress (galactic's at the
    # compatible commit drops a GSO packet it encapsulates); on: galactic encapsulates them
    offloads: bool = node_setting("galacticOffloads", "VPC_ATTACH_GALACTIC_OFFLOADS", on_or_off,
                                  False)


def resolve_galactic_settings(environ: Mapping[str, str],
                              host_file: Mapping[str, Any] | None = None) -> GalacticSettings:
    """galacticPinDir, underlayInterfaces (a list, or comma-separated), underlayMTU,
    nat66ShardSIDs and galacticOffloads from the environment, else the host file; code 7 for
    anything malformed."""
    host_file = read_host_file(environ) if host_file is None else host_file
    return resolve_group(GalacticSettings, environ, host_file)


def network_policy_mode(value: Any, source: NodeSetting[bool]) -> bool:
    """`networkPolicy`: enforce (True) or off (False)."""
    if value not in NETWORK_POLICY_MODES:
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                       f"expected one of {', '.join(NETWORK_POLICY_MODES)} (environment "
                       f"{source.env})")
    return bool(value == "enforce")


@node_settings_group
@dataclass(frozen=True)
class PolicySettings:
    """Policy inside a VPC (SPEC §17): MultiNetworkPolicy on attachments made from
    NetworkAttachmentDefinitions, NetworkPolicy on the node's conflist (primary network)
    attachments, each where the node's operator says so."""

    network_policy: bool = node_setting("networkPolicy", "VPC_ATTACH_NETWORK_POLICY",
                                        network_policy_mode, False)
    # SPEC §17 has it on; off in this release until issue 39 is done (taps, paths between
    # nodes): a node turns it on, and ADD, the agent and doctor leave policy alone otherwise.
    multi_network_policy: bool = node_setting(
        "multiNetworkPolicy", "VPC_ATTACH_MULTI_NETWORK_POLICY", network_policy_mode, False)


@dataclass(frozen=True)
class NodeSettings:
    """The node's settings for one verb, from its request's environment and the host file,
    read once here (SPEC §4, §14). Each group is resolved when a step first reads it (a
    malformed one is code 7 only where it is used, as it always was), then kept: no step reads
    the host file again. A network config never sets any of them."""

    environ: Mapping[str, str]  # the request's VPC_ATTACH_* variables (an IPAM delegate's too)
    host_file: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, environ: Mapping[str, str],
             host_file: Mapping[str, Any] | None = None) -> NodeSettings:
        """The request's settings: its VPC_ATTACH_* environment and the host file it names,
        read here unless given (code 7 when that is unreadable or not JSON)."""
        return cls({k: v for k, v in environ.items() if k.startswith(NODE_ENV_PREFIX)},
                   read_host_file(environ) if host_file is None else host_file)

    def host(self, config: Mapping[str, Any]) -> HostSettings:
        """The host settings for an invocation of network config `config` (code 7 when the
        config sets one the node does not let it set); `{}`: the node's own."""
        return resolve_with_sources(config, self.environ, self.host_file)[0]

    @cached_property
    def datapath(self) -> DatapathSettings:
        """hostAccess, allowedSourcePrefixes."""
        return resolve_group(DatapathSettings, self.environ, self.host_file)

    @cached_property
    def galactic(self) -> GalacticSettings:
        """galactic's pins and the underlay."""
        return resolve_group(GalacticSettings, self.environ, self.host_file)

    @cached_property
    def policy(self) -> PolicySettings:
        """networkPolicy, multiNetworkPolicy."""
        return resolve_group(PolicySettings, self.environ, self.host_file)

    @cached_property
    def ipam_data_root(self) -> str:
        """The directory `vpc-attach-ipam`'s dataDir must be in (as set, not resolved)."""
        return ipam_data_root(self.environ, self.host_file)
