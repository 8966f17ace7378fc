"""tap attachments for VMs on the real kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from cni_plugin.core import naming
from cni_plugin.kernel.tap import IFF_MULTI_QUEUE, IFF_VNET_HDR
from e2e.harness.kernel import links_in, run_ip, vpc_table_of
from e2e.harness.plugin import Plugin, base_conf, with_prev

pytestmark = [pytest.mark.root, pytest.mark.both_paths]


def _tap_conf(vpc: str, **kw: object) -> dict[str, object]:
    return base_conf(vpc, "60", attachment="tap", mtu=1400,
                     tap={"owner": 107, "group": 108, "multiQueue": True, "vnetHdr": True},
                     ipam={"type": "vpc-attach-ipam", "addresses": [
                         {"address": "fd20:60:ff03:0:1::/96", "gateway": "fd20:60:ff03::1"},
                         {"address": "203.0.113.17/32", "gateway": "203.0.113.1"}]}, **kw)


def _sysfs(link: str, key: str) -> int:
    return int(Path(f"/sys/class/net/{link}/{key}").read_text().strip(), 0)


def test_tap_life_cycle(plugin: Plugin, netns: str, vpc: str, isolation: str) -> None:
    conf = _tap_conf(vpc, isolation=isolation)
    tap = naming.host_link_name(vpc, "60")
    result = plugin.ok("ADD", conf, container_id="vm-1", netns=netns)

    assert [i["name"] for i in result["interfaces"]] == [tap]
    assert result["interfaces"][0].get("sandbox", "") == ""
    assert {ip["interface"] for ip in result["ips"]} == {0}
    assert sorted(ip["address"] for ip in result["ips"]) == [
        "203.0.113.17/32", "fd20:60:ff03:0:1::/96"]
    assert links_in(netns) == {"lo"}, "a tap lives on the host"

    assert _sysfs(tap, "owner") == 107 and _sysfs(tap, "group") == 108
    flags = _sysfs(tap, "tun_flags")
    assert flags & IFF_MULTI_QUEUE and flags & IFF_VNET_HDR
    assert _sysfs(tap, "mtu") == 1400
    detail = run_ip("-d", "addr", "show", tap)
    assert "inet 203.0.113.1/25" in detail and "noprefixroute" in detail
    assert "inet6 fd20:60:ff03::1/128" in detail
    assert "203.0.113.0/25" not in run_ip("-4", "route", "show", "table", "all")
    assert run_ip("neigh", "show", "dev", tap).strip() == "", "no neighbour entry for a VM"
    table = vpc_table_of(tap, isolation)
    assert f"203.0.113.17 dev {tap}" in run_ip("-4", "route", "show", "table", table)
    assert f"fd20:60:ff03:0:1:: dev {tap}" in run_ip("-6", "route", "show", "table", table)

    checked = with_prev(conf, result)
    assert plugin.call("CHECK", checked, container_id="vm-1", netns=netns).status == 0
    run_ip("link", "set", tap, "mtu", "1500")
    run_ip("addr", "del", "203.0.113.1/25", "dev", tap)
    answer = plugin.call("CHECK", checked, container_id="vm-1", netns=netns)
    assert answer.code == 103
    assert "MTU 1500" in answer.body["details"] and "203.0.113.1" in answer.body["details"]

    plugin.ok("DEL", checked, container_id="vm-1", netns=netns)
    assert tap not in links_in()
    plugin.ok("DEL", checked, container_id="vm-1", netns=netns)
    plugin.ok("DEL", conf, container_id="vm-1", netns="")


def test_tap_without_ipam_is_layer_2_only(plugin: Plugin, netns: str, vpc: str,
                                          isolation: str) -> None:
    conf = base_conf(vpc, "61", attachment="tap", mtu=9000, isolation=isolation)
    tap = naming.host_link_name(vpc, "61")
    result = plugin.ok("ADD", conf, container_id="vm-2", netns=netns)
    assert result["ips"] == [] and result.get("routes", []) == []
    assert _sysfs(tap, "mtu") == 9000
    assert run_ip("-4", "addr", "show", tap).strip().count("inet ") == 0
    assert plugin.call("CHECK", with_prev(conf, result), container_id="vm-2",
                       netns=netns).status == 0
    plugin.ok("DEL", conf, container_id="vm-2", netns=netns)
    assert tap not in links_in()


def test_tap_of_another_vm_is_not_taken_over(plugin: Plugin, netns: str, vpc: str,
                                             isolation: str) -> None:
    conf = base_conf(vpc, "62", attachment="tap", isolation=isolation)
    plugin.ok("ADD", conf, container_id="vm-old", netns=netns)
    answer = plugin.call("ADD", conf, container_id="vm-new", netns=netns)
    assert answer.code == 11 and "vm-old" in answer.body["msg"]
    plugin.ok("DEL", conf, container_id="vm-new", netns=netns)  # not its tap: kept
    assert naming.host_link_name(vpc, "62") in links_in()
    plugin.ok("DEL", conf, container_id="vm-old", netns=netns)
    assert naming.host_link_name(vpc, "62") not in links_in()
