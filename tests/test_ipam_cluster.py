"""vpc-attach-ipam pools of `scope: cluster`: block geometry, IPAMBlock names, and claims,
allocation and release against an in-memory stand-in for the API's IPAMBlocks (the real API
server is in e2e/test_ipam_cluster.py). No root needed."""

from __future__ import annotations

import ipaddress
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.agent.metrics import AgentMetrics
from cni_plugin.core.request import Request
from cni_plugin.doctor.blocks import ipam_blocks
from cni_plugin.doctor.node import Node
from cni_plugin.ipam.plugin import allocator, block_claims, lending, verbs
from cni_plugin.ipam.plugin.blocks import (
    ClusterBlock,
    block_of_cidr,
    block_of_index,
    block_size,
    blocks_of,
    object_name,
    parse_object_name,
    pool_hash,
)
from cni_plugin.ipam.plugin.config import IpamConfig, parse_ipam, parse_network
from cni_plugin.ipam.plugin.kubeblocks import block_object
from cni_plugin.ipam.plugin.pool import Pool
from cni_plugin.ipam.plugin.requests import match_pools
from cni_plugin.ipam.plugin.store import AddressTaken, Attachment, BlockRecord, ClaimOwner
from cni_plugin.kubevirt.doctor import ipam_claims
from netconf.capabilities import requested_ips
from netconf.errors import (
    INVALID_CONFIG,
    IO_FAILURE,
    IPAM_EXHAUSTED,
    TRY_AGAIN_LATER,
    CniError,
)
from netconf.host import IPAM_DATA_ROOT_ENV, HostSettings

NETWORK = "shared"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def cluster_conf(data_dir: Path, **keys: Any) -> IpamConfig:
    return parse_ipam({"type": "vpc-attach-ipam", "dataDir": str(data_dir), "scope": "cluster",
                       **keys}, "1.1.0", NETWORK)


class FakeBlocks:
    """The IPAMBlocks of one cluster, shared by the nodes' FakeApi views (thread-safe)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.ipamclaims: list[dict[str, Any]] = []  # IPAMClaim objects, every namespace
        self.lock = threading.Lock()
        self.uids = 0


class FakeApi:
    """`block_claims.BlockApi` of one node over FakeBlocks, counting its requests."""

    def __init__(self, store: FakeBlocks, node: str) -> None:
        self.store = store
        self.node = node
        self.created_by = "c/eth0/t"
        self.calls: Counter[str] = Counter()
        self.down = False  # every request fails with code 11
        self.lose_create_answer = False  # the create is stored, its answer lost

    def _call(self, what: str) -> None:
        self.calls[what] += 1
        if self.down:
            raise CniError(TRY_AGAIN_LATER, "Kubernetes API unavailable")

    def node_uid(self) -> str:
        self._call("get node")
        return f"uid-{self.node}"

    def pool_blocks(self, network: str, pool: Pool) -> list[dict[str, Any]]:
        self._call("list pool")
        digest = pool_hash(network, pool)
        with self.store.lock:
            return [o for o in self.store.objects.values()
                    if o["metadata"]["labels"][block_claims.POOL_LABEL] == digest]

    def node_blocks(self) -> list[dict[str, Any]]:
        self._call("list node")
        with self.store.lock:
            return [o for o in self.store.objects.values() if o["spec"]["node"] == self.node]

    def create(self, block: ClusterBlock, node_uid: str) -> dict[str, Any] | None:
        self._call("create")
        body = block_object(block, self.node, node_uid, "c/eth0/t")
        with self.store.lock:
            if block.name in self.store.objects:
                return None
            self.store.uids += 1
            body["metadata"]["uid"] = f"b{self.store.uids}"
            self.store.objects[block.name] = body
        if self.lose_create_answer:
            raise CniError(TRY_AGAIN_LATER, "no answer to POST ipamblocks")
        return body

    def create_lend(self, body: dict[str, Any]) -> dict[str, Any] | None:
        self._call("create lend")
        name = body["metadata"]["name"]
        with self.store.lock:
            if name in self.store.objects:
                return None
            self.store.uids += 1
            body["metadata"]["uid"] = f"b{self.store.uids}"
            self.store.objects[name] = body
        return body

    def get(self, name: str) -> dict[str, Any] | None:
        self._call("get")
        with self.store.lock:
            return self.store.objects.get(name)

    def delete(self, name: str, uid: str) -> bool:
        self._call("delete")
        with self.store.lock:
            current = self.store.objects.get(name)
            if current is None or (uid and current["metadata"]["uid"] != uid):
                return False
            del self.store.objects[name]
            return True

    def network_claims(self, network: str) -> list[dict[str, Any]]:
        self._call("list ipamclaims")
        with self.store.lock:
            return [c for c in self.store.ipamclaims if c["spec"]["network"] == network]

    def requests(self) -> int:
        return sum(self.calls.values())


def allocate(conf: IpamConfig, api: FakeApi, container: str) -> list[str]:
    return [a.address for a in allocator.allocate_all(conf, Attachment(container, "eth0"), api)]


# ---------------------------------------------------------------------------------------------
# Geometry and names


@pytest.mark.parametrize(("subnet", "length", "size"), [
    ("172.27.0.0/24", 32, 16), ("10.0.0.0/16", 32, 64), ("10.0.0.0/28", 32, 1),
    ("10.0.0.0/27", 32, 2), ("fd00:77::/64", 96, 64), ("fd00::/120", 128, 16)])
def test_block_size_leaves_16_blocks_and_holds_at_most_64(subnet: str, length: int,
                                                          size: int) -> None:
    pool = Pool.with_default_gateway(ipaddress.ip_network(subnet), length)
    assert block_size(pool) == size
    assert blocks_of(NETWORK, pool) >= min(16, pool.size)


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    if draw(st.booleans()):
        prefix = draw(st.integers(8, 30))
        subnet: Any = ipaddress.IPv4Network((draw(st.integers(0, 2**32 - 1)) >> (32 - prefix)
                                             << (32 - prefix), prefix))
        return Pool.with_default_gateway(subnet, 32)
    prefix = draw(st.integers(16, 126))
    length = draw(st.integers(prefix + 1, min(128, prefix + 40)))
    subnet = ipaddress.IPv6Network((draw(st.integers(0, 2**128 - 1)) >> (128 - prefix)
                                    << (128 - prefix), prefix))
    return Pool.with_default_gateway(subnet, length)


@given(pools(), st.data())
def test_blocks_tile_the_pool_and_their_cidrs_round_trip(pool: Pool, data: st.DataObject) -> None:
    number = data.draw(st.integers(0, blocks_of(NETWORK, pool) - 1))
    block = ClusterBlock(NETWORK, pool, number)
    assert block.cidr.subnet_of(pool.subnet)  # type: ignore[arg-type]
    assert block.cidr.num_addresses == block.size * pool.block(0).num_addresses
    first, last = block.indices()[0], block.indices()[-1]
    assert pool.block(first).network_address == block.cidr.network_address
    assert pool.block(last).broadcast_address == block.cidr.broadcast_address
    assert block_of_cidr(NETWORK, pool, str(block.cidr)) == block


@given(pools(), st.data(), st.text(st.characters(codec="ascii"), min_size=1, max_size=40))
def test_object_names_are_dns_labels_that_decode_to_their_block(pool: Pool, data: st.DataObject,
                                                                network: str) -> None:
    count = blocks_of(network, pool)
    one, other = data.draw(st.integers(0, count - 1)), data.draw(st.integers(0, count - 1))
    block = ClusterBlock(network, pool, one)
    assert DNS_LABEL.match(block.name) and len(block.name) <= 63
    assert parse_object_name(block.name) == (pool_hash(network, pool), block.cidr)
    assert (ClusterBlock(network, pool, other).name == block.name) == (one == other)


@given(st.text(max_size=80))
def test_parse_object_name_accepts_only_what_object_name_writes(name: str) -> None:
    parsed = parse_object_name(name)
    if parsed is not None:
        assert object_name(*parsed) == name


def test_other_pools_give_other_names_for_the_same_cidr() -> None:
    pool = Pool.with_default_gateway(ipaddress.ip_network("172.27.0.0/24"), 32)
    names = {ClusterBlock(net, pool, 3).name for net in ("a", "b", "shared")}
    assert len(names) == 3


# ---------------------------------------------------------------------------------------------
# Config


def test_scope_defaults_to_node_and_accepts_cluster(tmp_path: Path) -> None:
    block = {"type": "vpc-attach-ipam", "ipv4_subnet": "172.27.0.0/24"}
    assert parse_ipam(block, "1.1.0", "n").scope == "node"
    assert parse_ipam({**block, "scope": "cluster"}, "1.1.0", "n").scope == "cluster"


@pytest.mark.parametrize("block", [
    {"ipv4_subnet": "172.27.0.0/24", "scope": "everywhere"},
    {"addresses": [{"address": "10.0.0.1/32"}], "scope": "cluster"}])
def test_bad_scope_is_code_7_naming_it(block: dict[str, Any]) -> None:
    with pytest.raises(CniError) as info:
        parse_ipam({"type": "vpc-attach-ipam", **block}, "1.1.0", "n")
    assert info.value.code == INVALID_CONFIG and "ipam.scope" in info.value.msg


def test_cluster_add_without_node_name_or_kubeconfig_is_code_7_before_any_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPC_ATTACH_HOST_CONFIG", str(tmp_path / "absent.json"))
    environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
               "CNI_NETNS": "/proc/self/ns/net", "CNI_PATH": "/opt/cni/bin",
               "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent.json"),
               "VPC_ATTACH_IPAM_DATA_ROOT": str(tmp_path)}
    stdin = ('{"cniVersion": "1.1.0", "name": "shared", "ipam": {"type": "vpc-attach-ipam", '
             f'"dataDir": "{tmp_path}", "scope": "cluster", "ipv4_subnet": "172.27.0.0/24"}}}}')
    with pytest.raises(CniError) as info:
        verbs.add(Request(environ=environ, stdin=stdin.encode()))
    assert info.value.code == INVALID_CONFIG and "nodeName" in info.value.msg
    assert not (tmp_path / "shared").exists(), "nothing written"
    with_node = {**environ, "VPC_ATTACH_NODE_NAME": "n1"}
    with pytest.raises(CniError) as info:
        verbs.add(Request(environ=with_node, stdin=stdin.encode()))
    assert "kubeconfig" in info.value.msg
    verbs.delete(Request(environ={**environ, "CNI_COMMAND": "DEL"}, stdin=stdin.encode()))


# ---------------------------------------------------------------------------------------------
# Claims and allocation


def test_first_add_claims_a_block_and_the_next_ones_ask_the_api_nothing(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    first = allocate(conf, api, "c0")
    assert api.calls == {"get node": 1, "list pool": 1, "create": 1}
    claimed = next(iter(api.store.objects.values()))
    assert ipaddress.ip_interface(first[0]).ip in ipaddress.ip_network(claimed["spec"]["cidr"])
    before = api.requests()
    for n in range(1, 10):
        allocate(conf, api, f"c{n}")
    assert api.requests() == before, "ADDs inside a held block make no API request"
    assert allocate(conf, api, "c3") == allocate(conf, api, "c3"), "repeated ADD, same address"


def test_a_full_block_claims_the_next_and_the_pool_exhausts_with_102(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="10.9.0.0/26")  # 4 per block, 16 blocks
    api = FakeApi(FakeBlocks(), "node-a")
    got = [allocate(conf, api, f"c{n}")[0] for n in range(61)]  # 64 less network/gw/broadcast
    assert len(set(got)) == 61
    assert len(api.store.objects) == 16 and api.calls["create"] == 16
    with pytest.raises(CniError) as info:
        allocate(conf, api, "one-more")
    assert info.value.code == IPAM_EXHAUSTED and "10.9.0.0/26" in info.value.msg
    assert "'shared'" in info.value.msg


def test_three_nodes_adding_at_once_never_share_an_address(tmp_path: Path) -> None:
    store = FakeBlocks()
    apis = [FakeApi(store, f"node-{n}") for n in range(3)]
    confs = [cluster_conf(tmp_path / f"node-{n}", ipv4_subnet="172.27.0.0/24",
                          ipv6_subnet="fd00:77::/64") for n in range(3)]

    def add(job: tuple[int, int]) -> list[str]:
        node, n = job
        return allocate(confs[node], apis[node], f"n{node}-c{n}")

    with ThreadPoolExecutor(max_workers=24) as pool:
        results = list(pool.map(add, [(node, n) for node in range(3) for n in range(40)]))
    addresses = [a for result in results for a in result]
    assert len(addresses) == 240 and len(set(addresses)) == 240
    owners = {o["spec"]["cidr"]: o["spec"]["node"] for o in store.objects.values()}
    for node, result in zip([j // 40 for j in range(120)], results, strict=True):
        for address in result:
            ip = ipaddress.ip_interface(address).ip
            holder = [c for c in owners if ip in ipaddress.ip_network(c)]
            assert [owners[c] for c in holder] == [f"node-{node}"], address


def test_a_block_taken_by_a_race_is_skipped(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    store = FakeBlocks()
    api = FakeApi(store, "node-a")
    pool = conf.pools[0]
    real_list = api.pool_blocks

    def stale_list(network: str, listed_pool: Pool) -> list[dict[str, Any]]:
        # Another node creates every block between this node's LIST and its create.
        listing = real_list(network, listed_pool)
        other = FakeApi(store, "node-b")
        for number in range(blocks_of(network, listed_pool) - 1):
            other.create(ClusterBlock(network, listed_pool, number), "uid-node-b")
        return listing

    api.pool_blocks = stale_list  # type: ignore[method-assign,assignment]
    address = allocate(conf, api, "c0")[0]
    last = ClusterBlock(NETWORK, pool, blocks_of(NETWORK, pool) - 1)
    assert ipaddress.ip_interface(address).ip in last.cidr
    assert store.objects[last.name]["spec"]["node"] == "node-a"
    assert api.calls["create"] > 1 and api.calls["get"] >= 1


def test_a_lost_create_answer_leaves_no_record_and_the_next_claim_adopts_the_block(
        tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    api.lose_create_answer = True
    with pytest.raises(CniError) as info:
        allocate(conf, api, "c0")
    assert info.value.code == TRY_AGAIN_LATER
    state = allocator.pool_state(conf, conf.pools[0])
    assert state.blocks() == [], "no local record of a claim that did not answer"
    assert len(api.store.objects) == 1
    api.lose_create_answer = False
    allocate(conf, api, "c0")
    assert len(api.store.objects) == 1, "the block created earlier is adopted, not a second"
    assert [b.state for b in state.blocks()] == ["held"]


def test_a_claim_whose_local_record_failed_is_adopted_on_the_next_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    state = allocator.pool_state(conf, conf.pools[0])
    real_write = type(state).write_block

    def failing_held(self: Any, record: BlockRecord) -> None:
        if record.state == "held":
            raise CniError(IO_FAILURE, "cannot write: No space left on device")
        real_write(self, record)

    monkeypatch.setattr(type(state), "write_block", failing_held)
    with pytest.raises(CniError) as info:
        allocate(conf, api, "c0")
    assert info.value.code == IO_FAILURE
    assert [b.state for b in state.blocks()] == ["claiming"], "addresses only from held blocks"
    monkeypatch.setattr(type(state), "write_block", real_write)
    allocate(conf, api, "c0")
    assert len(api.store.objects) == 1 and [b.state for b in state.blocks()] == ["held"]


def test_api_down_when_a_claim_is_needed_is_code_11_and_leaves_nothing(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    api.down = True
    with pytest.raises(CniError) as info:
        allocate(conf, api, "c0")
    assert info.value.code == TRY_AGAIN_LATER
    state = allocator.pool_state(conf, conf.pools[0])
    assert state.blocks() == [] and state.records() == []


# ---------------------------------------------------------------------------------------------
# Release and GC


def test_del_gives_back_an_empty_block_only_with_room_left_in_another(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="10.9.0.0/26")  # 4 per block
    api = FakeApi(FakeBlocks(), "node-a")
    for n in range(5):  # the first block holds 2 or 3 (reserved addresses), then a second
        allocate(conf, api, f"c{n}")
    assert len(api.store.objects) == 2
    state = allocator.pool_state(conf, conf.pools[0])
    by_block: dict[str, list[str]] = {}
    for record in state.records():
        assert record.attachment is not None
        block = block_of_index(NETWORK, conf.pools[0],
                                      conf.pools[0].index_of_name(record.name) or 0)
        by_block.setdefault(block.name, []).append(record.attachment.container_id)
    fuller, emptier = sorted(by_block, key=lambda name: -len(by_block[name]))
    for container in by_block[fuller]:  # no room elsewhere: the emptied block stays
        allocator.release(conf, Attachment(container, "eth0"), api)
    assert len(api.store.objects) == 2
    for container in by_block[emptier]:
        allocator.release(conf, Attachment(container, "eth0"), api)
    assert len(api.store.objects) == 1, "one empty block is given back, one is kept"
    assert api.calls["delete"] == 1


def test_a_release_the_api_refuses_keeps_the_block(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="10.9.0.0/26")
    api = FakeApi(FakeBlocks(), "node-a")
    for n in range(5):
        allocate(conf, api, f"c{n}")
    api.down = True
    for n in range(5):  # DEL succeeds whatever the API says
        allocator.release(conf, Attachment(f"c{n}", "eth0"), api)
    state = allocator.pool_state(conf, conf.pools[0])
    assert len(state.blocks()) == 2 and len(api.store.objects) == 2
    api.down = False
    allocator.collect_garbage(conf, set(), api)
    assert len(state.blocks()) == 1 and len(api.store.objects) == 1


def test_gc_deletes_this_nodes_blocks_it_has_no_record_of(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    store = FakeBlocks()
    api = FakeApi(store, "node-a")
    allocate(conf, api, "c0")
    pool = conf.pools[0]
    orphan = ClusterBlock(NETWORK, pool, 7)
    api.create(orphan, "uid-node-a")  # a create whose answer never came back
    FakeApi(store, "node-b").create(ClusterBlock(NETWORK, pool, 8), "uid-node-b")
    allocator.collect_garbage(conf, {Attachment("c0", "eth0")}, api)
    assert orphan.name not in store.objects
    assert len(store.objects) == 2, "the held block and node-b's stay"


# ---------------------------------------------------------------------------------------------
# What the node reports: the metric and doctor


def test_addresses_in_use_counts_allocations_not_block_records(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="10.9.0.0/26")  # 4 per block
    api = FakeApi(FakeBlocks(), "node-a")
    for n in range(7):
        allocate(conf, api, f"c{n}")
    metrics = AgentMetrics(lambda: 0)
    metrics.pools.learn({"name": NETWORK, "ipam": {
        "type": "vpc-attach-ipam", "dataDir": str(tmp_path)}})
    families = {f.name: f for f in metrics.registry.collect()}
    values = {s.labels["pool"]: s.value
              for s in families["vpc_attach_ipam_addresses_in_use"].samples}
    assert values == {f"{NETWORK}/10.9.0.0_26_32": 7}
    assert len(allocator.pool_state(conf, conf.pools[0]).blocks()) == 3


def test_doctor_shows_each_block_and_its_use(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    for n in range(3):
        allocate(conf, api, f"c{n}")
    node = Node(environ={}, cni_conf_dir=str(tmp_path), cni_bin_dir=str(tmp_path),
                metrics_address="", ipam_data_dirs=[str(tmp_path)])
    findings = ipam_blocks(node)
    assert findings[0].check == "ipam.blocks" and findings[0].status == "ok"
    block = next(iter(api.store.objects.values()))
    assert f"{block['spec']['cidr']} 3/16 used ({block['metadata']['name']})" \
        in findings[0].detail
    assert findings[-1].check == "ipam.blocks.api" and findings[-1].status == "skip"


def test_a_held_block_whose_object_vanished_is_created_again_at_the_next_claim(
        tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="10.9.0.0/26")  # 4 per block
    api = FakeApi(FakeBlocks(), "node-a")
    allocate(conf, api, "c0")
    (name,) = api.store.objects
    del api.store.objects[name]  # the Node was deleted and registered again meanwhile
    for n in range(1, 6):  # the held block fills up, the next claim notices
        allocate(conf, api, f"c{n}")
    assert name in api.store.objects and api.store.objects[name]["spec"]["node"] == "node-a"
    state = allocator.pool_state(conf, conf.pools[0])
    held = {b.name: b.uid for b in state.blocks()}
    assert held[name] == api.store.objects[name]["metadata"]["uid"]


@pytest.mark.parametrize("order", ["first-block-last", "first-block-first"])
def test_after_every_del_a_node_keeps_at_most_one_empty_block(tmp_path: Path,
                                                             order: str) -> None:
    # 172.27.0.0/24: blocks of 16; the first block holds 14 (network and gateway kept back).
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    for n in range(20):
        allocate(conf, api, f"c{n}")
    state = allocator.pool_state(conf, conf.pools[0])
    pool = conf.pools[0]
    owners: dict[int, list[str]] = {}
    for record in state.records():
        assert record.attachment is not None
        number = block_of_index(NETWORK, pool, pool.index_of_name(record.name) or 0).number
        owners.setdefault(number, []).append(record.attachment.container_id)
    numbers = sorted(owners, reverse=order == "first-block-last")
    for number in numbers:
        for container in owners[number]:
            allocator.release(conf, Attachment(container, "eth0"), api)
    assert len(state.blocks()) == 1 and len(api.store.objects) == 1


# ---------------------------------------------------------------------------------------------
# Requested addresses (the ips capability; node pools: tests/test_ipam_requested.py)

def allocate_requested(conf: IpamConfig, api: FakeApi, container: str, *ips: str,
                       ) -> list[str]:
    requested = match_pools(conf, requested_ips({"runtimeConfig": {"ips": list(ips)}}, {}))
    return [a.address for a in
            allocator.allocate_all(conf, Attachment(container, "eth0"), api, requested)]


def test_cluster_request_in_an_unclaimed_block_claims_that_block(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")  # blocks of 16
    api = FakeApi(FakeBlocks(), "node-a")
    assert allocate_requested(conf, api, "c1", "172.27.0.200") == ["172.27.0.200/32"]
    (claimed,) = api.store.objects.values()
    assert claimed["spec"]["cidr"] == "172.27.0.192/28" and claimed["spec"]["node"] == "node-a"
    # after the create, the pool's lends are listed: a lent address in it is kept for its claim
    assert api.calls == {"get": 1, "get node": 1, "create": 1, "list pool": 1}
    before = api.requests()
    assert allocate_requested(conf, api, "c2", "172.27.0.201") == ["172.27.0.201/32"]
    assert allocate_requested(conf, api, "c1", "172.27.0.200") == ["172.27.0.200/32"], \
        "a repeated ADD"
    assert api.requests() == before, "a request inside a held block asks the API nothing"


def test_cluster_request_taken_on_this_node_names_the_container(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    allocate_requested(conf, api, "holder", "172.27.0.200")
    with pytest.raises(CniError) as info:
        allocate_requested(conf, api, "other", "172.27.0.200")
    assert info.value.code == IPAM_EXHAUSTED and "'holder'" in info.value.msg


def test_cluster_request_in_another_nodes_block_is_code_102_naming_that_node(
        tmp_path: Path) -> None:
    store = FakeBlocks()
    conf_a = cluster_conf(tmp_path / "a", ipv4_subnet="172.27.0.0/24")
    conf_b = cluster_conf(tmp_path / "b", ipv4_subnet="172.27.0.0/24")
    a, b = FakeApi(store, "node-a"), FakeApi(store, "node-b")
    allocate_requested(conf_a, a, "on-a", "172.27.0.200")
    for address in ("172.27.0.200", "172.27.0.201"):  # taken there, and free there
        with pytest.raises(CniError) as info:
            allocate_requested(conf_b, b, "on-b", address)
        assert info.value.code == IPAM_EXHAUSTED and "'node-a'" in info.value.msg
        assert "172.27.0.192/28" in info.value.msg
    assert not [p for p in (tmp_path / "b").rglob("172.27.0.*") if p.is_file()], \
        "no record on node b"
    assert not list((tmp_path / "b").rglob("blocks/*")), "no claim record left on node b"


def test_cluster_request_racing_another_nodes_claim_is_refused(tmp_path: Path) -> None:
    store = FakeBlocks()
    conf_b = cluster_conf(tmp_path / "b", ipv4_subnet="172.27.0.0/24")
    a, b = FakeApi(store, "node-a"), FakeApi(store, "node-b")
    (pool,) = conf_b.pools
    racing = block_of_index(NETWORK, pool, pool.index_containing(
        ipaddress.ip_address("172.27.0.200")) or 0)
    real_get = b.get

    def get_after_a_won(name: str) -> dict[str, Any] | None:
        if name == racing.name and name not in store.objects:
            a.create(racing, "uid-node-a")  # node a creates it between b's GET and b's POST
            return None
        return real_get(name)

    b.get = get_after_a_won  # type: ignore[method-assign]
    with pytest.raises(CniError) as info:
        allocate_requested(conf_b, b, "on-b", "172.27.0.200")
    assert info.value.code == IPAM_EXHAUSTED and "'node-a'" in info.value.msg
    assert not list((tmp_path / "b").rglob("blocks/*"))


def test_cluster_request_adopts_this_nodes_block_without_a_local_record(tmp_path: Path) -> None:
    store = FakeBlocks()
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(store, "node-a")
    allocate_requested(conf, api, "c1", "172.27.0.200")
    for path in tmp_path.rglob("blocks/*"):
        path.unlink()  # a lost local record: the object still names this node
    assert allocate_requested(conf, api, "c2", "172.27.0.201") == ["172.27.0.201/32"]
    assert len(store.objects) == 1


def test_cluster_del_gives_back_a_block_claimed_for_a_request(tmp_path: Path) -> None:
    conf = cluster_conf(tmp_path, ipv4_subnet="172.27.0.0/24")
    api = FakeApi(FakeBlocks(), "node-a")
    allocate(conf, api, "c1")  # the node's first block, by the usual claim
    allocate_requested(conf, api, "c2", "172.27.0.70")
    allocate_requested(conf, api, "c3", "172.27.0.200")
    assert len(api.store.objects) == 3
    allocator.release(conf, Attachment("c2", "eth0"), api)
    cidrs = sorted(o["spec"]["cidr"] for o in api.store.objects.values())
    assert "172.27.0.64/28" not in cidrs, "emptied, and the other blocks have a block's room"


# ---------------------------------------------------------------------------------------------
# An IPAMClaim's address lent across nodes (lending.py; the real API and routers:
# e2e/test_claim_moving_between_nodes_as_kubevirt_would.py)

VM_CLAIM = ClaimOwner("vms", "vm-a.blue", "uid-claim-a")
OTHER_VM_CLAIM = ClaimOwner("vms", "vm-b.blue", "uid-claim-b")


def allocate_claimed(conf: IpamConfig, api: FakeApi, container: str, claim: ClaimOwner,
                     *ips: str) -> list[allocator.Allocation]:
    requested = match_pools(conf, requested_ips({"runtimeConfig": {"ips": list(ips)}}, {})) \
        if ips else {}
    return allocator.allocate_all(conf, Attachment(container, "eth0"), api, requested, claim)


def lends(store: FakeBlocks) -> dict[str, dict[str, Any]]:
    return {name: o for name, o in store.objects.items() if block_claims.is_lend(o)}


def three_nodes(tmp_path: Path) -> tuple[FakeBlocks, dict[str, tuple[IpamConfig, FakeApi]]]:
    store = FakeBlocks()
    return store, {node: (cluster_conf(tmp_path / node, ipv4_subnet="172.27.0.0/24"),
                          FakeApi(store, f"node-{node}")) for node in ("a", "b", "c")}


def test_a_claims_address_in_another_nodes_block_is_lent_to_the_node_running_the_vm(
        tmp_path: Path) -> None:
    store, nodes = three_nodes(tmp_path)
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-on-a", VM_CLAIM)]
    allocator.release(nodes["a"][0], Attachment("vm-on-a", "eth0"), nodes["a"][1])  # DEL
    ip = address.split("/")[0]
    (moved,) = allocate_claimed(*nodes["b"], "vm-on-b", VM_CLAIM, ip)
    assert moved.address == address and moved.lend is not None
    ((name, lend),) = lends(store).items()
    holder = next(o for o in store.objects.values() if not block_claims.is_lend(o))
    assert name == moved.lend.name and name.endswith("-lent")
    assert lend["spec"] == {"network": NETWORK, "subnet": "172.27.0.0/24",
                            "allocationPrefixLength": 32, "cidr": f"{ip}/32", "node": "node-b",
                            "lentFrom": holder["metadata"]["name"], "claim": "vms/vm-a.blue",
                            "claimUID": "uid-claim-a"}
    assert lend["metadata"]["labels"][block_claims.LENT_LABEL] == "true"
    assert lend["metadata"]["ownerReferences"][0]["name"] == "node-b"
    assert any(p.is_file() for p in (tmp_path / "a").rglob(ip)), \
        "node a keeps the claim's record: it never hands it out"
    with pytest.raises(CniError) as info:  # node a's own requests cannot take it
        allocate_requested(nodes["a"][0], nodes["a"][1], "other-on-a", ip)
    assert info.value.code == IPAM_EXHAUSTED and "IPAMClaim vms/vm-a.blue" in info.value.msg
    again = allocate_claimed(*nodes["b"], "vm-on-b", VM_CLAIM, ip)
    assert [a.lend for a in again] == [None], "a repeated ADD keeps the lend, makes none"


def test_an_address_lent_to_one_claim_is_code_102_for_another_claim_naming_both(
        tmp_path: Path) -> None:
    _, nodes = three_nodes(tmp_path)
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-on-a", VM_CLAIM)]
    ip = address.split("/")[0]
    allocate_claimed(*nodes["b"], "vm-on-b", VM_CLAIM, ip)
    with pytest.raises(AddressTaken) as info:
        allocate_claimed(*nodes["c"], "other-vm", OTHER_VM_CLAIM, ip)
    assert info.value.code == IPAM_EXHAUSTED
    assert "lent to node 'node-b' for IPAMClaim vms/vm-a.blue" in info.value.msg
    assert not list((tmp_path / "c").rglob("blocks/*")), "nothing recorded on node c"


def test_a_request_without_a_claim_in_another_nodes_block_is_still_102(tmp_path: Path) -> None:
    _, nodes = three_nodes(tmp_path)
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-on-a", VM_CLAIM)]
    with pytest.raises(CniError) as info:
        allocate_requested(nodes["b"][0], nodes["b"][1], "plain", address.split("/")[0])
    assert info.value.code == IPAM_EXHAUSTED and "'node-a'" in info.value.msg
    assert "only an IPAMClaim's addresses are lent" in info.value.msg + info.value.details


def moved_a_to_b_to_c(tmp_path: Path) -> tuple[FakeBlocks,
                                                 dict[str, tuple[IpamConfig, FakeApi]], str]:
    """The claim's VM on node a, then b (borrowed), then c (taken over); its address."""
    store, nodes = three_nodes(tmp_path)
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-1", VM_CLAIM)]
    ip = address.split("/")[0]
    allocator.release(nodes["a"][0], Attachment("vm-1", "eth0"), nodes["a"][1])
    allocate_claimed(*nodes["b"], "vm-2", VM_CLAIM, ip)
    allocator.release(nodes["b"][0], Attachment("vm-2", "eth0"), nodes["b"][1])
    allocate_claimed(*nodes["c"], "vm-3", VM_CLAIM, ip)
    return store, nodes, address


def test_the_lend_follows_the_vm_to_a_third_node_and_is_recalled_when_it_comes_home(
        tmp_path: Path) -> None:
    store, nodes, address = moved_a_to_b_to_c(tmp_path)
    ip = address.split("/")[0]
    assert [o["spec"]["node"] for o in lends(store).values()] == ["node-c"], "taken over"
    allocator.release(nodes["c"][0], Attachment("vm-3", "eth0"), nodes["c"][1])
    (home,) = allocate_claimed(*nodes["a"], "vm-4", VM_CLAIM, ip)  # adopts its own record
    assert home.address == address and home.adopted is not None and home.lend is None
    assert lends(store) == {}, "the holder recalled the lend"


def test_a_failed_adds_undo_deletes_the_lend_it_made(tmp_path: Path) -> None:
    store, nodes = three_nodes(tmp_path)
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-1", VM_CLAIM)]
    conf_b, b = nodes["b"]
    done = allocate_claimed(conf_b, b, "vm-2", VM_CLAIM, address.split("/")[0])
    allocator.undo(conf_b, Attachment("vm-2", "eth0"), done, b)
    assert lends(store) == {}
    assert not list((tmp_path / "b").rglob("blocks/*")), "its local record went too"


def test_freeing_the_claim_drops_the_lends_the_node_made_for_the_caller_to_delete(
        tmp_path: Path) -> None:
    store, nodes = three_nodes(tmp_path)
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-1", VM_CLAIM)]
    conf_b, b = nodes["b"]
    allocate_claimed(conf_b, b, "vm-2", VM_CLAIM, address.split("/")[0])
    dropped: list[Any] = []
    for conf, _ in nodes.values():  # vpc-attach notes a claim's pools; here: visit them
        for state in allocator.pool_states(conf):
            with state.locked():
                records = state.free_claim(VM_CLAIM.uid)
                dropped.extend(lending.forget_lends_of(state, (r.name for r in records)))
    assert [lend.name for lend in dropped] == list(lends(store))
    assert allocate_requested(nodes["a"][0], nodes["a"][1], "next", address.split("/")[0]) \
        == [address], "free again on the holder"


def test_gc_keeps_a_lend_the_node_records_and_deletes_one_it_does_not(tmp_path: Path) -> None:
    store, nodes = three_nodes(tmp_path)
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-1", VM_CLAIM)]
    conf_b, b = nodes["b"]
    allocate_claimed(conf_b, b, "vm-2", VM_CLAIM, address.split("/")[0])
    allocator.collect_garbage(conf_b, {Attachment("vm-2", "eth0")}, b)
    assert len(lends(store)) == 1, "recorded: kept"
    for path in (tmp_path / "b").rglob("blocks/*-lent"):
        path.unlink()  # the local record lost
    allocator.collect_garbage(conf_b, {Attachment("vm-2", "eth0")}, b)
    assert lends(store) == {}, "a lend naming this node without a record is deleted"


class ListingClient:
    """The doctor's API client, listing the IPAMBlocks of a FakeBlocks by label."""

    def __init__(self, store: FakeBlocks) -> None:
        self.store = store

    def list(self, _resource: Any, *, deadline: Any, labels: str = "") -> list[dict[str, Any]]:
        key, value = labels.split("=")
        return [o for o in self.store.objects.values()
                if o["metadata"]["labels"].get(key) == value]

    def close(self) -> None:
        pass


def test_doctor_shows_the_claims_held_the_addresses_borrowed_and_those_lent_out(
        tmp_path: Path) -> None:
    store, nodes = three_nodes(tmp_path)
    for name, (conf, _) in nodes.items():  # each node's ipamDataRoot: where claims are noted
        nodes[name] = (replace(conf, data_root=str(tmp_path / name)), nodes[name][1])
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-1", VM_CLAIM)]
    allocator.release(nodes["a"][0], Attachment("vm-1", "eth0"), nodes["a"][1])
    allocate_claimed(*nodes["b"], "vm-2", VM_CLAIM, address.split("/")[0])

    def doctor(name: str) -> dict[str, str]:
        node = Node(environ={IPAM_DATA_ROOT_ENV: str(tmp_path / name)},
                    cni_conf_dir=str(tmp_path), cni_bin_dir=str(tmp_path), metrics_address="",
                    ipam_data_dirs=[str(tmp_path / name)],
                    settings=HostSettings(node_name=f"node-{name}"),
                    client=ListingClient(store))  # type: ignore[arg-type]
        return {f.check: f.detail for f in ipam_claims(node)}

    ip = address.split("/")[0]
    on_a, on_b = doctor("a"), doctor("b")
    assert f"vms/vm-a.blue: {ip} (kept for the claim's next Pod)" in on_a["ipam.claims"]
    assert f"{ip}/32 to node 'node-b' for IPAMClaim vms/vm-a.blue" in on_a["ipam.lends.out"]
    assert f"vms/vm-a.blue: {ip} (attached to vm-2/eth0)" in on_b["ipam.claims"]
    assert f"borrowed for IPAMClaims' VMs: {ip}/32" in on_b["ipam.lends.borrowed"]


def test_a_node_claiming_the_block_of_a_deleted_holder_keeps_the_lent_address_for_the_claim(
        tmp_path: Path) -> None:
    store, nodes = three_nodes(tmp_path)
    conf_c, c = nodes["c"]
    conf_c = replace(conf_c, data_root=str(tmp_path / "c"))
    (address,) = [a.address for a in allocate_claimed(*nodes["a"], "vm-1", VM_CLAIM)]
    allocator.release(nodes["a"][0], Attachment("vm-1", "eth0"), nodes["a"][1])
    ip = ipaddress.ip_address(address.split("/")[0])
    allocate_claimed(*nodes["b"], "vm-2", VM_CLAIM, str(ip))
    holder = next(n for n, o in store.objects.items() if not block_claims.is_lend(o))
    del store.objects[holder]  # node a's Node deleted: the garbage collector took its block
    neighbour = str(ip + 1)  # node c asks for another address of that block: it claims it
    assert allocate_requested(conf_c, c, "pod", neighbour) == [f"{neighbour}/32"]
    assert store.objects[holder]["spec"]["node"] == "node-c"
    state = allocator.pool_states(conf_c)[0]
    assert [r.claim for r in state.records() if r.name == str(ip)] == [VM_CLAIM], \
        "kept as the claim's record on the block's new holder"
    with pytest.raises(CniError) as info:
        allocate_requested(conf_c, c, "other", str(ip))
    assert info.value.code == IPAM_EXHAUSTED and "IPAMClaim vms/vm-a.blue" in info.value.msg
    assert allocator.free_claim(str(tmp_path / "c"), VM_CLAIM.uid, 5) == \
        [f"{state.directory}/{ip}"], "noted: freed with the claim"


def test_gc_on_a_former_borrower_forgets_the_lend_and_the_claims_record_there(
        tmp_path: Path) -> None:
    store, nodes, address = moved_a_to_b_to_c(tmp_path)
    ip = address.split("/")[0]  # took the lend over
    conf_b, b = nodes["b"]
    (state_b,) = allocator.pool_states(conf_b)
    before = len(store.objects)
    allocator.collect_garbage(conf_b, set(), b)
    assert lending.borrowed(state_b) == [] and state_b.read_record(ip) is None
    assert len(store.objects) == before, "node c's lend untouched"
    conf_c, c = nodes["c"]
    allocator.collect_garbage(conf_c, {Attachment("vm-3", "eth0")}, c)
    (state_c,) = allocator.pool_states(conf_c)
    assert len(lending.borrowed(state_c)) == 1, "the lend naming this node stays"
    assert allocate_claimed(conf_b, b, "vm-4", VM_CLAIM, ip)[0].lend is not None, \
        "the claim's next Pod on node b borrows again"


def ipamclaim_object(owner: ClaimOwner, *ips: str, network: str = NETWORK) -> dict[str, Any]:
    """An IPAMClaim as the API lists it, its status written by the IPAM that allocated."""
    return {"apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
            "metadata": {"namespace": owner.namespace, "name": owner.name, "uid": owner.uid},
            "spec": {"network": network, "interface": "pod16367aacb67"},
            "status": {"ips": list(ips)}}


def holder_deleted_while_the_vm_runs_nowhere(
        tmp_path: Path, subnet: str) -> tuple[FakeBlocks, IpamConfig, FakeApi, str]:
    """The claim's VM ran on node a and stopped (no Pod anywhere, so no lend); then node a's
    Node was deleted, the garbage collector taking its block. Node c (its network config
    allowing persistent IPs) and the claim's address."""
    store = FakeBlocks()
    conf_a = cluster_conf(tmp_path / "a", ipv4_subnet=subnet)
    a = FakeApi(store, "node-a")
    (address,) = [x.address for x in allocate_claimed(conf_a, a, "vm-1", VM_CLAIM)]
    allocator.release(conf_a, Attachment("vm-1", "eth0"), a)  # the VM's Pod deleted
    store.ipamclaims.append(ipamclaim_object(VM_CLAIM, address))
    store.ipamclaims.append(ipamclaim_object(OTHER_VM_CLAIM, address, network="elsewhere"))
    store.objects.clear()  # node a's Node deleted: its block with it
    conf_c = replace(cluster_conf(tmp_path / "c", ipv4_subnet=subnet), persistent_ips=True,
                     data_root=str(tmp_path / "c"))
    return store, conf_c, FakeApi(store, "node-c"), address


def test_a_block_claimed_after_its_holder_went_keeps_the_address_of_a_claim_running_nowhere(
        tmp_path: Path) -> None:
    # A pool of blocks of one address: node c's plain ADDs claim every block (claim()), the
    # dead holder's one among them, until the pool is full.
    _, conf_c, c, address = holder_deleted_while_the_vm_runs_nowhere(tmp_path, "172.27.0.0/28")
    handed = [allocate(conf_c, c, f"pod-{n}")[0] for n in range(12)]
    with pytest.raises(CniError) as full:
        allocate(conf_c, c, "one-too-many")
    assert full.value.code == IPAM_EXHAUSTED
    assert address not in handed, "the claim's address is never handed to another Pod"
    assert c.calls["list ipamclaims"] == c.calls["create"] == 13, "listed once per block claim"
    (state,) = allocator.pool_states(conf_c)
    ip = address.split("/")[0]
    assert [r.claim for r in state.records() if r.name == ip] == [VM_CLAIM]
    with pytest.raises(CniError) as info:
        allocate_requested(conf_c, c, "intruder", ip)
    assert info.value.code == IPAM_EXHAUSTED and "IPAMClaim vms/vm-a.blue" in info.value.msg
    (home,) = allocate_claimed(conf_c, c, "vm-2", VM_CLAIM, ip)
    assert home.address == address and home.adopted is not None, "the VM's next Pod gets it"
    assert allocator.free_claim(str(tmp_path / "c"), VM_CLAIM.uid, 5) == \
        [f"{state.directory}/{ip}"], "noted: freed with the claim"


def test_a_block_claimed_for_a_request_keeps_the_address_of_a_claim_running_nowhere(
        tmp_path: Path) -> None:
    _, conf_c, c, address = holder_deleted_while_the_vm_runs_nowhere(tmp_path, "172.27.0.0/24")
    ip = ipaddress.ip_address(address.split("/")[0])
    assert allocate_requested(conf_c, c, "pod", str(ip + 1)) == [f"{ip + 1}/32"]
    with pytest.raises(CniError) as info:
        allocate_requested(conf_c, c, "intruder", str(ip))
    assert info.value.code == IPAM_EXHAUSTED and "IPAMClaim vms/vm-a.blue" in info.value.msg


def test_a_network_without_persistent_ips_never_lists_ipamclaims(tmp_path: Path) -> None:
    _, conf_c, c, _ = holder_deleted_while_the_vm_runs_nowhere(tmp_path, "172.27.0.0/28")
    allocate(replace(conf_c, persistent_ips=False), c, "pod")
    assert c.calls["list ipamclaims"] == 0 and c.calls["create"] == 1


def test_ipamclaims_that_cannot_be_listed_leave_no_block_and_no_record(tmp_path: Path) -> None:
    store, conf_c, c, _ = holder_deleted_while_the_vm_runs_nowhere(tmp_path, "172.27.0.0/28")

    def refused(network: str) -> list[dict[str, Any]]:
        raise CniError(TRY_AGAIN_LATER, "cannot list the IPAMClaims whose addresses a block "
                       "keeps: forbidden")

    c.network_claims = refused  # type: ignore[method-assign]
    with pytest.raises(CniError) as info:
        allocate(conf_c, c, "pod")
    assert info.value.code == TRY_AGAIN_LATER
    assert store.objects == {} and not list((tmp_path / "c").rglob("blocks/*"))


def test_the_network_configs_allow_persistent_ips_reaches_the_ipam_config() -> None:
    network = {"cniVersion": "1.1.0", "name": NETWORK,
               "ipam": {"type": "vpc-attach-ipam", "ipv4_subnet": "172.27.0.0/24",
                        "scope": "cluster"}}
    assert not parse_network(network).persistent_ips
    assert parse_network({**network, "allowPersistentIPs": True}).persistent_ips
    assert not parse_network({**network, "allowPersistentIPs": "true"}).persistent_ips
