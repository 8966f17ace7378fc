"""Host settings: where a node's identity and credentials come from (SPEC §4).

Precedence, highest first: the stanza, the VPC_ATTACH_* environment, the host file written by
the installer, defaults. Resolving them reads at most one local file and never the network.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netconf.errors import INVALID_CONFIG, CniError

HOST_CONFIG_ENV = "VPC_ATTACH_HOST_CONFIG"
DEFAULT_HOST_CONFIG = "/etc/vpc-attach/host.json"
DEFAULT_NAMESPACE = "galactic-system"
DEFAULT_AGENT_SOCKET = "/run/vpc-attach/agent.sock"
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_LOCK_DIR = "/run/vpc-attach/locks"
LOG_LEVELS = ("debug", "info", "warning", "error")

# setting -> (host-file / stanza key, environment variable)
_SOURCES: dict[str, tuple[str, str | None]] = {
    "node_name": ("nodeName", "VPC_ATTACH_NODE_NAME"),
    "kubeconfig": ("kubeconfig", "VPC_ATTACH_KUBECONFIG"),
    "namespace": ("namespace", None),
    "log_file": ("logFile", "VPC_ATTACH_LOG_FILE"),
    "log_level": ("logLevel", "VPC_ATTACH_LOG_LEVEL"),
    "agent_socket": ("agentSocket", "VPC_ATTACH_AGENT_SOCKET"),
    "timeout_seconds": ("timeoutSeconds", "VPC_ATTACH_TIMEOUT_SECONDS"),
    "lock_dir": ("lockDir", "VPC_ATTACH_LOCK_DIR"),
}


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


def read_host_file(environ: Mapping[str, str]) -> dict[str, Any]:
    """The installer's host file; missing is empty, unreadable or not JSON is code 7."""
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
    return data


def resolve_host_settings(stanza: Mapping[str, Any], environ: Mapping[str, str]) -> HostSettings:
    """Apply stanza > environment > host file > defaults.

    `stanza` maps host-file keys (nodeName, kubeconfig, ...) to values set in the plugin stanza.
    """
    host_file = read_host_file(environ)
    values: dict[str, Any] = {}
    for setting, (key, env_name) in _SOURCES.items():
        candidates = (stanza.get(key), environ.get(env_name) if env_name else None,
                      host_file.get(key))
        chosen = next((c for c in candidates if c not in (None, "")), None)
        if chosen is not None:
            values[setting] = chosen
    settings = HostSettings(**values)
    _check(settings)
    return settings


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
    for name in ("node_name", "kubeconfig", "namespace", "log_file", "agent_socket", "lock_dir"):
        value = getattr(settings, name)
        if value is not None and not isinstance(value, str):
            raise CniError(INVALID_CONFIG, f"host setting {name!r} must be a string")
