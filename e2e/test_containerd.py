"""The plugin through a real container runtime: containerd + runc with its CRI call the conflist
[`vpc-attach`, `tuning`, `portmap`] exactly as under a kubelet, for Pods that exist in the local
control plane, with the plugin publishing as the packaged ServiceAccount.

The runtime and the conflists: `e2e/harness/cri_runtime.py` (e2e.harness.cri needs grpcio: it
is imported only where a test runs).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.kernel.links import Owner
from cni_plugin.kernel.tap import IFF_MULTI_QUEUE, IFF_VNET_HDR
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import ENDPOINT_SLICES
from e2e.harness import cnibin
from e2e.harness.cri_runtime import (
    IPV4_POOL,
    IPV6_POOL,
    LIBCNI_RESULTS,
    Runtime,
    alias,
    assert_withdrawn,
    containerd_runtime,
    in_netns,
    links_owned_by,
    pod_sandbox,
    ptp_network,
    records,
    sysfs,
    vpc_attach_chain,
)
from e2e.harness.kernel import links_in
from e2e.harness.kube import Kube
from e2e.harness.publishing import (
    advertisement,
    deny_writes,
    endpoint_slice,
    vrf_instance,
    wait_denied,
)
from e2e.harness.standalone import stage_standalone

pytestmark = [pytest.mark.root, pytest.mark.cluster]


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
    with containerd_runtime(tmp_path_factory.mktemp("cri"), cluster, kube, installed_bin,
                            agent_socket, tmp_path_factory.getbasetemp()) as runtime:
        yield runtime  # ipamDataRoot: every test's tmp_path


def test_run_pod_sandbox_attaches_and_publishes_a_veth_pod_and_stop_remove_withdraw_it(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    runtime.use_networks(vpc_attach_chain("vpc-veth", vpc, "10", ipam_dir))
    sandbox = pod_sandbox(kube, runtime, "cri-web")

    sandbox_id = runtime.cri.run_pod_sandbox(sandbox)
    status = runtime.cri.pod_sandbox_status(sandbox_id)
    assert status.ready and status.netns
    host_link = naming.host_link_name(vpc, "10")
    assert host_link in links_in()
    assert Owner.from_alias(alias(host_link)) == Owner(sandbox_id, "eth0")
    pod_ips = {status.ip, *status.additional_ips}
    v6 = next(ip for ip in pod_ips if ":" in ip)
    v4 = next(ip for ip in pod_ips if ":" not in ip)
    assert ipaddress.ip_address(v6) in ipaddress.ip_network(IPV6_POOL)
    assert ipaddress.ip_address(v4) in ipaddress.ip_network(IPV4_POOL)
    in_sandbox = in_netns(status.netns, "ip", "-o", "addr", "show", "dev", "eth0")
    assert f"inet6 {v6}/96" in in_sandbox and f"inet {v4}/32" in in_sandbox
    assert in_netns(status.netns, "cat", "/proc/sys/net/core/somaxconn").strip() == "1000", \
        "tuning ran after vpc-attach, in the sandbox"
    assert sorted(records(ipam_dir)) == sorted([v6, v4])
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
    assert_withdrawn(kube, sandbox, sandbox_id, vpc, "10", ipam_dir)
    assert not os.path.exists(status.netns), "containerd removed the sandbox netns"
    assert not cached.exists()
    # RemovePodSandbox tears the network down once more: a DEL with an empty CNI_NETNS (the
    # netns is closed) and no prevResult (libcni dropped its cache after the first DEL).
    runtime.cri.remove_pod_sandbox(sandbox_id)
    with pytest.raises(CriError) as gone:
        runtime.cri.pod_sandbox_status(sandbox_id)
    assert gone.value.code.name == "NOT_FOUND"
    assert_withdrawn(kube, sandbox, sandbox_id, vpc, "10", ipam_dir)
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
    vm_network = vpc_attach_chain(
        "vpc-vm", vpc, "60", ipam_dir, attachment="tap", mtu=1400,
        tap={"owner": 107, "group": 108, "multiQueue": True, "vnetHdr": True})
    runtime.use_networks(ptp_network("pod", tmp_path / "ptp-ipam", "10.208.0.0/24"),
                         vm_network)
    sandbox = pod_sandbox(kube, runtime, "cri-vm")

    sandbox_id = runtime.cri.run_pod_sandbox(sandbox)
    status = runtime.cri.pod_sandbox_status(sandbox_id)
    assert status.ready and status.netns
    assert status.ip.startswith("10.208.0."), "the Pod's own network is eth0"
    tap = naming.host_link_name(vpc, "60")
    assert tap in links_in(), "the tap lives on the host"
    assert tap not in in_netns(status.netns, "ip", "-o", "link")
    assert Owner.from_alias(alias(tap)) == Owner(sandbox_id, "eth1")
    assert sysfs(tap, "owner") == 107 and sysfs(tap, "group") == 108
    flags = sysfs(tap, "tun_flags")
    assert flags & IFF_MULTI_QUEUE and flags & IFF_VNET_HDR
    assert sysfs(tap, "mtu") == 1400
    allocated = records(ipam_dir)
    assert len(allocated) == 2
    v6 = next(ip for ip in allocated if ":" in ip)
    adv = advertisement(kube, naming.advertisement_name(vpc, "60", runtime.node))
    assert adv is not None
    assert any(":" in prefix and ipaddress.ip_address(v6) in ipaddress.ip_network(prefix)
               for prefix in adv["spec"]["prefixes"])
    eps = endpoint_slice(kube, slice_name(sandbox.name, vpc, "60", "IPv6"))
    assert eps is not None and eps["endpoints"][0]["addresses"] == [v6]

    runtime.cri.stop_pod_sandbox(sandbox_id)
    assert_withdrawn(kube, sandbox, sandbox_id, vpc, "60", ipam_dir)
    runtime.cri.remove_pod_sandbox(sandbox_id)
    assert_withdrawn(kube, sandbox, sandbox_id, vpc, "60", ipam_dir)
    assert records(tmp_path / "ptp-ipam") == []


def test_tap_as_the_pods_only_network_is_refused_by_containerd_and_rolled_back(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    # containerd requires addresses on eth0 in the result; a tap has none in the sandbox. The
    # CRI then tears the network down again (DEL), which must leave nothing behind.
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    runtime.use_networks(vpc_attach_chain("vpc-vm-only", vpc, "61", ipam_dir,
                                          attachment="tap"))
    sandbox = pod_sandbox(kube, runtime, "cri-vm-only")
    before = set(runtime.cri.list_pod_sandboxes())
    with pytest.raises(CriError) as refused:
        runtime.cri.run_pod_sandbox(sandbox)
    assert set(runtime.cri.list_pod_sandboxes()) == before, "the CRI dropped the sandbox"
    assert "failed to find network info for sandbox" in refused.value.details
    ids = {entry["containerID"] for entry in runtime.verbs(sandbox.name)}
    assert [e["verb"] for e in runtime.verbs(sandbox.name)][:2] == ["ADD", "DEL"]
    assert links_owned_by(ids) == []
    assert_withdrawn(kube, sandbox, next(iter(ids)), vpc, "61", ipam_dir)


def test_broken_config_fails_run_pod_sandbox_with_the_plugins_message_and_leaves_nothing(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    broken = vpc_attach_chain("vpc-broken", vpc, "12", ipam_dir)
    broken["plugins"][0]["vpc"] = "not-base62!"
    runtime.use_networks(broken)
    sandbox = pod_sandbox(kube, runtime, "cri-broken")
    before = set(runtime.cri.list_pod_sandboxes())

    with pytest.raises(CriError) as failed:
        runtime.cri.run_pod_sandbox(sandbox)
    message = ("invalid config key 'vpc': not base62 "
               "(invalid base62 character '-' in 'not-base62!')")
    assert message in failed.value.details, failed.value.details
    assert 'plugin type="vpc-attach"' in failed.value.details
    entries = runtime.verbs(sandbox.name)
    assert entries and entries[0]["verb"] == "ADD" and entries[0]["code"] == 7
    assert links_owned_by({e["containerID"] for e in entries}) == []
    assert not ipam_dir.exists() or records(ipam_dir) == []
    for family in ("IPv6", "IPv4"):
        assert endpoint_slice(kube, slice_name(sandbox.name, vpc, "12", family)) is None

    # containerd's clean-up DEL carries the same broken config, which the plugin rejects too;
    # the runtime then keeps the sandbox (state unknown) until the operator fixes the config.
    leftover = set(runtime.cri.list_pod_sandboxes()) - before
    runtime.use_networks(vpc_attach_chain("vpc-broken", vpc, "12", ipam_dir))
    for sandbox_id in leftover:
        runtime.cri.stop_pod_sandbox(sandbox_id)
        runtime.cri.remove_pod_sandbox(sandbox_id)
    assert set(runtime.cri.list_pod_sandboxes()) == before
    for sandbox_id in leftover:
        assert_withdrawn(kube, sandbox, sandbox_id, vpc, "12", ipam_dir)


def test_denied_endpoint_slice_fails_run_pod_sandbox_and_rolls_back_what_the_add_created(
        kube: Kube, runtime: Runtime, vpc: str, tmp_path: Path) -> None:
    from e2e.harness.cri import CriError
    ipam_dir = tmp_path / "ipam"
    runtime.use_networks(vpc_attach_chain("vpc-denied", vpc, "13", ipam_dir))
    sandbox = pod_sandbox(kube, runtime, "cri-deny")
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
    assert_withdrawn(kube, sandbox, sandbox_id, vpc, "13", ipam_dir)
    assert vrf_instance(kube, naming.vrf_instance_name(vpc, runtime.node)) is None, \
        "this ADD created the VPC's instance, so its rollback deleted it"

