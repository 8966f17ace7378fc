"""vpc-attach-ipam pools of `scope: cluster` against the real control plane: simulated nodes
(each a node name with its Node object and a dataDir of its own) share one pool through
IPAMBlock claims. Everything is checked with the official client and the nodes' files."""

from __future__ import annotations

import ipaddress
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS
from e2e.harness.faults import start_proxy
from e2e.harness.kernel import run_ip
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES
from e2e.harness.nodes import node_objects as nodes
from e2e.harness.plugin import VIA_AGENT, Answer, Plugin, base_conf
from e2e.harness.rbac import identity_without
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.both_paths]
BLOCKS = IPAM_BLOCKS.path()
CONCURRENT = 30  # invocations in flight at once, across the three nodes


def node_blocks(kube: Kube, node: str) -> list[dict[str, Any]]:
    """The IPAMBlocks naming node (by the CRD's selectable field)."""
    return kube.list(BLOCKS, fields=f"spec.node={node}")


def network_blocks(kube: Kube, network: str) -> list[dict[str, Any]]:
    return kube.list(BLOCKS, fields=f"spec.network={network}")


def ipam_conf(network: str, data_dir: Path, **pools: Any) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": network, "type": "vpc-attach",
            "ipam": {"type": "vpc-attach-ipam", "dataDir": str(data_dir), "scope": "cluster",
                     **pools}}


def node_env(node: str, kubeconfig: Path) -> dict[str, str]:
    return {"VPC_ATTACH_NODE_NAME": node, "VPC_ATTACH_KUBECONFIG": str(kubeconfig)}


def records_on_disk(data_dir: Path) -> dict[str, str]:
    """address -> container ID of every allocation record under a node's dataDir."""
    found = {}
    for path in data_dir.rglob("*"):
        try:
            ipaddress.ip_address(path.name)
        except ValueError:
            continue
        if path.is_file() and path.parent.name not in ("attachments", "blocks"):
            found[path.name] = json.loads(path.read_text())["containerID"]
    return found


def ipam(plugin: Plugin, command: str, conf: dict[str, Any], container_id: str,
         environ: dict[str, str]) -> Answer:
    """The vpc-attach-ipam executable, as a runtime runs it."""
    return plugin.call(command, conf, container_id=container_id, netns="/var/run/netns/x",
                       executable="vpc-attach-ipam", **environ)


def test_three_nodes_adding_at_once_from_one_pool_never_share_an_address(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path) -> None:
    network = f"shared-{secrets.token_hex(3)}"
    per_node = 40
    with nodes(kube, 3) as names:
        dirs = {name: tmp_path / name for name in names}
        # 120 interpreters starting at once on a small test machine wait long for CPU.
        confs = {name: ipam_conf(network, dirs[name], ipv4_subnet="172.27.0.0/24",
                                 ipv6_subnet="fd00:77::/64", lockTimeoutSeconds=60)
                 for name in names}
        jobs = [(name, f"{name}-ctr-{n}") for name in names for n in range(per_node)]

        def add(job: tuple[str, str]) -> Answer:
            name, container = job
            return ipam(plugin, "ADD", confs[name], container,
                        node_env(name, cluster.plugin_kubeconfig))

        with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
            answers = list(pool.map(add, jobs))
        failed = [a.stdout + a.stderr for a in answers if a.status != 0]
        assert not failed, failed[:3]
        given = [(job[0], ip["address"]) for job, a in zip(jobs, answers, strict=True)
                 for ip in a.body["ips"]]
        addresses = [address for _, address in given]
        assert len(addresses) == 2 * len(jobs)
        assert len(set(addresses)) == len(addresses), "no address twice"

        # Each node's records are its answers, and no two nodes record one address.
        on_disk = {name: records_on_disk(dirs[name]) for name in names}
        for name in names:
            answered = {a.split("/")[0] for n, a in given if n == name}
            assert set(on_disk[name]) == answered
        assert sum(len(r) for r in on_disk.values()) == len(addresses)

        # The API's blocks: disjoint, and every address inside a block of the node it came from.
        blocks = network_blocks(kube, network)
        cidrs = [(b["spec"]["node"], ipaddress.ip_network(b["spec"]["cidr"])) for b in blocks]
        for i, (_, one) in enumerate(cidrs):
            assert not any(one.overlaps(other) for _, other in cidrs[i + 1:])
        for name, address in given:
            ip = ipaddress.ip_interface(address).ip
            holders = [node for node, cidr in cidrs if ip in cidr]
            assert holders == [name], f"{address} answered by {name}, blocks of {holders}"
        for block in blocks:
            owner = block["metadata"]["ownerReferences"][0]
            node = kube.get(f"{NODES}/{block['spec']['node']}")
            assert node is not None and owner["kind"] == "Node"
            assert owner["uid"] == node["metadata"]["uid"]
        v4 = [b for b in blocks if ":" not in b["spec"]["cidr"]]
        print(f"\n3 nodes x {per_node} ADDs, {CONCURRENT} at once: {len(addresses)} addresses, "
              f"{len(addresses) - len(set(addresses))} duplicates, {len(blocks)} blocks "
              f"claimed ({len(v4)} IPv4 /28, {len(blocks) - len(v4)} IPv6 /90)")

        def delete(job: tuple[str, str]) -> Answer:
            name, container = job
            return ipam(plugin, "DEL", confs[name], container,
                        node_env(name, cluster.plugin_kubeconfig))

        with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
            dels = list(pool.map(delete, jobs))
        assert all(d.status == 0 for d in dels), [d.stdout for d in dels if d.status][:3]
        for name in names:
            assert records_on_disk(dirs[name]) == {}
            kept = node_blocks(kube, name)
            families = [":" in b["spec"]["cidr"] for b in kept]
            assert sorted(families) == [False, True], \
                f"{name} keeps one empty block per pool, gives back the rest: {kept}"
            local = {p.name for p in dirs[name].rglob("blocks/*")}
            assert local == {b["metadata"]["name"] for b in kept}


def test_a_deleted_nodes_blocks_go_with_it_and_others_claim_them(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path) -> None:
    network = f"gone-{secrets.token_hex(3)}"
    with nodes(kube, 2) as (leaving, staying):
        conf = ipam_conf(network, tmp_path / leaving, ipv4_subnet="10.66.0.0/28")
        answer = ipam(plugin, "ADD", conf, "leaving-ctr", node_env(leaving,
                                                                     cluster.plugin_kubeconfig))
        assert answer.status == 0, answer.stdout
        held = node_blocks(kube, leaving)
        assert len(held) == 1
        kube.delete(f"{NODES}/{leaving}")
        # kube-controller-manager's garbage collector follows the ownerReference.
        wait_until(f"IPAMBlocks of deleted Node {leaving} to be collected",
                   lambda: node_blocks(kube, leaving) == [], timeout=90)
        other = ipam_conf(network, tmp_path / staying, ipv4_subnet="10.66.0.0/28")
        claimed: set[str] = set()
        for n in range(13):  # every allocatable address of the /28, the freed block's too
            answer = ipam(plugin, "ADD", other, f"staying-{n}",
                          node_env(staying, cluster.plugin_kubeconfig))
            assert answer.status == 0, answer.stdout
            claimed.update(ip["address"] for ip in answer.body["ips"])
        assert held[0]["spec"]["cidr"] in claimed


def test_pool_exhausted_across_nodes_is_code_102_naming_the_pool(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path) -> None:
    network = f"full-{secrets.token_hex(3)}"
    with nodes(kube, 2) as names:
        confs = {n: ipam_conf(network, tmp_path / n, ipv4_subnet="10.77.0.0/28") for n in names}
        given: list[str] = []
        for n in range(13):  # /28: 16 blocks of one address; network, gateway, broadcast kept
            name = names[n % 2]
            answer = ipam(plugin, "ADD", confs[name], f"c{n}",
                          node_env(name, cluster.plugin_kubeconfig))
            assert answer.status == 0, answer.stdout
            given.extend(ip["address"] for ip in answer.body["ips"])
        assert len(set(given)) == 13
        for name in names:
            answer = ipam(plugin, "ADD", confs[name], "one-more",
                          node_env(name, cluster.plugin_kubeconfig))
            assert answer.code == 102, answer.stdout
            assert "10.77.0.0/28" in answer.body["msg"] and network in answer.body["msg"]


def test_scope_cluster_without_a_kubeconfig_is_code_7_naming_the_setting(
        plugin: Plugin, tmp_path: Path) -> None:
    conf = ipam_conf("nokube", tmp_path, ipv4_subnet="10.78.0.0/24")
    answer = ipam(plugin, "ADD", conf, "c1", {"VPC_ATTACH_NODE_NAME": "n1"})
    assert answer.code == 7 and "kubeconfig" in answer.body["msg"], answer.stdout
    assert not (tmp_path / "nokube").exists()


def test_a_claim_the_api_refuses_is_code_104_and_leaves_no_record(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path) -> None:
    conf = ipam_conf(f"denied-{secrets.token_hex(3)}", tmp_path / "ipam",
                     ipv4_subnet="10.79.0.0/24")
    with nodes(kube, 1) as (name,), identity_without(
            kube, cluster, tmp_path, {("vpc-attach.datum.net", "ipamblocks")}) as kubeconfig:
        answer = ipam(plugin, "ADD", conf, "c1", node_env(name, kubeconfig))
        assert answer.code == 104, answer.stdout
        assert "IPAMBlock" in answer.body["msg"] and "ClusterRole" in answer.body["msg"]
        assert records_on_disk(tmp_path / "ipam") == {}
        assert not list((tmp_path / "ipam").rglob("blocks/*")), "no claim record left"
        assert ipam(plugin, "DEL", conf, "c1", node_env(name, kubeconfig)).status == 0


@pytest.mark.root
def test_common_case_add_through_the_plugin_asks_the_api_nothing(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path, vpc: str) -> None:
    """Requests counted by a proxy between the plugin (in-process, or the agent) and the API
    server: a claim costs three (GET the Node, LIST the pool's blocks, POST the block); an ADD
    inside a held block costs none."""
    proxied = start_proxy(cluster, tmp_path)
    network = f"count-{secrets.token_hex(3)}"
    netns_names: list[str] = []
    try:
        with nodes(kube, 1) as (name,):
            plugin.environ.update({**node_env(name, proxied.kubeconfig),
                                   "VPC_ATTACH_TENANCY": "off"})
            ipam_block = {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / "ipam"),
                          "scope": "cluster", "ipv4_subnet": "172.28.0.0/24",
                          "ipv6_subnet": "fd00:78::/64"}
            per_add = []
            for n in range(6):
                pod_ns = f"vpa-cip-{secrets.token_hex(3)}"
                run_ip("netns", "add", pod_ns)
                netns_names.append(pod_ns)
                conf = base_conf(vpc, str(n + 1), name=network, ipam=ipam_block)
                before = len(proxied.proxy.seen())
                plugin.ok("ADD", conf, container_id=f"cnt-{n}",
                          netns=f"/var/run/netns/{pod_ns}")
                seen = proxied.proxy.seen()[before:]
                per_add.append([f"{s.method} {s.resource}" for s in seen
                                if s.resource in ("ipamblocks", "nodes")])
            print(f"\nIPAM API requests per ADD ({'agent' if VIA_AGENT else 'in-process'}): "
                  f"{[len(r) for r in per_add]}")
            assert per_add[0] == ["GET nodes", "GET ipamblocks", "POST ipamblocks",
                                  "GET nodes", "GET ipamblocks", "POST ipamblocks"], per_add
            assert per_add[1:] == [[]] * 5, "ADDs inside held blocks ask the API nothing"
            for n in range(6):
                conf = base_conf(vpc, str(n + 1), name=network, ipam=ipam_block)
                plugin.ok("DEL", conf, container_id=f"cnt-{n}",
                          netns=f"/var/run/netns/{netns_names[n]}")
            assert len(node_blocks(kube, name)) == 2, "one block per pool stays held"
    finally:
        for pod_ns in netns_names:
            run_ip("netns", "del", pod_ns, check=False)
        proxied.stop()
