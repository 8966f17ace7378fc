"""IPAM delegated to our own vpc-attach-ipam (pools) by the plugin, on real namespaces:
ADD, CHECK (forwarded), DEL (released first), GC and STATUS (forwarded)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from cni_plugin.core import naming
from e2e.harness.kernel import links_in, run_ip
from e2e.harness.plugin import Plugin, base_conf, with_prev

pytestmark = [pytest.mark.root, pytest.mark.both_paths]


def _records(data_dir: Path) -> list[str]:
    """Allocation records: files named by the address they hold."""
    found = []
    for path in data_dir.rglob("*"):
        try:
            ipaddress.ip_address(path.name)
        except ValueError:
            continue
        if path.is_file():
            found.append(path.name)
    return sorted(found)


def test_pool_allocation_through_the_plugin(plugin: Plugin, netns: str, vpc: str,
                                            tmp_path: Path) -> None:
    data = tmp_path / "ipam"
    conf = base_conf(vpc, "3", ipam={"type": "vpc-attach-ipam", "dataDir": str(data),
                                     "ipv6_subnet": "fd00:33:ff01::/48",
                                     "ipv4_subnet": "172.30.3.0/24"})
    result = plugin.ok("ADD", conf, container_id="pod-pool", netns=netns)
    addresses = sorted(ip["address"] for ip in result["ips"])
    v6 = next(a for a in addresses if ":" in a)
    v4 = next(a for a in addresses if ":" not in a)
    assert v6.endswith("/96") and v4.startswith("172.30.3.") and v4.endswith("/32")
    v6 = v6.split("/")[0]
    assert f"inet6 {v6}/96" in run_ip("-n", netns.rsplit("/", 1)[1], "addr", "show", "eth0")
    assert _records(data), "the allocation is recorded on disk"

    checked = with_prev(conf, result)
    assert plugin.call("CHECK", checked, container_id="pod-pool", netns=netns).status == 0
    again = plugin.ok("ADD", conf, container_id="pod-pool", netns=netns)
    assert sorted(ip["address"] for ip in again["ips"]) == addresses, "same allocation"
    assert plugin.call("STATUS", conf).status == 0

    plugin.ok("DEL", checked, container_id="pod-pool", netns=netns)
    assert _records(data) == []
    assert naming.host_link_name(vpc, "3") not in links_in()
    plugin.ok("ADD", conf, container_id="pod-pool2", netns=netns)
    plugin.ok("GC", {**conf, "cni.dev/valid-attachments": []})
    assert _records(data) == [], "GC forwarded to the IPAM plugin released the record"
