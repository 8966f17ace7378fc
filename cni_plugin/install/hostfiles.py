"""The host settings file the plugin reads (netconf/host.py) and an optional conflist."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cni_plugin.install.errors import InstallError
from cni_plugin.install.targets import FileTarget
from netconf.formats import FORMAT_KEY, FORMAT_VERSION
from netconf.host import LOG_LEVELS, MAX_LOG_BACKUPS, TENANCY_MODES

CONFLIST_SUFFIXES = (".conflist", ".conf", ".json")  # what runtimes load from the conf dir


@dataclass(frozen=True)
class HostSettingsFile:
    """The keys of the host settings file (the installer's share of SPEC §4 precedence)."""

    node_name: str | None
    kubeconfig: str | None
    log_file: str | None
    log_level: str
    agent_socket: str
    namespace: str
    log_max_bytes: int | None = None  # unset: the plugin's default (10 MiB)
    log_backups: int | None = None  # unset: the plugin's default (3)
    tenancy: str | None = None  # unset: enforce wherever there is a kubeconfig

    def target(self, path: str) -> FileTarget:
        """The file, as deterministic JSON (a second run writes the same bytes)."""
        if self.log_level not in LOG_LEVELS:
            raise InstallError(f"invalid log level {self.log_level!r}",
                               f"expected one of {', '.join(LOG_LEVELS)}")
        if self.log_backups is not None and not 0 <= self.log_backups <= MAX_LOG_BACKUPS:
            raise InstallError(f"invalid log backups {self.log_backups}",
                               f"expected 0 to {MAX_LOG_BACKUPS}")
        if self.tenancy is not None and self.tenancy not in TENANCY_MODES:
            raise InstallError(f"invalid tenancy {self.tenancy!r}",
                               f"expected one of {', '.join(TENANCY_MODES)}")
        if self.log_max_bytes is not None and self.log_max_bytes < 0:
            raise InstallError(f"invalid log max bytes {self.log_max_bytes}")
        values = {"nodeName": self.node_name, "kubeconfig": self.kubeconfig,
                  "logFile": self.log_file, "logLevel": self.log_level,
                  "agentSocket": self.agent_socket, "namespace": self.namespace,
                  "tenancy": self.tenancy}
        data: dict[str, str | int] = {FORMAT_KEY: FORMAT_VERSION}
        data.update((key, value) for key, value in values.items() if value)
        for key, number in (("logMaxBytes", self.log_max_bytes),
                            ("logBackups", self.log_backups)):
            if number is not None:
                data[key] = number
        return FileTarget(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(),
                          0o644)


def conflist_target(source: Path, conf_dir: str, name: str | None) -> FileTarget:
    """The conflist copied byte for byte into the conf dir, after checking it is one."""
    dest_name = name or source.name
    if "/" in dest_name or not dest_name.endswith(CONFLIST_SUFFIXES):
        raise InstallError(f"conflist name {dest_name!r} must be a file name ending in "
                           f"{', '.join(CONFLIST_SUFFIXES)} (runtimes ignore other files)")
    try:
        content = source.read_bytes()
        data = json.loads(content)
    except OSError as exc:
        raise InstallError(f"cannot read conflist {source}: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InstallError(f"conflist {source} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise InstallError(f"conflist {source} has no \"name\"")
    plugins = data.get("plugins")
    if not (isinstance(plugins, list) and plugins) and "type" not in data:
        raise InstallError(f"conflist {source} has neither a non-empty \"plugins\" list nor "
                           "a \"type\"")
    return FileTarget(f"{conf_dir}/{dest_name}", content, 0o644)
