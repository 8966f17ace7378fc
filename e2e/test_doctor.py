"""`vpc-attach doctor` on a simulated node (a network namespace with its own agent, host file,
CNI config, BGPRouter and the real API server): exit 0 on a healthy node, and for each broken
condition exit 1 with the failing check saying what is wrong and how to fix it."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.ipam.plugin import allocator
from cni_plugin.ipam.plugin.config import parse_network
from cni_plugin.ipam.plugin.store import Attachment
from cni_plugin.publish.resources import GROUP, ROUTERS, VERSION
from e2e.harness.cluster.kubeconfig import write_token_kubeconfig
from e2e.harness.doctor import DoctorNode, doctor_node
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES, in_node
from e2e.harness.plugin import Plugin, with_prev
from e2e.harness.publishing import BGP_NS, create_pod
from e2e.harness.rbac import identity_without

pytestmark = [pytest.mark.root, pytest.mark.cluster]
IPAM_BLOCK_PATH = "/apis/vpc-attach.datum.net/v1alpha1/ipamblocks"
# Every check that reports ok on the healthy node (besides kernel.vrf and routes.remote): each
# must report, so that "every check ok" cannot pass because one of them never ran.
HEALTHY_NODE_CHECKS = {
    "agent.health", "agent.socket", "api.rbac", "api.server", "bgp.router", "cni.conflist",
    "datapath.dropped", "datapath.galactic", "datapath.protection", "ipam.claims", "kernel.tun",
    "leftovers.ipam", "leftovers.links", "migration.targets", "policy.agent", "policy.kernel",
    "policy.mode", "policy.unenforced", "settings.agentSocket",
    "settings.ipamDataRoot", "settings.kubeconfig", "settings.lockDir", "settings.logBackups",
    "settings.logFile", "settings.logLevel", "settings.logMaxBytes", "settings.namespace",
    "settings.nodeName", "settings.tenancy", "settings.timeoutSeconds", "state.formats",
    "tenancy.crd", "tenancy.mode"}


@pytest.fixture
def node(kube: Kube, cluster: Any, cni_bin: Path, tmp_path: Path) -> Iterator[DoctorNode]:
    """A healthy node: its agent ready, its network valid, its router in place."""
    with doctor_node(kube, cluster, cni_bin, tmp_path) as made:
        yield made


def test_a_healthy_node_passes_with_its_attachment_counted(
        node: DoctorNode, kube: Kube, tmp_path: Path) -> None:
    pod = f"doc-pod-{secrets.token_hex(3)}"
    uid = create_pod(kube, pod, node.name)
    plugin = Plugin(node.cni_bin, tmp_path / "locks", prefix=in_node(node.netns),
                    environ={"VPC_ATTACH_HOST_CONFIG": str(node.host_file),
                             "VPC_ATTACH_AGENT_SOCKET": str(node.agent.socket)})
    conf = {"cniVersion": "1.1.0", "name": "vpc-jU", **node.stanza}
    args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
            f"K8S_POD_UID={uid}")
    with temporary_netns("vpa-docpod") as pod_netns:
        result = plugin.ok("ADD", conf, container_id="doc-ctr", netns=pod_netns, CNI_ARGS=args)
        try:
            report = node.report()
            status, found = report.returncode, report.by_check
            assert status == 0, [f for fs in found.values() for f in fs if f["status"] != "ok"]
            statuses = {check: {f["status"] for f in findings}
                        for check, findings in found.items()}
            vrf = statuses.pop("kernel.vrf")
            assert vrf in ({"ok"}, {"warn"}), "isolation 'table' does not need VRF"
            assert statuses.pop("routes.remote") == {"warn"}, "a table-mode network publishes"
            assert "networks 'vpc-jU' use isolation 'table'" in \
                found["routes.remote"][0]["detail"]
            assert set(statuses) >= HEALTHY_NODE_CHECKS, "a check did not report"
            assert all(s == {"ok"} for s in statuses.values()), statuses
            assert "1 vpc-attach-ipam allocation(s), each with its attachment" in \
                found["leftovers.ipam"][0]["detail"]
            assert found["settings.nodeName"][0]["detail"] == \
                f"{node.name} (host file {node.host_file})"
            assert f"{node.router} targets node {node.name!r}" in \
                found["bgp.router"][0]["detail"]
            assert found["tenancy.mode"][0]["detail"] == "enforce (the default with a kubeconfig)"
            assert "VPCBinding CRD installed" in found["tenancy.crd"][0]["detail"]
            table = node.doctor()
            assert table.returncode == 0 and table.stdout.endswith("no problems\n")
            print("\n" + table.stdout)  # for the operations guide and the issue
        finally:
            plugin.ok("DEL", with_prev(conf, result), container_id="doc-ctr", netns=pod_netns,
                      CNI_ARGS=args)


def _no_router(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    kube.delete(ROUTERS.path(BGP_NS, node.router))


def _two_routers(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    kube.create(ROUTERS.path(BGP_NS), {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPRouter",
        "metadata": {"name": f"{node.router}-second"},
        "spec": {"targetRef": {"kind": "Node", "name": node.name}, "localASN": 65001,
                 "routerID": "192.0.2.2", "roles": ["tenant"],
                 "addressFamilies": [{"afi": "l2vpn", "safi": "evpn"}]}})


def _api_unreachable(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    nowhere = write_token_kubeconfig(node.tmp / "nowhere.kubeconfig", "https://127.0.0.1:1",
                                     cluster.ca_file, "nobody", "token")
    node.write_host(kubeconfig=str(nowhere))


def _agent_down(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    node.agent.stop()


def _retired_link(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    name = f"vpz{secrets.token_hex(6)}"
    run_ip("-n", node.netns, "link", "add", name, "type", "veth", "peer", "name", f"p{name[3:]}")
    run_ip("-n", node.netns, "link", "set", name, "alias", "vpc-attach-retired/dead/eth0")


def _ipam_leftover(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    conf = parse_network({"cniVersion": "1.1.0", "name": "vpc-jU", **node.stanza})
    allocator.allocate_all(conf, Attachment("ghost-container-without-netns", "eth0"))


def _invalid_conflist(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    node.write_conflist("vpc-broken", {**node.stanza, "vpcattachment": "2", "mtuu": 1400})


def _broken_host_file(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    node.host_file.write_text('{"nodeName": ')


def _newer_policy_record(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    """A policy record as a newer release writes one (SPEC §18): after a rollback past a
    format change."""
    records = node.tmp / "locks" / "policy"
    records.mkdir(parents=True, exist_ok=True)
    (records / "newer-ctr-net1.json").write_text(json.dumps({"formatVersion": 2}))


BROKEN: dict[str, tuple[Callable[[DoctorNode, Kube, Any], None], str, str]] = {
    "no-router": (_no_router, "bgp.router", "0 BGPRouters target node"),
    "two-routers": (_two_routers, "bgp.router", "2 BGPRouters target node"),
    "api-unreachable": (_api_unreachable, "api.server", "Kubernetes API unavailable"),
    "agent-down": (_agent_down, "agent.socket", "no agent answers"),
    "retired-link": (_retired_link, "leftovers.links", "1 retired link(s) not deleted: vpz"),
    "ipam-leftover": (_ipam_leftover, "leftovers.ipam", "ghost-contai/eth0"),
    "invalid-conflist": (_invalid_conflist, "cni.conflist", "unknown config key 'mtuu'"),
    "broken-host-file": (_broken_host_file, "settings.hostFile", "cannot read host settings"),
    "newer-policy-record": (_newer_policy_record, "state.formats",
                            "/policy/newer-ctr-net1.json"),
}


def test_a_vrf_network_fails_the_kernel_check_where_the_kernel_has_no_vrf(
        node: DoctorNode) -> None:
    """A network with `isolation: vrf`: on a kernel without VRF devices (this project's CI
    machine) kernel.vrf fails, names the network and says how to fix it; on a kernel with
    them the same network passes it. Never skipped: each kernel gets the answer it calls for."""
    from cni_plugin.kernel import isolation, netns
    with netns.open_netlink(None, 5.0) as rtnl:
        has_vrf = isolation.vrf_supported(rtnl)
    node.write_conflist("vpc-vrf", {**node.stanza, "vpcattachment": "3", "isolation": "vrf"})
    report = node.report()
    [finding] = report.by_check["kernel.vrf"]
    if has_vrf:
        assert finding["status"] == "ok", finding
        return
    assert report.returncode == 1
    assert finding["status"] == "fail" and "use isolation 'vrf'" in finding["detail"], finding
    assert "'vpc-vrf'" in finding["detail"] and "isolation" in finding["fix"], finding


@pytest.mark.parametrize("condition", sorted(BROKEN))
def test_each_broken_condition_fails_its_check_with_a_fix(
        node: DoctorNode, kube: Kube, cluster: Any, condition: str) -> None:
    breaker, check, fragment = BROKEN[condition]
    breaker(node, kube, cluster)
    report = node.report()
    status, found = report.returncode, report.by_check
    assert status == 1
    failed = [f for f in found.get(check, []) if f["status"] == "fail"]
    assert failed and fragment in failed[0]["detail"], found.get(check)
    assert all(f["fix"] for findings in found.values() for f in findings
               if f["status"] == "fail"), "every problem says how to fix it"


def test_missing_rbac_permissions_are_named(node: DoctorNode, kube: Kube, cluster: Any,
                                            tmp_path: Path) -> None:
    with identity_without(kube, cluster, tmp_path, {("events.k8s.io", "events")}) as kubeconfig:
        node.write_host(kubeconfig=str(kubeconfig))
        report = node.report()
        status, found = report.returncode, report.by_check
    assert status == 1
    [rbac] = found["api.rbac"]
    assert rbac["status"] == "fail"
    assert "create events.events.k8s.io" in rbac["detail"]
    assert "patch events.events.k8s.io" in rbac["detail"]
    assert rbac["detail"].startswith("missing 2 of ")
    assert report.statuses("api.server") == ["ok"], "the API server itself answered"


def test_the_nodes_cluster_ipam_blocks_are_shown_and_checked_against_the_api(
        node: DoctorNode, kube: Kube, tmp_path: Path) -> None:
    """A cluster-scope pool's block is shown with its use; an IPAMBlock the API lost (the
    node's Node deleted and registered again) fails: another node could claim its addresses."""
    network = f"vpc-blk-{secrets.token_hex(2)}"
    stanza = {**node.stanza, "publish": {"bgp": False, "endpointSlice": False},
              "ipam": {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / "ipam"),
                       "scope": "cluster", "ipv4_subnet": "172.29.0.0/24"}}
    node.write_conflist(network, stanza)
    plugin = Plugin(node.cni_bin, tmp_path / "locks", prefix=in_node(node.netns),
                    environ={"VPC_ATTACH_HOST_CONFIG": str(node.host_file),
                             "VPC_ATTACH_AGENT_SOCKET": str(node.agent.socket)})
    conf = {"cniVersion": "1.1.0", "name": network, **stanza}
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name}})
    try:
        with temporary_netns("vpa-docblk") as pod_netns:
            args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=blk-pod"
            result = plugin.ok("ADD", conf, container_id="blk-ctr", netns=pod_netns,
                               CNI_ARGS=args)
            try:
                [block] = kube.list(IPAM_BLOCK_PATH, fields=f"spec.node={node.name}")
                cidr = block["spec"]["cidr"]
                report = node.report()
                found = report.by_check
                [shown] = found["ipam.blocks"]
                assert shown["status"] == "ok"
                assert f"{cidr} 1/16 used ({block['metadata']['name']})" in shown["detail"]
                assert report.statuses("ipam.blocks.api") == ["ok"], "the API agrees"
                kube.delete(f"{IPAM_BLOCK_PATH}/{block['metadata']['name']}")
                report = node.report()
                status, found = report.returncode, report.by_check
                assert status == 1
                [lost] = [f for f in found["ipam.blocks.api"] if f["status"] == "fail"]
                assert lost["detail"] == f"1 block(s) this node allocates from have no " \
                    f"IPAMBlock naming it: {block['metadata']['name']}" and lost["fix"]
            finally:
                plugin.ok("DEL", with_prev(conf, result), container_id="blk-ctr",
                          netns=pod_netns, CNI_ARGS=args)
    finally:
        kube.delete(f"{NODES}/{node.name}")
