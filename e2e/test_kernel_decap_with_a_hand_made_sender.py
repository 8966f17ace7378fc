"""On a node without galactic's datapath, the kernel answers the SID the node publishes for a
VPC: seg6local End.DT46 into the VPC's VRF, made by ADD, checked by CHECK, shown by doctor —
and SRv6 packets sent to it reach the Pod.

The sender is hand-made: another netns with kernel `encap seg6` routes to the SID. It stands
in for no galactic component (galactic-router writes its routes into galactic's eBPF map, never
into the kernel: SPEC §15); any SRv6 source would do. galactic's own path between nodes is
e2e/test_galactic_datapath.py's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.doctor.kernel import srv6_decap
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.pace import after_answer_bound
from e2e.harness.plugin import Plugin, base_conf, host_local, with_prev
from e2e.harness.publishing import Node, create_pod, make_node, vrf_instance
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.fullkernel, pytest.mark.both_paths]
LOCATOR = "2001:db8:ff01::/48"
NODE_ID = 1
UNDERLAY_HOST, UNDERLAY_REMOTE, REMOTE_V4 = "fd00:5e6::1", "fd00:5e6::2", "192.0.2.62"


@pytest.fixture
def node(kube: Kube, cluster: Any, plugin: Plugin) -> Node:
    """This node, its router with an SRv6 locator and node ID."""
    return make_node(kube, cluster, plugin, locator=LOCATOR, node_id=NODE_ID)


@pytest.fixture
def remote() -> Iterator[str]:
    """Another "node" joined to this one by an IPv6 veth underlay (its netns name)."""
    with temporary_netns("vpa-remote") as path:
        name = os.path.basename(path)
        run_ip("link", "add", "vpa-ul-h", "type", "veth", "peer", "name", "ul0", "netns", name)
        try:
            run_ip("addr", "add", f"{UNDERLAY_HOST}/64", "dev", "vpa-ul-h", "nodad")
            run_ip("link", "set", "vpa-ul-h", "up")
            run_ip("-n", name, "addr", "add", f"{UNDERLAY_REMOTE}/64", "dev", "ul0", "nodad")
            run_ip("-n", name, "addr", "add", f"{REMOTE_V4}/32", "dev", "ul0")
            run_ip("-n", name, "link", "set", "ul0", "up")
            run_ip("-n", name, "link", "set", "lo", "up")
            yield name
        finally:
            run_ip("link", "del", "vpa-ul-h", check=False)


def _conf(vpc: str, att: str, tmp_path: Path) -> dict[str, Any]:
    conf = base_conf(vpc, att, isolation="vrf", ipam=host_local(
        tmp_path / "ipam", "fd00:e6::/64", "10.206.0.0/24"))
    conf["publish"] = {"bgp": True, "endpointSlice": False}
    return conf


def _sid_route(sid: str) -> str:
    return run_ip("-6", "route", "show", "table", "main", f"{sid}/128").strip()


@pytest.mark.once_through_agent
def test_the_vpc_sid_decapsulates_into_its_vrf_and_reaches_the_pod(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path, remote: str) -> None:
    uid = create_pod(kube, "srv6-a", node.name)
    args = node.cni_args("srv6-a", uid)
    conf = _conf(vpc, "1", tmp_path)
    result = node.plugin.ok("ADD", conf, container_id="ctr-a", netns=netns, CNI_ARGS=args)
    instance = vrf_instance(kube, naming.vrf_instance_name(vpc, node.name))
    assert instance is not None
    sid = naming.srv6_sid(LOCATOR, NODE_ID, instance["spec"]["vrfID"])
    vrf = naming.vrf_name(vpc)
    table = run_ip("-d", "link", "show", vrf).split("vrf table ")[1].split()[0]
    route = _sid_route(sid)
    print(f"\n$ ip -6 route show {sid}\n{route}")  # for the docs and the issue
    assert route.startswith(f"{sid} ") and f"dev {vrf}" in route, route
    assert f"encap seg6local action End.DT46 vrftable {table}" in route, route
    assert node.plugin.call("CHECK", with_prev(conf, result), container_id="ctr-a",
                            netns=netns, CNI_ARGS=args).status == 0
    assert node.plugin.call("STATUS", conf).status == 0, "this kernel does End.DT46"
    shown = srv6_decap()  # doctor's kernel.srv6 line
    assert shown.status == "ok" and f"{sid} -> table {table}" in shown.detail, shown

    pod_v4, pod_v6 = (ip["address"].split("/")[0] for ip in
                      sorted(result["ips"], key=lambda ip: ":" in ip["address"]))
    # The hand-made sender: the Pod's prefixes encapsulated to the SID by the kernel. The
    # Pod's answers leave the VPC's table through the underlay (a test-only leak), so they
    # prove the request was decapsulated into the VRF and delivered.
    run_ip("-n", remote, "-6", "route", "add", LOCATOR, "via", UNDERLAY_HOST)
    for dst in (f"{pod_v6}/128", f"{pod_v4}/32"):
        run_ip("-n", remote, "route", "add", dst, "encap", "seg6", "mode", "encap", "segs",
               sid, "dev", "ul0")
    run_ip("-6", "route", "add", f"{UNDERLAY_REMOTE}/128", "dev", "vpa-ul-h", "table", table)
    run_ip("-4", "route", "add", f"{REMOTE_V4}/32", "dev", "vpa-ul-h", "table", table)
    for source, target in ((UNDERLAY_REMOTE, pod_v6), (REMOTE_V4, pod_v4)):
        ping = subprocess.run(["ip", "netns", "exec", remote, "ping", "-c", "2", "-W", "5",
                               "-I", source, target], capture_output=True, text=True,
                              timeout=60)
        assert ping.returncode == 0, f"SRv6 to {sid} -> {target}: {ping.stdout}{ping.stderr}"

    run_ip("-6", "route", "del", f"{sid}/128", "table", "main")
    answer = node.plugin.call("CHECK", with_prev(conf, result), container_id="ctr-a",
                              netns=netns, CNI_ARGS=args)
    assert answer.code == 103 and f"SRv6 SID {sid} has no End.DT46 route" in \
        answer.body["details"], answer.stdout
    node.plugin.ok("DEL", with_prev(conf, result), container_id="ctr-a", netns=netns,
                   CNI_ARGS=args)
    node.plugin.ok("ADD", conf, container_id="ctr-a", netns=netns, CNI_ARGS=args)
    assert "End.DT46 vrftable" in _sid_route(sid), "the next ADD answers the SID again"


def test_the_sid_stays_while_another_attachment_of_the_vpc_is_on_the_node_and_goes_with_the_last(
        kube: Kube, node: Node, netns: str, vpc: str, tmp_path: Path) -> None:
    uids = {pod: create_pod(kube, pod, node.name) for pod in ("srv6-b", "srv6-c")}
    first = _conf(vpc, "2", tmp_path)
    node.plugin.ok("ADD", first, container_id="ctr-b", netns=netns,
                   CNI_ARGS=node.cni_args("srv6-b", uids["srv6-b"]))
    with temporary_netns("vpa-srv6c") as second_netns:
        node.plugin.ok("ADD", _conf(vpc, "3", tmp_path), container_id="ctr-c",
                       netns=second_netns, CNI_ARGS=node.cni_args("srv6-c", uids["srv6-c"]))
        instance = vrf_instance(kube, naming.vrf_instance_name(vpc, node.name))
        assert instance is not None
        sid = naming.srv6_sid(LOCATOR, NODE_ID, instance["spec"]["vrfID"])
        assert len(_sid_route(sid).splitlines()) == 1, "one route per SID, however many Pods"
        node.plugin.ok("DEL", first, container_id="ctr-b", netns=netns,
                       CNI_ARGS=node.cni_args("srv6-b", uids["srv6-b"]))
        assert "End.DT46" in _sid_route(sid), "another attachment of the VPC is still here"
        node.plugin.ok("DEL", _conf(vpc, "3", tmp_path), container_id="ctr-c",
                       netns=second_netns, CNI_ARGS=node.cni_args("srv6-c", uids["srv6-c"]))
    # The last attachment's DEL removes the VPC's VRF (unused per-VPC state), the SID with it:
    # at once in-process, right after the answer through the agent (it deletes retired links).
    wait_until("the SID's route gone with the VPC's last attachment",
               lambda: _sid_route(sid) == "", after_answer_bound())
    assert naming.vrf_name(vpc) not in run_ip("-br", "link", "show"), "the VRF went too"
