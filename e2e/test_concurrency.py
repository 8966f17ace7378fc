"""Many ADDs at once, as a kubelet starting many Pods does (SPEC §9)."""

from __future__ import annotations

import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cni_plugin.core import naming
from e2e.harness.kernel import links_in, run_ip
from e2e.harness.plugin import Plugin, base_conf, host_local, host_local_reservations
from e2e.harness.wait import wait_until
from netconf import base62

pytestmark = pytest.mark.root
PODS = 32


def test_32_concurrent_adds_then_dels_get_distinct_addresses_and_leave_nothing(
        plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    ipam = host_local(tmp_path / "ipam", "fd00:32::/64", "10.32.0.0/24")
    names = [f"vpa-c{secrets.token_hex(3)}-{i}" for i in range(PODS)]
    for name in names:
        run_ip("netns", "add", name)
    confs = [base_conf(vpc, base62.encode_base62(100 + i), name="conc", ipam=ipam)
             for i in range(PODS)]
    try:
        with ThreadPoolExecutor(max_workers=PODS) as pool:
            answers = list(pool.map(
                lambda i: plugin.call("ADD", confs[i], container_id=f"pod{i}",
                                      netns=f"/var/run/netns/{names[i]}"), range(PODS)))
        failures = [a.stdout for a in answers if a.status != 0]
        assert not failures, failures[:3]
        addresses = [ip["address"] for a in answers for ip in a.body["ips"]]
        assert len(addresses) == 2 * PODS and len(set(addresses)) == 2 * PODS
        host_links = {naming.host_link_name(vpc, base62.encode_base62(100 + i))
                      for i in range(PODS)}
        assert host_links <= links_in()
        tables = {line.split("lookup")[1].strip() for line in run_ip("-4", "rule").splitlines()
                  if f"iif G{naming.pad_base62(vpc, 9)}" in line}
        assert len(tables) == 1, "one VPC, one table, however many ADDs race"

        with ThreadPoolExecutor(max_workers=PODS) as pool:
            dels = list(pool.map(
                lambda i: plugin.call("DEL", confs[i], container_id=f"pod{i}",
                                      netns=f"/var/run/netns/{names[i]}"), range(PODS)))
        assert all(d.status == 0 for d in dels), [d.stdout for d in dels if d.status][:3]
        assert not host_links & links_in()
        assert host_local_reservations(tmp_path / "ipam", "conc") == []
        assert not any("eth0" in links_in(f"/var/run/netns/{n}") for n in names)
        # Through the agent the pod ends are retired and go with their host ends just after.
        wait_until("the retired pod ends to go",
                   lambda: all(links_in(f"/var/run/netns/{n}") == {"lo"} for n in names),
                   10)
    finally:
        for name in names:
            os.system(f"ip netns del {name} 2>/dev/null")
