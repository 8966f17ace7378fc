"""What every check of `vpc-attach doctor` shares: a finding is `ok`, `warn` (worth knowing, not
wrong), `fail` (wrong: it says how to fix it) or `skip` (could not be checked because an earlier
check failed); the `Node` is what the checks learn and share (settings, the networks found, the
API client); and the bounds of every network call and netlink request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from cni_plugin.kube.client import KubeClient
from netconf.config import NetConf
from netconf.errors import CniError
from netconf.host import HostSettings, read_host_file

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
API_SECONDS = 5.0
AGENT_SECONDS = 5.0
NETLINK_SECONDS = 5.0
HTTP_SECONDS = 5.0
TUN_DEVICE = "/dev/net/tun"
CONFLIST_SUFFIXES = (".conflist", ".conf", ".json")
@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    check: str
    status: str
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        """The JSON form (`--json`)."""
        return asdict(self)


@dataclass
class Node:
    """What the checks learn and share: settings, the networks found, the API client."""

    environ: Mapping[str, str]
    cni_conf_dir: str
    cni_bin_dir: str
    metrics_address: str
    ipam_data_dirs: list[str]
    settings: HostSettings = field(default_factory=HostSettings)
    networks: list[tuple[str, NetConf]] = field(default_factory=list)
    client: KubeClient | None = None

    def host_file(self) -> dict[str, Any]:
        """The host file the environment names, read once for the whole run: every check
        reads it here (code 7 when it could not be read, as each read was)."""
        if isinstance(self._host_file, CniError):
            raise self._host_file
        return self._host_file

    @cached_property
    def _host_file(self) -> dict[str, Any] | CniError:
        try:
            return read_host_file(self.environ)
        except CniError as exc:
            return exc

    def close(self) -> None:
        """Close the API client, if one was opened."""
        if self.client is not None:
            self.client.close()


def host_file_of(node: Node) -> dict[str, Any]:
    """The node's host file, empty where it could not be read (`settings.hostFile` says so)."""
    try:
        return node.host_file()
    except CniError:
        return {}
