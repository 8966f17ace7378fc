"""What every check of `vpc-attach doctor` shares: a finding is `ok`, `warn` (worth knowing, not
wrong), `fail` (wrong: it says how to fix it) or `skip` (could not be checked because an earlier
check failed); the `Node` is what the checks learn and share (settings, the networks found, the
API client); and the bounds of every network call and netlink request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
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

    def close(self) -> None:
        """Close the API client, if one was opened."""
        if self.client is not None:
            self.client.close()


def host_file_of(node: Node) -> dict[str, Any]:
    try:
        return read_host_file(node.environ)
    except CniError:
        return {}  # reported by host_settings
