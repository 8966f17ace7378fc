"""Many ADDs at once, as a kubelet starting many Pods does (SPEC §9)."""

from __future__ import annotations

import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.endpointslice import slice_name
from e2e.harness.kernel import links_in, mark_rules, run_ip, vpc_table
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, host_local, host_local_reservations, with_prev
from e2e.harness.publishing import advertisement, create_pod, endpoint_slice, make_node
from e2e.harness.wait import wait_until
from netconf import base62

pytestmark = [pytest.mark.root, pytest.mark.both_paths]
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
        table = vpc_table(vpc)
        assert table is not None and len(mark_rules(table)) == 2, \
            "one VPC, one table, however many ADDs race"
        groups = {run_ip("-d", "-j", "link", "show", link) for link in host_links}
        assert all(f'"group":"{int(table) << 16}"' in g for g in groups), groups

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


PAIRS = 20


@pytest.mark.cluster
def test_racing_add_and_del_of_one_container_end_all_or_nothing(
        kube: Kube, cluster: Any, plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    # A runtime retrying or a late DEL overlapping an ADD (SPEC §9): 20 times, ADD and DEL of
    # the same container at once, publishing on. Whichever runs second sees the first's whole
    # work: the attachment is either fully there (then CHECK passes) or fully gone.
    node = make_node(kube, cluster, plugin)
    conf = base_conf(vpc, "9", ipam=host_local(tmp_path / "ipam", "fd00:20::/64"))
    conf.pop("publish")
    uid = create_pod(kube, "racer", node.name)
    args = node.cni_args("racer", uid)
    adv_name = naming.advertisement_name(vpc, "9", node.name)
    slice_v6 = slice_name("racer", vpc, "9", "IPv6")
    outcomes: list[str] = []
    for attempt in range(PAIRS):
        cid = f"racer-{attempt}"
        with ThreadPoolExecutor(max_workers=2) as pool:
            add = pool.submit(plugin.call, "ADD", conf, container_id=cid, netns=netns,
                              CNI_ARGS=args)
            delete = pool.submit(plugin.call, "DEL", conf, container_id=cid, netns=netns,
                                 CNI_ARGS=args)
            added, deleted = add.result(), delete.result()
        assert added.status == 0, added.stdout
        assert deleted.status == 0, deleted.stdout
        adv = advertisement(kube, adv_name)
        ours = adv is not None and any(naming.annotation_cid(cid) in key
                                       for key in adv["metadata"]["annotations"])
        parts = {"host link": naming.host_link_name(vpc, "9") in links_in(),
                 "pod interface": "eth0" in links_in(netns),
                 "IPAM": bool(host_local_reservations(tmp_path / "ipam", conf["name"])),
                 "annotations": ours,
                 "slice": endpoint_slice(kube, slice_v6) is not None}
        assert len(set(parts.values())) == 1, f"half made after try {attempt}: {parts}"
        if parts["host link"]:
            outcomes.append("kept")
            plugin.ok("CHECK", with_prev(conf, added.body), container_id=cid, netns=netns,
                      CNI_ARGS=args)
            plugin.ok("DEL", with_prev(conf, added.body), container_id=cid, netns=netns,
                      CNI_ARGS=args)
        else:
            outcomes.append("gone")
        wait_until("the pod interface to go", lambda: "eth0" not in links_in(netns), 10)
    print(f"racing ADD/DEL pairs: {outcomes.count('kept')} kept, {outcomes.count('gone')} gone")
