"""Host settings: where a node's identity and credentials come from (SPEC §4, §14).

They come from the VPC_ATTACH_* environment (the runtime's), then the host file written by the
installer, then defaults. A network config is tenant input: one that sets a host setting is
code 7, unless the node allows it (`stanzaHostSettings: allow`), when the stanza comes first.
Resolving them reads at most one local file and never the network. A verb reads it once:
`NodeSettings` holds the request's VPC_ATTACH_* environment and the host file, and resolves the
settings of the node alone (galactic's, the datapath's, policy's, `ipamDataRoot`) from them when
a step first reads them. Those settings are declared in groups (`netconf.node_groups`) with the
registry of `netconf.node_setting` and the parsers of `netconf.node_parsers`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from netconf.errors import INVALID_CONFIG, CniError
from netconf.formats import check_format
from netconf.node_groups import DatapathSettings, GalacticSettings, PolicySettings
from netconf.node_parsers import whole_number
from netconf.node_setting import grouped_keys, resolve_group

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
STANZA_HOST_SETTINGS_KEY = "stanzaHostSettings"
STANZA_HOST_SETTINGS_ENV = "VPC_ATTACH_STANZA_HOST_SETTINGS"
IPAM_DATA_ROOT_KEY = "ipamDataRoot"
IPAM_DATA_ROOT_ENV = "VPC_ATTACH_IPAM_DATA_ROOT"
DEFAULT_IPAM_DATA_ROOT = "/var/lib/cni/vpc-attach-ipam"

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


def node_only_keys() -> dict[str, str | None]:
    """Every setting of the node alone: host file key -> environment variable."""
    return {**_NODE_ONLY, **grouped_keys()}


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
                       whole_number(settings.log_max_bytes, "logMaxBytes", 0, 2**40))
    object.__setattr__(settings, "log_backups",
                       whole_number(settings.log_backups, "logBackups", 0, MAX_LOG_BACKUPS))
    for name in ("node_name", "kubeconfig", "namespace", "log_file", "agent_socket", "lock_dir"):
        value = getattr(settings, name)
        if value is not None and not isinstance(value, str):
            raise CniError(INVALID_CONFIG, f"host setting {name!r} must be a string")


def resolve_datapath_settings(environ: Mapping[str, str],
                              host_file: Mapping[str, Any] | None = None) -> DatapathSettings:
    """hostAccess (VPC_ATTACH_HOST_ACCESS, comma-separated, over the host file's list) and
    allowedSourcePrefixes (host file only); code 7 for anything malformed."""
    host_file = read_host_file(environ) if host_file is None else host_file
    return resolve_group(DatapathSettings, environ, host_file)


def resolve_galactic_settings(environ: Mapping[str, str],
                              host_file: Mapping[str, Any] | None = None) -> GalacticSettings:
    """galacticPinDir, underlayInterfaces (a list, or comma-separated), underlayMTU,
    nat66ShardSIDs and galacticOffloads from the environment, else the host file; code 7 for
    anything malformed."""
    host_file = read_host_file(environ) if host_file is None else host_file
    return resolve_group(GalacticSettings, environ, host_file)


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
