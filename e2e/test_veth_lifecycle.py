"""veth attachments on real namespaces, IPAM delegated to the reference host-local plugin."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cni_plugin.core import naming
from e2e.harness.kernel import links_in, run_ip, temporary_netns, vpc_table_of
from e2e.harness.pace import after_answer_bound
from e2e.harness.plugin import Plugin, base_conf, host_local, host_local_reservations, with_prev
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.both_paths]


def _conf(vpc: str, tmp_path: Path, **kw: object) -> dict[str, object]:
    return base_conf(vpc, "7", mtu=1450,
                     ipam=host_local(tmp_path / "ipam", "fd00:71::/64", "10.71.0.0/24"), **kw)


def test_veth_add_builds_both_sides_and_the_vpc_table(plugin: Plugin, netns: str, vpc: str,
                                                       tmp_path: Path, isolation: str) -> None:
    conf = _conf(vpc, tmp_path, isolation=isolation)
    result = plugin.ok("ADD", conf, container_id="pod-a", netns=netns)
    host = naming.host_link_name(vpc, "7")
    ns = os.path.basename(netns)

    assert result["cniVersion"] == "1.1.0"
    host_iface, pod_iface = result["interfaces"]
    assert host_iface["name"] == host and "sandbox" not in host_iface
    assert pod_iface == {**pod_iface, "name": "eth0", "sandbox": netns, "mtu": 1450}
    assert {ip["interface"] for ip in result["ips"]} == {1}
    addrs = sorted(ip["address"] for ip in result["ips"])
    assert addrs == ["10.71.0.2/32", "fd00:71::2/64"]

    pod_addr = run_ip("-n", ns, "addr", "show", "eth0")
    assert "inet 10.71.0.2/32" in pod_addr and "inet6 fd00:71::2/64" in pod_addr
    assert "mtu 1450" in pod_addr and pod_iface["mac"] in pod_addr
    assert "default via 10.71.0.1 dev eth0" in run_ip("-n", ns, "-4", "route")
    assert "default via fd00:71::1 dev eth0" in run_ip("-n", ns, "-6", "route")

    host_addr = run_ip("addr", "show", host)
    assert "inet 10.71.0.1/32" in host_addr and "inet6 fd00:71::1/128" in host_addr
    assert "alias vpc-attach/pod-a/eth0" in run_ip("-d", "link", "show", host)
    table = vpc_table_of(host, isolation)
    assert "10.71.0.2 dev " + host in run_ip("-4", "route", "show", "table", table)
    assert "fd00:71::2 dev " + host in run_ip("-6", "route", "show", "table", table)
    neigh = run_ip("neigh", "show", "dev", host)
    assert f"10.71.0.2 lladdr {pod_iface['mac']} PERMANENT" in neigh
    assert f"fd00:71::2 lladdr {pod_iface['mac']} PERMANENT" in neigh
    for key, want in ((f"ipv4/conf/{host}/rp_filter", "0"), (f"ipv4/conf/{host}/proxy_arp", "1"),
                      (f"ipv4/conf/{host}/forwarding", "1"), (f"ipv6/conf/{host}/proxy_ndp", "1"),
                      (f"ipv6/conf/{host}/forwarding", "1")):
        assert Path(f"/proc/sys/net/{key}").read_text().strip() == want, key



def test_two_pods_of_one_vpc_reach_each_other_through_the_vpc_table(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path, isolation: str) -> None:
    ipam = host_local(tmp_path / "ipam", "fd00:74::/64", "10.74.0.0/24")
    first = plugin.ok("ADD", base_conf(vpc, "1", ipam=ipam, isolation=isolation),
                      container_id="pod-1", netns=netns)
    os.system("ip netns add vpa-peer-test")
    try:
        second = plugin.ok("ADD", base_conf(vpc, "2", ipam=ipam, isolation=isolation),
                           container_id="pod-2", netns="/var/run/netns/vpa-peer-test")
        peer_v4, peer_v6 = (ip["address"].split("/")[0] for ip in
                            sorted(second["ips"], key=lambda ip: ":" in ip["address"]))
        ns = os.path.basename(netns)
        # Real traffic: pod-1 -> its gateway -> iif rule or VRF -> VPC table -> pod-2, and back.
        assert os.system(f"ip netns exec {ns} ping -c1 -W2 {peer_v4} >/dev/null") == 0
        assert os.system(f"ip netns exec {ns} ping -c1 -W2 {peer_v6} >/dev/null") == 0
        assert first["ips"] != second["ips"]
    finally:
        os.system("ip netns del vpa-peer-test")


def test_veth_life_cycle_check_drift_and_idempotent_del(plugin: Plugin, netns: str, vpc: str,
                                                        tmp_path: Path, isolation: str) -> None:
    conf = _conf(vpc, tmp_path, isolation=isolation)
    ns = os.path.basename(netns)
    result = plugin.ok("ADD", conf, container_id="pod-b", netns=netns)
    checked = with_prev(conf, result)
    assert plugin.call("CHECK", checked, container_id="pod-b", netns=netns).status == 0

    run_ip("-n", ns, "addr", "del", "10.71.0.2/32", "dev", "eth0")
    answer = plugin.call("CHECK", checked, container_id="pod-b", netns=netns)
    assert answer.status != 0 and answer.code == 103
    assert "IPv4 address 10.71.0.2/32" in answer.body["details"]

    run_ip("-n", ns, "link", "set", "eth0", "mtu", "1400")
    run_ip("-n", ns, "link", "set", "eth0", "address", "02:00:00:00:00:99")
    run_ip("-n", ns, "-6", "route", "del", "default")
    details = plugin.call("CHECK", checked, container_id="pod-b", netns=netns).body["details"]
    assert "MTU 1400" in details and "02:00:00:00:00:99" in details
    assert "route ::/0 via fd00:71::1" in details
    run_ip("-n", ns, "link", "set", "eth0", "down")
    assert "is down" in plugin.call("CHECK", checked, container_id="pod-b",
                                    netns=netns).body["details"]
    host = naming.host_link_name(vpc, "7")
    if isolation == "vrf":
        run_ip("link", "set", host, "nomaster")
        assert f"host link '{host}' is not enslaved to its VRF" in plugin.call(
            "CHECK", checked, container_id="pod-b", netns=netns).body["details"]
    else:
        run_ip("link", "set", host, "group", "default")  # its packets lose the VPC's mark
        assert f"host link '{host}' has device group 0x0, not its VPC's mark" in plugin.call(
            "CHECK", checked, container_id="pod-b", netns=netns).body["details"]

    assert host_local_reservations(tmp_path / "ipam", conf["name"])  # type: ignore[arg-type]
    plugin.ok("DEL", checked, container_id="pod-b", netns=netns)
    assert naming.host_link_name(vpc, "7") not in links_in()
    assert links_in(netns) == {"lo"}
    assert host_local_reservations(tmp_path / "ipam", conf["name"]) == []  # type: ignore[arg-type]
    plugin.ok("DEL", checked, container_id="pod-b", netns=netns)  # repeated
    plugin.ok("DEL", conf, container_id="pod-b", netns="")  # empty netns, no prevResult


def test_del_succeeds_when_the_netns_is_gone(plugin: Plugin, vpc: str, tmp_path: Path,
                                             isolation: str) -> None:
    os.system("ip netns add vpa-gone-test")
    conf = _conf(vpc, tmp_path, isolation=isolation)
    result = plugin.ok("ADD", conf, container_id="pod-g", netns="/var/run/netns/vpa-gone-test")
    os.system("ip netns del vpa-gone-test")
    plugin.ok("DEL", with_prev(conf, result), container_id="pod-g",
              netns="/var/run/netns/vpa-gone-test")
    assert naming.host_link_name(vpc, "7") not in links_in()


def test_add_answers_in_the_requested_older_version(plugin: Plugin, netns: str, vpc: str,
                                                    tmp_path: Path) -> None:
    conf = _conf(vpc, tmp_path, cniVersion="0.4.0")
    result = plugin.ok("ADD", conf, container_id="pod-v", netns=netns)
    assert result["cniVersion"] == "0.4.0"
    assert {ip["version"] for ip in result["ips"]} == {"4", "6"}
    assert all("mtu" not in iface for iface in result["interfaces"])
    assert plugin.call("CHECK", with_prev(conf, result), container_id="pod-v",
                       netns=netns).status == 0


def test_repeated_add_of_the_same_container_converges(plugin: Plugin, netns: str, vpc: str,
                                                      tmp_path: Path, isolation: str) -> None:
    conf = base_conf(vpc, "8", isolation=isolation, ipam={"type": "static", "addresses": [
        {"address": "fd00:72::5/64", "gateway": "fd00:72::1"}]})
    first = plugin.ok("ADD", conf, container_id="pod-r", netns=netns)
    second = plugin.ok("ADD", conf, container_id="pod-r", netns=netns)
    assert first["ips"] == second["ips"] and first["routes"] == second["routes"]
    assert plugin.call("CHECK", with_prev(conf, second), container_id="pod-r",
                       netns=netns).status == 0
    # Exactly one rule per family (table) or none and one VRF master (vrf): nothing doubled.
    vpc_table_of(naming.host_link_name(vpc, "8"), isolation)


def test_second_container_cannot_take_over_and_late_del_keeps_new_link(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path, isolation: str) -> None:
    conf = base_conf(vpc, "9", isolation=isolation, ipam={"type": "static", "addresses": [
        {"address": "fd00:73::5/64", "gateway": "fd00:73::1"}]})
    os.system("ip netns add vpa-second-test")
    second_ns = "/var/run/netns/vpa-second-test"
    try:
        plugin.ok("ADD", conf, container_id="old-pod", netns=netns)
        refused = plugin.call("ADD", conf, container_id="new-pod", netns=second_ns)
        assert refused.code == 11 and "old-pod" in refused.body["msg"]
        assert links_in(second_ns) == {"lo"}

        plugin.ok("DEL", conf, container_id="old-pod", netns=netns)
        new = plugin.ok("ADD", conf, container_id="new-pod", netns=second_ns)
        plugin.ok("DEL", conf, container_id="old-pod", netns=netns)  # a late, repeated DEL
        assert naming.host_link_name(vpc, "9") in links_in()
        assert "eth0" in links_in(second_ns)
        assert plugin.call("CHECK", with_prev(conf, new), container_id="new-pod",
                           netns=second_ns).status == 0
    finally:
        os.system("ip netns del vpa-second-test")


def test_failed_add_after_ipam_releases_the_allocation_and_leaves_no_link(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path, isolation: str) -> None:
    # The kernel refuses a multicast MAC only after IPAM ran and the veth pair exists.
    conf = _conf(vpc, tmp_path, isolation=isolation, runtimeConfig={"MAC": "01:00:5e:00:00:01"})
    answer = plugin.call("ADD", conf, container_id="pod-f", netns=netns)
    assert answer.status != 0 and answer.code == 100, answer.stdout
    assert "MAC" in answer.body["msg"]
    assert "Traceback" not in answer.stdout + answer.stderr
    assert naming.host_link_name(vpc, "7") not in links_in()
    assert links_in(netns) == {"lo"}
    assert host_local_reservations(tmp_path / "ipam", f"net-{vpc}") == []


def test_pod_interface_of_someone_else_is_refused_before_anything_is_kept(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    ns = os.path.basename(netns)
    run_ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "other0")
    answer = plugin.call("ADD", _conf(vpc, tmp_path), container_id="pod-x", netns=netns)
    assert answer.code == 105 and "eth0" in answer.body["msg"]
    assert links_in(netns) == {"lo", "eth0", "other0"}
    assert naming.host_link_name(vpc, "7") not in links_in()
    assert host_local_reservations(tmp_path / "ipam", f"net-{vpc}") == []


def test_publishing_without_kubeconfig_fails_with_code_7_before_any_change(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    conf = _conf(vpc, tmp_path, publish={"bgp": True, "endpointSlice": True})
    answer = plugin.call("ADD", conf, container_id="pod-k", netns=netns,
                         VPC_ATTACH_NODE_NAME="worker-1")
    assert answer.code == 7 and "kubeconfig" in answer.body["msg"]
    assert links_in(netns) == {"lo"}
    assert not (tmp_path / "ipam").exists(), "IPAM must not even be asked"


def _kernel_has_vrf() -> bool:
    if os.system("ip link add vpa-vrf-probe type vrf table 4000 2>/dev/null") != 0:
        return False
    os.system("ip link del vpa-vrf-probe")
    return True


HAS_VRF = _kernel_has_vrf() if os.geteuid() == 0 else False


def test_vrf_isolation_fails_clearly_without_kernel_vrf_and_attaches_with_it(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    """On a kernel without VRF devices (this project's CI machine) an `isolation: vrf` ADD
    fails with code 100 and leaves nothing, and STATUS says so (50); never a silent fallback to
    `table`. On a kernel with them the same ADD attaches the Pod and STATUS is 0. Never
    skipped: each kernel gets the answer it calls for (the VRF paths themselves are proven in
    the full-kernel VM)."""
    conf = _conf(vpc, tmp_path, isolation="vrf")
    answer = plugin.call("ADD", conf, container_id="pod-vrf", netns=netns)
    if HAS_VRF:
        assert answer.status == 0, answer.stdout
        assert "eth0" in links_in(netns)
        assert plugin.call("STATUS", conf).status == 0
        plugin.ok("DEL", with_prev(conf, answer.body), container_id="pod-vrf", netns=netns)
        assert links_in(netns) == {"lo"}
        return
    assert answer.code == 100 and "VRF" in answer.body["msg"], answer.stdout
    assert links_in(netns) == {"lo"}
    assert naming.host_link_name(vpc, "7") not in links_in()
    assert host_local_reservations(tmp_path / "ipam", f"net-{vpc}") == []
    status = plugin.call("STATUS", conf)
    assert status.code == 50 and "VRF" in status.body["msg"]


@pytest.mark.fullkernel
def test_vrf_isolation_enslaves_the_host_link_and_keeps_the_shared_vrf_while_used(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    conf = _conf(vpc, tmp_path, isolation="vrf")
    result = plugin.ok("ADD", conf, container_id="pod-vrf", netns=netns)
    vrf = naming.vrf_name(vpc)
    assert f"master {vrf}" in run_ip("link", "show", naming.host_link_name(vpc, "7"))
    assert plugin.call("CHECK", with_prev(conf, result), container_id="pod-vrf",
                       netns=netns).status == 0
    with temporary_netns("vpa-vrf2") as second_netns:
        other = {**conf, "vpcattachment": "8"}
        kept = plugin.ok("ADD", other, container_id="pod-vrf2", netns=second_netns)
        plugin.ok("DEL", with_prev(conf, result), container_id="pod-vrf", netns=netns)
        assert vrf in links_in(), "the VRF stays while another attachment of the VPC uses it"
        plugin.ok("DEL", with_prev(other, kept), container_id="pod-vrf2", netns=second_netns)
    # The last attachment's DEL removes the unused VRF (SPEC §14; through the agent, right after
    # its answer, when the retired links are deleted).
    wait_until("the unused VRF removed", lambda: vrf not in links_in(), after_answer_bound())


def test_status_and_gc(plugin: Plugin, netns: str, vpc: str, tmp_path: Path,
                      isolation: str) -> None:
    conf = _conf(vpc, tmp_path, isolation=isolation)
    assert plugin.call("STATUS", conf).status == 0
    plugin.ok("ADD", conf, container_id="pod-stale", netns=netns)
    kept = {**conf, "cni.dev/valid-attachments": [{"containerID": "pod-stale", "ifname": "eth0"}]}
    plugin.ok("GC", kept)
    assert naming.host_link_name(vpc, "7") in links_in()
    plugin.ok("GC", {**conf, "cni.dev/valid-attachments": []})
    assert naming.host_link_name(vpc, "7") not in links_in()
    assert host_local_reservations(tmp_path / "ipam", conf["name"]) == []  # type: ignore[arg-type]


def test_lock_timeout_after_ipam_is_code_11_and_releases_the_allocation(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    import fcntl
    conf = _conf(vpc, tmp_path)
    with open(plugin.lock_dir / "host.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another invocation "holds" the host-wide lock
        answer = plugin.call("ADD", conf, container_id="pod-l", netns=netns,
                             VPC_ATTACH_TIMEOUT_SECONDS="1.5")
    assert answer.code == 11 and "lock" in answer.body["msg"], answer.stdout
    assert links_in(netns) == {"lo"}
    assert naming.host_link_name(vpc, "7") not in links_in()
    assert host_local_reservations(tmp_path / "ipam", f"net-{vpc}") == []


def test_del_with_an_unusable_config_succeeds_and_changes_nothing(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    conf = _conf(vpc, tmp_path)
    plugin.ok("ADD", conf, container_id="pod-u", netns=netns)
    # The runtime's clean-up DEL after an ADD that failed on this config: nothing to undo.
    plugin.ok("DEL", {**conf, "vpc": "not-base62!"}, container_id="pod-u", netns=netns)
    assert naming.host_link_name(vpc, "7") in links_in(), "another config's link is untouched"
    missing_env = plugin.call("DEL", conf, container_id="", netns=netns)
    assert missing_env.code == 4, "an unusable environment is still an error"
    plugin.ok("DEL", conf, container_id="pod-u", netns=netns)


def test_check_passes_with_a_link_local_default_gateway(plugin: Plugin, netns: str, vpc: str,
                                                        tmp_path: Path) -> None:
    # No gateway from IPAM: the pod's IPv6 default goes via fe80::1 on the host link.
    conf = base_conf(vpc, "8", ipam={"type": "static", "addresses": [
        {"address": "fd00:77::5/64"}]})
    result = plugin.ok("ADD", conf, container_id="pod-ll", netns=netns)
    assert result["routes"] == [{"dst": "::/0", "gw": "fe80::1"}]
    assert plugin.call("CHECK", with_prev(conf, result), container_id="pod-ll",
                       netns=netns).status == 0
    plugin.ok("DEL", conf, container_id="pod-ll", netns=netns)
