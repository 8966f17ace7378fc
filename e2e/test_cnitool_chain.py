"""A chained conflist [vpc-attach, tuning, portmap] driven by the real libcni client (cnitool).

cnitool caches each result and sends CHECK and DEL with the cached prevResult, as container
runtimes do; later plugins must keep working on what vpc-attach returned.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cni_plugin.core import naming
from e2e.harness.kernel import links_in, run_ip
from e2e.harness.plugin import Plugin, host_local, host_local_reservations

pytestmark = [pytest.mark.root, pytest.mark.cnitool, pytest.mark.both_paths]
# Set through vpc-attach's `mac` capability: a MAC changed by a later plugin (tuning's `mac`)
# would leave the host's permanent neighbour entries pointing at the old one.
MAC = "0a:58:0a:15:00:09"


def _cnitool(verb: str, network: str, netns: str, confdir: Path, cni_bin: Path,
             cache: Path, plugin: Plugin) -> subprocess.CompletedProcess[str]:
    from e2e.harness.tools.gotools import cnitool_command, cnitool_env
    env = cnitool_env(cni_bin, confdir, ifname="eth0", cni_args="IgnoreUnknown=1",
                      cap_args={"mac": MAC, "portMappings": []},
                      base=plugin.env("ADD", "", "", "eth0"))
    for key in ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS"):
        env.pop(key, None)
    return subprocess.run(cnitool_command(verb, network, netns, cache_dir=cache), env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_chain_with_tuning_and_portmap_through_cnitool(plugin: Plugin, netns: str, vpc: str,
                                                       tmp_path: Path) -> None:
    network = "vpcchain"
    confdir, cache = tmp_path / "net.d", tmp_path / "cache"
    confdir.mkdir()
    cache.mkdir()
    conflist = {
        "cniVersion": "1.1.0", "name": network,
        "plugins": [
            {"type": "vpc-attach", "vpc": vpc, "vpcattachment": "21", "attachment": "veth",
             "mtu": 1450, "isolation": "table", "capabilities": {"mac": True},
             "publish": {"bgp": False, "endpointSlice": False},
             "ipam": host_local(tmp_path / "ipam", "fd00:21::/64", "10.21.0.0/24")},
            {"type": "tuning", "sysctl": {"net.ipv6.conf.eth0.accept_ra": "0",
                                          "net.ipv4.conf.eth0.arp_notify": "1"}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (confdir / f"{network}.conflist").write_text(json.dumps(conflist))

    def run(verb: str) -> subprocess.CompletedProcess[str]:
        return _cnitool(verb, network, netns, confdir, plugin.cni_bin, cache, plugin)

    added = run("add")
    assert added.returncode == 0, added.stderr + added.stdout
    result = json.loads(added.stdout)
    pod = next(i for i in result["interfaces"] if i.get("sandbox") == netns)
    assert pod["name"] == "eth0" and pod["mac"] == MAC
    ns = os.path.basename(netns)
    arp_notify = subprocess.run(["ip", "netns", "exec", ns, "cat",
                                 "/proc/sys/net/ipv4/conf/eth0/arp_notify"],
                                capture_output=True, text=True, timeout=10, check=True)
    assert arp_notify.stdout.strip() == "1", "tuning ran on our interface after us"
    host = naming.host_link_name(vpc, "21")
    assert f"10.21.0.2 lladdr {MAC} PERMANENT" in run_ip("neigh", "show", "dev", host)
    assert sorted(ip["address"] for ip in result["ips"]) == ["10.21.0.2/32", "fd00:21::2/64"]

    checked = run("check")
    assert checked.returncode == 0, checked.stderr + checked.stdout

    deleted = run("del")
    assert deleted.returncode == 0, deleted.stderr + deleted.stdout
    assert naming.host_link_name(vpc, "21") not in links_in()
    assert links_in(netns) == {"lo"}
    assert host_local_reservations(tmp_path / "ipam", network) == []
