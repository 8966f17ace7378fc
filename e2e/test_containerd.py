"""The plugin through a real container runtime: containerd + runc with its CRI call the conflist
[`vpc-attach`, `tuning`, `portmap`] exactly as under a kubelet, for Pods that exist in the local
control plane, with the plugin publishing as the packaged ServiceAccount.

containerd runs CNI plugins with its own environment, so it is started with
VPC_ATTACH_HOST_CONFIG naming this module's host file (node name, kubeconfig, log, locks).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cni_plugin.core import naming
from cni_plugin.kernel.links import Owner
from cni_plugin.kernel.tap import IFF_MULTI_QUEUE, IFF_VNET_HDR
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ENDPOINT_SLICES
from e2e.harness import cnibin
from e2e.harness.kernel import IS_ROOT, links_in
from e2e.harness.kube import Kube
from e2e.harness.publishing import (
    advertisement,
    advertisements_of,
    create_pod,
    create_router,
    deny_writes,
    endpoint_slice,
    vrf_instance,
    wait_denied,
)
from e2e.harness.standalone import stage_standalone

if TYPE_CHECKING:  # e2e.harness.cri needs grpcio: import it only where a test runs
    from e2e.harness.cri import Containerd, CriClient, SandboxConfig

pytestmark = [pytest.mark.root, pytest.mark.cluster]

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


@pytest.fixture(scope="module")
def installed_bin(tmp_path_factory: pytest.TempPathFactory, standalone: Path,
                  reference_plugins: Path) -> Path:
    """The CNI bin dir as a node has it: the standalone build staged by its own installer
    (no Python on the plugin's path), next to the reference plugins of the chain."""
    bin_dir = stage_standalone(standalone, tmp_path_factory.mktemp("node"))
    return cnibin.populate(bin_dir, reference_plugins, ours=bin_dir)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, cluster: Any, kube: Kube,
            installed_bin: Path, agent_socket: str) -> Iterator[Runtime]:
    """containerd + runc with the CRI, the plugin pointed at the local control plane."""
    if not IS_ROOT:
        pytest.skip("needs root for containerd")
    missing = [tool for tool in ("containerd", "ctr", "runc", "nsenter")
               if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/setup.sh installs them)")
    from e2e.harness.cri import Containerd
    from e2e.harness.cri.containerd import CniSettings
    from e2e.harness.cri.pause import pause_image

    base = tmp_path_factory.mktemp("cri")
    node = f"worker-{secrets.token_hex(3)}"
    create_router(kube, node)
    log_file = base / "vpc-attach.log"
    (base / "locks").mkdir()
    host_file = base / "host.json"
    host_file.write_text(json.dumps({
        "nodeName": node, "kubeconfig": str(cluster.plugin_kubeconfig),
        "logFile": str(log_file), "lockDir": str(base / "locks"),
        "agentSocket": agent_socket,
        "ipamDataRoot": str(tmp_path_factory.getbasetemp())}))  # every test's tmp_path
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


def _vpc_attach_chain(name: str, vpc: str, att: str, ipam_dir: Path,
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


def _ptp_network(name: str, ipam_dir: Path, subnet: str) -> dict[str, Any]:
    """The Go reference chain (ptp + host-local, tuning, portmap)."""
    return {"cniVersion": CNI_VERSION, "name": name, "plugins": [
        {"type": "ptp", "ipMasq": False,
         "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                  "ranges": [[{"subnet": subnet}]]}},
        {"type": "tuning", "sysctl": {"net.core.somaxconn": "1000"}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ]}


def _sandbox(kube: Kube, runtime: Runtime, prefix: str) -> SandboxConfig:
    """A Pod object on this node and the PodSandboxConfig a kubelet would send for it."""
    from e2e.harness.cri import SandboxConfig
    pod = f"{prefix}-{secrets.token_hex(3)}"
    uid = create_pod(kube, pod, runtime.node)
    return SandboxConfig(name=pod, namespace="default", uid=uid)


def _records(data_dir: Path) -> list[str]:
    """vpc-attach-ipam allocation records (files named by the address they hold)."""
    found = []
    for path in data_dir.rglob("*") if data_dir.exists() else []:
        try:
            ipaddress.ip_address(path.name)
        except ValueError:
            continue
        found.append(path.name)
    return sorted(found)


def _in_netns(netns: str, *argv: str) -> str:
    proc = subprocess.run(["nsenter", f"--net={netns}", *argv], capture_output=True, text=True,
                          timeout=20, check=True)
    return proc.stdout


def _alias(link: str) -> str:
    return Path(f"/sys/class/net/{link}/ifalias").read_text().strip()


def _sysfs(link: str, key: str) -> int:
    return int(Path(f"/sys/class/net/{link}/{key}").read_text().strip(), 0)


def _links_owned_by(container_ids: set[str]) -> list[str]:
    """Host links whose ownership alias names one of these containers."""
    owned = []
    for link in links_in():
        try:
            owner = Owner.from_alias(_alias(link))
        except OSError:
            continue
        if owner is not None and owner.container_id in container_ids:
            owned.append(link)
    return owned


def _assert_withdrawn(kube: Kube, sandbox: SandboxConfig, sandbox_id: str, vpc: str, att: str,
                      ipam_dir: Path) -> None:
    assert naming.host_link_name(vpc, att) not in links_in()
    assert _links_owned_by({sandbox_id}) == []
    assert _records(ipam_dir) == [], "IPAM records released"
    assert advertisements_of(kube, vpc, att) == {}
    for family in ("IPv6", "IPv4"):
        assert endpoint_slice(kube, slice_name(sandbox.name, vpc, att, family)) is None


def test_run_pod_sandbox_attaches_and_publishes_a_veth_pod_and_stop_remove_withdraw_it(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    runtime.use_networks(_vpc_attach_chain("vpc-veth", vpc, "10", ipam_dir))
    sandbox = _sandbox(kube, runtime, "cri-web")

    sandbox_id = runtime.cri.run_pod_sandbox(sandbox)
    status = runtime.cri.pod_sandbox_status(sandbox_id)
    assert status.ready and status.netns
    host_link = naming.host_link_name(vpc, "10")
    assert host_link in links_in()
    assert Owner.from_alias(_alias(host_link)) == Owner(sandbox_id, "eth0")
    pod_ips = {status.ip, *status.additional_ips}
    v6 = next(ip for ip in pod_ips if ":" in ip)
    v4 = next(ip for ip in pod_ips if ":" not in ip)
    assert ipaddress.ip_address(v6) in ipaddress.ip_network(IPV6_POOL)
    assert ipaddress.ip_address(v4) in ipaddress.ip_network(IPV4_POOL)
    in_sandbox = _in_netns(status.netns, "ip", "-o", "addr", "show", "dev", "eth0")
    assert f"inet6 {v6}/96" in in_sandbox and f"inet {v4}/32" in in_sandbox
    assert _in_netns(status.netns, "cat", "/proc/sys/net/core/somaxconn").strip() == "1000", \
        "tuning ran after vpc-attach, in the sandbox"
    assert sorted(_records(ipam_dir)) == sorted([v6, v4])
    cached = LIBCNI_RESULTS / f"vpc-veth-{sandbox_id}-eth0"
    assert cached.exists(), "libcni cached the chain's result (the prevResult of DEL)"

    adv = advertisement(kube, naming.advertisement_name(vpc, "10", runtime.node))
    assert adv is not None
    cid = naming.annotation_cid(sandbox_id)
    assert adv["metadata"]["annotations"][f"galactic.datum.net/netns.{cid}"] == status.netns
    assert f"{v4}/32" in adv["spec"]["prefixes"]
    assert any(":" in prefix and ipaddress.ip_address(v6) in ipaddress.ip_network(prefix)
               for prefix in adv["spec"]["prefixes"])
    assert vrf_instance(kube, naming.vrf_instance_name(vpc, runtime.node)) is not None
    for family, address in (("IPv6", v6), ("IPv4", v4)):
        eps = endpoint_slice(kube, slice_name(sandbox.name, vpc, "10", family))
        assert eps is not None, f"{family} EndpointSlice"
        assert eps["metadata"]["ownerReferences"][0]["uid"] == sandbox.uid, "K8S_POD_UID"
        assert eps["endpoints"][0]["addresses"] == [address]
        assert eps["endpoints"][0]["nodeName"] == runtime.node

    runtime.cri.stop_pod_sandbox(sandbox_id)  # DEL with the netns and the cached prevResult
    _assert_withdrawn(kube, sandbox, sandbox_id, vpc, "10", ipam_dir)
    assert not os.path.exists(status.netns), "containerd removed the sandbox netns"
    assert not cached.exists()
    # RemovePodSandbox tears the network down once more: a DEL with an empty CNI_NETNS (the
    # netns is closed) and no prevResult (libcni dropped its cache after the first DEL).
    runtime.cri.remove_pod_sandbox(sandbox_id)
    with pytest.raises(CriError) as gone:
        runtime.cri.pod_sandbox_status(sandbox_id)
    assert gone.value.code.name == "NOT_FOUND"
    _assert_withdrawn(kube, sandbox, sandbox_id, vpc, "10", ipam_dir)
    assert vrf_instance(kube, naming.vrf_instance_name(vpc, runtime.node)) is not None, \
        "the VPC's instance on the node is shared state, never deleted by DEL"

    verbs = [(e["verb"], e["containerID"], e["outcome"]) for e in runtime.verbs(sandbox.name)]
    assert verbs == [("ADD", sandbox_id, "ok"), ("DEL", sandbox_id, "ok"),
                     ("DEL", sandbox_id, "ok")], "ADD; DEL on stop; DEL again on remove"


def test_tap_for_a_vm_lives_on_the_host_and_is_withdrawn(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    # A VM runtime's Pod: its own network on eth0, and the VM's tap as a second network (eth1)
    # whose device stays on the host for the hypervisor to open.
    ipam_dir = tmp_path / "ipam"
    vm_network = _vpc_attach_chain(
        "vpc-vm", vpc, "60", ipam_dir, attachment="tap", mtu=1400,
        tap={"owner": 107, "group": 108, "multiQueue": True, "vnetHdr": True})
    runtime.use_networks(_ptp_network("pod", tmp_path / "ptp-ipam", "10.208.0.0/24"),
                         vm_network)
    sandbox = _sandbox(kube, runtime, "cri-vm")

    sandbox_id = runtime.cri.run_pod_sandbox(sandbox)
    status = runtime.cri.pod_sandbox_status(sandbox_id)
    assert status.ready and status.netns
    assert status.ip.startswith("10.208.0."), "the Pod's own network is eth0"
    tap = naming.host_link_name(vpc, "60")
    assert tap in links_in(), "the tap lives on the host"
    assert tap not in _in_netns(status.netns, "ip", "-o", "link")
    assert Owner.from_alias(_alias(tap)) == Owner(sandbox_id, "eth1")
    assert _sysfs(tap, "owner") == 107 and _sysfs(tap, "group") == 108
    flags = _sysfs(tap, "tun_flags")
    assert flags & IFF_MULTI_QUEUE and flags & IFF_VNET_HDR
    assert _sysfs(tap, "mtu") == 1400
    allocated = _records(ipam_dir)
    assert len(allocated) == 2
    v6 = next(ip for ip in allocated if ":" in ip)
    adv = advertisement(kube, naming.advertisement_name(vpc, "60", runtime.node))
    assert adv is not None
    assert any(":" in prefix and ipaddress.ip_address(v6) in ipaddress.ip_network(prefix)
               for prefix in adv["spec"]["prefixes"])
    eps = endpoint_slice(kube, slice_name(sandbox.name, vpc, "60", "IPv6"))
    assert eps is not None and eps["endpoints"][0]["addresses"] == [v6]

    runtime.cri.stop_pod_sandbox(sandbox_id)
    _assert_withdrawn(kube, sandbox, sandbox_id, vpc, "60", ipam_dir)
    runtime.cri.remove_pod_sandbox(sandbox_id)
    _assert_withdrawn(kube, sandbox, sandbox_id, vpc, "60", ipam_dir)
    assert _records(tmp_path / "ptp-ipam") == []


def test_tap_as_the_pods_only_network_is_refused_by_containerd_and_rolled_back(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    # containerd requires addresses on eth0 in the result; a tap has none in the sandbox. The
    # CRI then tears the network down again (DEL), which must leave nothing behind.
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    runtime.use_networks(_vpc_attach_chain("vpc-vm-only", vpc, "61", ipam_dir,
                                           attachment="tap"))
    sandbox = _sandbox(kube, runtime, "cri-vm-only")
    before = set(runtime.cri.list_pod_sandboxes())
    with pytest.raises(CriError) as refused:
        runtime.cri.run_pod_sandbox(sandbox)
    assert set(runtime.cri.list_pod_sandboxes()) == before, "the CRI dropped the sandbox"
    assert "failed to find network info for sandbox" in refused.value.details
    ids = {entry["containerID"] for entry in runtime.verbs(sandbox.name)}
    assert [e["verb"] for e in runtime.verbs(sandbox.name)][:2] == ["ADD", "DEL"]
    assert _links_owned_by(ids) == []
    _assert_withdrawn(kube, sandbox, next(iter(ids)), vpc, "61", ipam_dir)


def test_broken_config_fails_run_pod_sandbox_with_the_plugins_message_and_leaves_nothing(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    broken = _vpc_attach_chain("vpc-broken", vpc, "12", ipam_dir)
    broken["plugins"][0]["vpc"] = "not-base62!"
    runtime.use_networks(broken)
    sandbox = _sandbox(kube, runtime, "cri-broken")
    before = set(runtime.cri.list_pod_sandboxes())

    with pytest.raises(CriError) as failed:
        runtime.cri.run_pod_sandbox(sandbox)
    message = ("invalid config key 'vpc': not base62 "
               "(invalid base62 character '-' in 'not-base62!')")
    assert message in failed.value.details, failed.value.details
    assert 'plugin type="vpc-attach"' in failed.value.details
    entries = runtime.verbs(sandbox.name)
    assert entries and entries[0]["verb"] == "ADD" and entries[0]["code"] == 7
    assert _links_owned_by({e["containerID"] for e in entries}) == []
    assert not ipam_dir.exists() or _records(ipam_dir) == []
    for family in ("IPv6", "IPv4"):
        assert endpoint_slice(kube, slice_name(sandbox.name, vpc, "12", family)) is None

    # containerd's clean-up DEL carries the same broken config, which the plugin rejects too;
    # the runtime then keeps the sandbox (state unknown) until the operator fixes the config.
    leftover = set(runtime.cri.list_pod_sandboxes()) - before
    runtime.use_networks(_vpc_attach_chain("vpc-broken", vpc, "12", ipam_dir))
    for sandbox_id in leftover:
        runtime.cri.stop_pod_sandbox(sandbox_id)
        runtime.cri.remove_pod_sandbox(sandbox_id)
    assert set(runtime.cri.list_pod_sandboxes()) == before
    for sandbox_id in leftover:
        _assert_withdrawn(kube, sandbox, sandbox_id, vpc, "12", ipam_dir)


def test_denied_endpoint_slice_fails_run_pod_sandbox_and_rolls_back_what_the_add_created(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    runtime.use_networks(_vpc_attach_chain("vpc-denied", vpc, "13", ipam_dir))
    sandbox = _sandbox(kube, runtime, "cri-deny")
    before = set(runtime.cri.list_pod_sandboxes())
    remove = deny_writes(kube, f"cri-deny-eps-{vpc.lower()}", "endpointslices",
                         "discovery.k8s.io", ["CREATE"], sandbox.name)
    try:
        wait_denied(lambda: kube.create(ENDPOINT_SLICES.path("default"), {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{sandbox.name}-probe"}, "addressType": "IPv6",
            "endpoints": []}, dry_run=True))
        with pytest.raises(CriError) as failed:
            runtime.cri.run_pod_sandbox(sandbox)
    finally:
        remove()
    details = failed.value.details
    assert set(runtime.cri.list_pod_sandboxes()) == before, "the CRI dropped the sandbox"
    assert 'plugin type="vpc-attach"' in details and "EndpointSlice" in details, details
    assert "denied by test policy" in details, details
    entries = runtime.verbs(sandbox.name)
    assert entries[0]["verb"] == "ADD" and entries[0]["outcome"] == "error"
    assert entries[0]["error"] in details, "the plugin's own message reaches the CRI caller"
    sandbox_id = entries[0]["containerID"]
    _assert_withdrawn(kube, sandbox, sandbox_id, vpc, "13", ipam_dir)
    assert vrf_instance(kube, naming.vrf_instance_name(vpc, runtime.node)) is None, \
        "this ADD created the VPC's instance, so its rollback deleted it"

