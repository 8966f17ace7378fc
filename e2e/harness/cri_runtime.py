"""A node's container runtime for the plugin: containerd + runc with its CRI, calling the CNI
conflists a test writes into its conf dir exactly as under a kubelet, for Pods that exist in the
local control plane; the conflists an operator writes ([`vpc-attach`, `tuning`, `portmap`] and
the Go reference chain beside it) and what a test reads back from the node (links, sysfs,
vpc-attach-ipam's records, the plugin's log).

containerd runs CNI plugins with its own environment, so it is started with
VPC_ATTACH_HOST_CONFIG naming the node's host file (node name, kubeconfig, log, locks).
e2e.harness.cri needs grpcio: it is imported only where a runtime starts.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cni_plugin.core import naming
from cni_plugin.kernel.links import Owner
from cni_plugin.publish.endpointslice import slice_name
from e2e.harness.kernel import IS_ROOT, links_in
from e2e.harness.kube import Kube
from e2e.harness.publishing import advertisements_of, create_pod, create_router, endpoint_slice

if TYPE_CHECKING:
    from e2e.harness.cri import Containerd, CriClient, SandboxConfig

# containerd 1.6 (Debian 12) vendors libcni 1.1, which knows CNI versions up to 1.0.0.
CNI_VERSION = "1.0.0"
IPV6_POOL = "fd00:c7::/48"
IPV4_POOL = "10.207.0.0/24"
LIBCNI_RESULTS = Path("/var/lib/cni/results")  # containerd 1.6 does not make it configurable


@dataclass
class Runtime:
    """containerd for this module, its CNI conf dir and the plugin's host settings."""

    containerd: Containerd
    conf_dir: Path
    node: str
    log_file: Path

    @property
    def cri(self) -> CriClient:
        """The CRI client."""
        return self.containerd.client

    def use_networks(self, *conflists: dict[str, Any]) -> None:
        """Make these conflists the runtime's networks (eth0, eth1, …) and wait until loaded."""
        for old in self.conf_dir.iterdir():
            old.unlink()
        for index, conflist in enumerate(conflists):
            staged = self.conf_dir / f".{index}.tmp"
            staged.write_text(json.dumps(conflist))
            staged.rename(self.conf_dir / f"{10 + index}-{conflist['name']}.conflist")
        self.containerd.wait_networks(list(conflists))

    def verbs(self, pod: str) -> list[dict[str, Any]]:
        """The plugin's one-line-per-verb log entries for a Pod, oldest first."""
        entries = []
        for line in self.log_file.read_text().splitlines() if self.log_file.exists() else []:
            if line.startswith("{"):
                entry = json.loads(line)
                if entry.get("pod") == f"default/{pod}":
                    entries.append(entry)
        return entries


@contextmanager
def containerd_runtime(base: Path, cluster: Any, kube: Kube, installed_bin: Path,
                       agent_socket: str, ipam_data_root: Path) -> Iterator[Runtime]:
    """containerd + runc with the CRI under base, the plugin pointed at the local control plane
    as a node (its own BGPRouter, host file, log and locks); fails if containerd's teardown
    finds what it left."""
    if not IS_ROOT:
        pytest.skip("needs root for containerd")
    missing = [tool for tool in ("containerd", "ctr", "runc", "nsenter")
               if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/setup.sh installs them)")
    from e2e.harness.cri import Containerd
    from e2e.harness.cri.containerd import CniSettings
    from e2e.harness.cri.pause import pause_image

    node = f"worker-{secrets.token_hex(3)}"
    create_router(kube, node)
    log_file = base / "vpc-attach.log"
    (base / "locks").mkdir()
    host_file = base / "host.json"
    host_file.write_text(json.dumps({
        "nodeName": node, "kubeconfig": str(cluster.plugin_kubeconfig),
        "logFile": str(log_file), "lockDir": str(base / "locks"),
        "agentSocket": agent_socket, "ipamDataRoot": str(ipam_data_root)}))
    conf_dir = base / "net.d"
    containerd = Containerd(base / "containerd",
                            CniSettings(installed_bin, conf_dir, max_conf_num=2),
                            pause_image(), env={"VPC_ATTACH_HOST_CONFIG": str(host_file)})
    containerd.start()
    try:
        yield Runtime(containerd, conf_dir, node, log_file)
    finally:
        problems = containerd.stop()
        assert problems == [], f"containerd teardown found left-overs: {problems}"


def vpc_attach_chain(name: str, vpc: str, att: str, ipam_dir: Path,
                     **stanza: Any) -> dict[str, Any]:
    """[vpc-attach (publishing on, both families), tuning, portmap] as an operator writes it."""
    plugin: dict[str, Any] = {
        "type": "vpc-attach", "vpc": vpc, "vpcattachment": att, "isolation": "table",
        "publish": {"bgp": True, "endpointSlice": True,
                    "endpointSliceFamilies": ["IPv6", "IPv4"]},
        "ipam": {"type": "vpc-attach-ipam", "dataDir": str(ipam_dir),
                 "ipv6_subnet": IPV6_POOL, "ipv4_subnet": IPV4_POOL},
        **stanza}
    return {"cniVersion": CNI_VERSION, "name": name, "plugins": [
        plugin,
        {"type": "tuning", "sysctl": {"net.core.somaxconn": "1000"}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ]}


def ptp_network(name: str, ipam_dir: Path, subnet: str) -> dict[str, Any]:
    """The Go reference chain (ptp + host-local, tuning, portmap)."""
    return {"cniVersion": CNI_VERSION, "name": name, "plugins": [
        {"type": "ptp", "ipMasq": False,
         "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                  "ranges": [[{"subnet": subnet}]]}},
        {"type": "tuning", "sysctl": {"net.core.somaxconn": "1000"}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ]}


def pod_sandbox(kube: Kube, runtime: Runtime, prefix: str) -> SandboxConfig:
    """A Pod object on this node and the PodSandboxConfig a kubelet would send for it."""
    from e2e.harness.cri import SandboxConfig as Sandbox
    pod = f"{prefix}-{secrets.token_hex(3)}"
    uid = create_pod(kube, pod, runtime.node)
    return Sandbox(name=pod, namespace="default", uid=uid)


def records(data_dir: Path) -> list[str]:
    """vpc-attach-ipam allocation records (files named by the address they hold)."""
    found = []
    for path in data_dir.rglob("*") if data_dir.exists() else []:
        try:
            ipaddress.ip_address(path.name)
        except ValueError:
            continue
        found.append(path.name)
    return sorted(found)


def in_netns(netns: str, *argv: str) -> str:
    """argv's output, run in the sandbox's network namespace."""
    proc = subprocess.run(["nsenter", f"--net={netns}", *argv], capture_output=True, text=True,
                          timeout=20, check=True)
    return proc.stdout


def alias(link: str) -> str:
    """A host link's ifalias (where the plugin writes its owner)."""
    return Path(f"/sys/class/net/{link}/ifalias").read_text().strip()


def sysfs(link: str, key: str) -> int:
    """A link's integer attribute from sysfs (owner, group, tun_flags, mtu)."""
    return int(Path(f"/sys/class/net/{link}/{key}").read_text().strip(), 0)


def links_owned_by(container_ids: set[str]) -> list[str]:
    """Host links whose ownership alias names one of these containers."""
    owned = []
    for link in links_in():
        try:
            owner = Owner.from_alias(alias(link))
        except OSError:
            continue
        if owner is not None and owner.container_id in container_ids:
            owned.append(link)
    return owned


def assert_withdrawn(kube: Kube, sandbox: SandboxConfig, sandbox_id: str, vpc: str, att: str,
                     ipam_dir: Path) -> None:
    """Nothing of the sandbox's attachment left: host link, links it owned, IPAM records,
    advertisements, EndpointSlices."""
    assert naming.host_link_name(vpc, att) not in links_in()
    assert links_owned_by({sandbox_id}) == []
    assert records(ipam_dir) == [], "IPAM records released"
    assert advertisements_of(kube, vpc, att) == {}
    for family in ("IPv6", "IPv4"):
        assert endpoint_slice(kube, slice_name(sandbox.name, vpc, att, family)) is None
