"""`vpc-attach doctor` on a simulated node (a network namespace with its own agent, host file,
CNI config, BGPRouter and the real API server): exit 0 on a healthy node, and for each broken
condition exit 1 with the failing check saying what is wrong and how to fix it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.ipam.plugin import allocator
from cni_plugin.ipam.plugin.config import parse_network
from cni_plugin.ipam.plugin.store import Attachment
from cni_plugin.kernel.netns import entered
from cni_plugin.publish.resources import GROUP, ROUTERS, VERSION
from e2e.harness.agentproc import AgentProcess
from e2e.harness.cluster.kubeconfig import write_token_kubeconfig
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES, api_port, in_node, node_namespace
from e2e.harness.plugin import Plugin, with_prev
from e2e.harness.publishing import BGP_NS, create_pod, create_router
from e2e.harness.rbac import identity_without
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster]
IPAM_BLOCK_PATH = "/apis/vpc-attach.datum.net/v1alpha1/ipamblocks"
METRICS = "127.0.0.1:9471"  # the default: free inside the node's own namespace
DOCTOR_TIMEOUT_S = 120


@dataclass
class DoctorNode:
    """A node for the doctor: netns, name, router, host file, CNI config and a running agent."""

    netns: str
    name: str
    router: str
    tmp: Path
    cni_bin: Path
    host: dict[str, Any]
    stanza: dict[str, Any]
    agent: AgentProcess

    @property
    def host_file(self) -> Path:
        return self.tmp / "host.json"

    @property
    def conf_dir(self) -> Path:
        return self.tmp / "net.d"

    def write_host(self, **changes: Any) -> None:
        self.host_file.write_text(json.dumps({**self.host, **changes}))

    def write_conflist(self, name: str, stanza: dict[str, Any]) -> None:
        self.conf_dir.mkdir(exist_ok=True)
        (self.conf_dir / f"{name}.conflist").write_text(json.dumps(
            {"cniVersion": "1.1.0", "name": name, "plugins": [stanza, {"type": "tuning"}]}))

    def doctor(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`vpc-attach doctor` run inside the node, as an operator runs it there."""
        env = {**os.environ, "VPC_ATTACH_HOST_CONFIG": str(self.host_file),
               "VPC_ATTACH_METRICS_ADDRESS": METRICS}
        return subprocess.run(
            [*in_node(self.netns), str(self.cni_bin / "vpc-attach"), "doctor",
             "--cni-conf-dir", str(self.conf_dir), "--cni-bin-dir", str(self.cni_bin),
             "--ipam-data-dir", str(self.tmp / "ipam"), *args],
            env=env, capture_output=True, text=True, timeout=DOCTOR_TIMEOUT_S, check=False)

    def report(self) -> tuple[int, dict[str, list[dict[str, str]]]]:
        """Exit status and the --json findings by check name."""
        done = self.doctor("--json")
        assert done.stdout.strip(), done.stderr
        report = json.loads(done.stdout)
        assert report["ok"] == (done.returncode == 0)
        by_check: dict[str, list[dict[str, str]]] = {}
        for finding in report["checks"]:
            by_check.setdefault(finding["check"], []).append(finding)
        return done.returncode, by_check

    def ready(self) -> bool:
        """Whether the node's agent answers /readyz with 200 (asked inside the node)."""
        host, port = METRICS.split(":")
        with entered(f"/var/run/netns/{self.netns}"):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                conn.request("GET", "/readyz")
                return conn.getresponse().status == 200
            finally:
                conn.close()


@pytest.fixture
def node(kube: Kube, cluster: Any, cni_bin: Path, tmp_path: Path) -> Iterator[DoctorNode]:
    """A healthy node: its agent ready, its network valid, its router in place."""
    with node_namespace(api_port(cluster.server)) as netns:
        name = f"doc-{secrets.token_hex(3)}"
        router = create_router(kube, name)
        (tmp_path / "agent").mkdir()
        host = {"nodeName": name, "kubeconfig": str(cluster.plugin_kubeconfig),
                "agentSocket": str(tmp_path / "agent" / "agent.sock"),
                "lockDir": str(tmp_path / "locks"), "logFile": str(tmp_path / "vpc-attach.log"),
                "ipamDataRoot": str(tmp_path)}
        stanza = {"type": "vpc-attach", "vpc": "jU", "vpcattachment": "1", "isolation": "table",
                  "ipam": {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / "ipam"),
                           "ipv6_subnet": "fd00:d0c::/48"}}
        agent = AgentProcess(tmp_path / "agent", prefix=in_node(netns), metrics=METRICS,
                             env={"VPC_ATTACH_HOST_CONFIG": str(tmp_path / "host.json")})
        doctor_node = DoctorNode(netns, name, router, tmp_path, cni_bin, host, stanza, agent)
        doctor_node.write_host()
        doctor_node.write_conflist("vpc-jU", stanza)
        with agent, bound(kube, "jU"):
            wait_until("the node's agent to be ready", doctor_node.ready, 60)
            try:
                yield doctor_node
            finally:
                kube.delete(ROUTERS.path(BGP_NS, router))
                kube.delete(ROUTERS.path(BGP_NS, f"{router}-second"))


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
            status, found = node.report()
            assert status == 0, [f for fs in found.values() for f in fs if f["status"] != "ok"]
            statuses = {check: {f["status"] for f in findings}
                        for check, findings in found.items()}
            vrf = statuses.pop("kernel.vrf")
            assert vrf in ({"ok"}, {"warn"}), "isolation 'table' does not need VRF"
            assert statuses.pop("routes.remote") == {"warn"}, "a table-mode network publishes"
            assert "networks 'vpc-jU' use isolation 'table'" in \
                found["routes.remote"][0]["detail"]
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


def _vrf_network_without_vrf(node: DoctorNode, kube: Kube, cluster: Any) -> None:
    from cni_plugin.kernel import isolation, netns
    with netns.open_netlink(None, 5.0) as rtnl:
        if isolation.vrf_supported(rtnl):
            pytest.skip("this kernel has VRF: a VRF network is fine here")
    node.write_conflist("vpc-vrf", {**node.stanza, "vpcattachment": "3", "isolation": "vrf"})


BROKEN: dict[str, tuple[Callable[[DoctorNode, Kube, Any], None], str, str]] = {
    "no-router": (_no_router, "bgp.router", "0 BGPRouters target node"),
    "two-routers": (_two_routers, "bgp.router", "2 BGPRouters target node"),
    "api-unreachable": (_api_unreachable, "api.server", "Kubernetes API unavailable"),
    "agent-down": (_agent_down, "agent.socket", "no agent answers"),
    "retired-link": (_retired_link, "leftovers.links", "1 retired link(s) not deleted: vpz"),
    "ipam-leftover": (_ipam_leftover, "leftovers.ipam", "ghost-contai/eth0"),
    "invalid-conflist": (_invalid_conflist, "cni.conflist", "unknown config key 'mtuu'"),
    "broken-host-file": (_broken_host_file, "settings.hostFile", "cannot read host settings"),
    "vrf-needed": (_vrf_network_without_vrf, "kernel.vrf", "use isolation 'vrf'"),
}


@pytest.mark.parametrize("condition", sorted(BROKEN))
def test_each_broken_condition_fails_its_check_with_a_fix(
        node: DoctorNode, kube: Kube, cluster: Any, condition: str) -> None:
    breaker, check, fragment = BROKEN[condition]
    breaker(node, kube, cluster)
    status, found = node.report()
    assert status == 1
    failed = [f for f in found.get(check, []) if f["status"] == "fail"]
    assert failed and fragment in failed[0]["detail"], found.get(check)
    assert all(f["fix"] for findings in found.values() for f in findings
               if f["status"] == "fail"), "every problem says how to fix it"


def test_missing_rbac_permissions_are_named(node: DoctorNode, kube: Kube, cluster: Any,
                                            tmp_path: Path) -> None:
    with identity_without(kube, cluster, tmp_path, {("events.k8s.io", "events")}) as kubeconfig:
        node.write_host(kubeconfig=str(kubeconfig))
        status, found = node.report()
    assert status == 1
    [rbac] = found["api.rbac"]
    assert rbac["status"] == "fail"
    assert "create events.events.k8s.io" in rbac["detail"]
    assert "patch events.events.k8s.io" in rbac["detail"]
    assert rbac["detail"].startswith("missing 2 of ")
    with contextlib.suppress(KeyError):
        assert found["api.server"][0]["status"] == "ok"


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
                _, found = node.report()
                [shown] = found["ipam.blocks"]
                assert shown["status"] == "ok"
                assert f"{cidr} 1/16 used ({block['metadata']['name']})" in shown["detail"]
                assert all(f["status"] == "ok" for f in found.get("ipam.blocks.api", []))
                kube.delete(f"{IPAM_BLOCK_PATH}/{block['metadata']['name']}")
                status, found = node.report()
                assert status == 1
                [lost] = [f for f in found["ipam.blocks.api"] if f["status"] == "fail"]
                assert lost["detail"] == f"1 block(s) this node allocates from have no " \
                    f"IPAMBlock naming it: {block['metadata']['name']}" and lost["fix"]
            finally:
                plugin.ok("DEL", with_prev(conf, result), container_id="blk-ctr",
                          netns=pod_netns, CNI_ARGS=args)
    finally:
        kube.delete(f"{NODES}/{node.name}")
