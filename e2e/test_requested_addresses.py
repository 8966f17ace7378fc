"""Requested addresses and MACs (the `ips` and `mac` capabilities, SPEC §16) end to end: the real
libcni client (cnitool) fills `runtimeConfig` from CAP_ARGS for the capabilities a conflist
declares and passes CNI_ARGS, the real `vpc-attach` executable (in-process or through the
agent) attaches in real network namespaces, vpc-attach-ipam reserves on disk and, for cluster
pools, through IPAMBlocks on the real control plane; the reference host-local gets the request
unchanged. Refusals are read as the JSON error a runtime gets (the executable's stdout: cnitool
prints the message without the code). Everything is checked with `ip -j` and the files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS
from e2e.harness.kernel import links_in, run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.nodes import node_objects
from e2e.harness.plugin import Plugin, base_conf, host_local, host_local_reservations, with_prev
from tests.ipam_files import IpamFiles

pytestmark = [pytest.mark.root, pytest.mark.both_paths]
MAC = "0a:58:0a:2a:00:07"
CAPABILITIES = {"ips": True, "mac": True}


def records(data_dir: Path) -> dict[str, str]:
    """address -> 'containerID@ifname' of every vpc-attach-ipam record under data_dir."""
    return IpamFiles.read(data_dir).holders()


def pod_link(netns: str, ifname: str = "eth0") -> dict[str, Any]:
    """`ip -j addr show` of ifname inside netns: its MAC (`address`) and addresses."""
    shown: list[dict[str, Any]] = json.loads(
        run_ip("-n", os.path.basename(netns), "-j", "addr", "show", ifname))
    return shown[0]


def pod_addresses(netns: str) -> set[str]:
    return {a["local"] for a in pod_link(netns)["addr_info"] if a["scope"] == "global"}


def cnitool_container_id(netns: str) -> str:
    """The container ID cnitool gives an attachment: derived from the netns path."""
    return ("cnitool-" + hashlib.sha512(netns.encode()).hexdigest())[:len("cnitool-") + 20]


class Cnitool:
    """One conflist driven through cnitool (libcni), its results cached as runtimes do."""

    def __init__(self, plugin: Plugin, work: Path, stanza: dict[str, Any]) -> None:
        self.plugin = plugin
        self.network = str(stanza["name"])
        self.confdir, self.cache = work / "net.d", work / "cache"
        self.confdir.mkdir(parents=True)
        self.cache.mkdir()
        conflist = {"cniVersion": "1.1.0", "name": self.network,
                    "plugins": [{k: v for k, v in stanza.items()
                                 if k not in ("cniVersion", "name")}]}
        (self.confdir / f"{self.network}.conflist").write_text(json.dumps(conflist))

    def run(self, verb: str, netns: str, *, cap_args: dict[str, Any] | None = None,
            cni_args: str | None = None) -> subprocess.CompletedProcess[str]:
        from e2e.harness.tools.gotools import cnitool_command, cnitool_env
        env = cnitool_env(self.plugin.cni_bin, self.confdir, ifname="eth0", cni_args=cni_args,
                          cap_args=cap_args, base=self.plugin.env("ADD", "", "", "eth0"))
        for key in ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS"):
            env.pop(key, None)
        return subprocess.run(cnitool_command(verb, self.network, netns, cache_dir=self.cache),
                              env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    def add(self, netns: str, **kw: Any) -> dict[str, Any]:
        added = self.run("add", netns, **kw)
        assert added.returncode == 0, added.stderr + added.stdout
        result: dict[str, Any] = json.loads(added.stdout)
        return result

    def ok(self, verb: str, netns: str, **kw: Any) -> None:
        done = self.run(verb, netns, **kw)
        assert done.returncode == 0, done.stderr + done.stdout


def ipam_pools(data_dir: Path, **extra: Any) -> dict[str, Any]:
    return {"type": "vpc-attach-ipam", "dataDir": str(data_dir), "ipv4_subnet": "10.42.0.0/24",
            "ipv6_subnet": "fd00:42::/64", **extra}


@contextlib.contextmanager
def netnses(count: int) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(temporary_netns("vpa-req")) for _ in range(count)]


# --- node pools through cnitool -----------------------------------------------------------------

def test_a_free_requested_address_and_mac_are_what_the_pod_gets(plugin: Plugin, vpc: str,
                                                                 netns: str,
                                                                 tmp_path: Path) -> None:
    stanza = base_conf(vpc, "42", capabilities=CAPABILITIES, ipam=ipam_pools(tmp_path / "ipam"))
    tool = Cnitool(plugin, tmp_path, stanza)
    result = tool.add(netns, cap_args={"ips": ["10.42.0.77/24", "fd00:42::7:0:0"], "mac": MAC})
    assert sorted(ip["address"] for ip in result["ips"]) == ["10.42.0.77/32",
                                                             "fd00:42::7:0:0/96"]
    pod = next(i for i in result["interfaces"] if i.get("sandbox") == netns)
    assert pod["mac"] == MAC
    link = pod_link(netns)
    assert link["address"] == MAC, "the MAC read back from the pod netns"
    assert pod_addresses(netns) == {"10.42.0.77", "fd00:42::7:0:0"}
    holder = f"{cnitool_container_id(netns)}@eth0"
    assert records(tmp_path / "ipam") == {"10.42.0.77": holder, "fd00:42::7:0:0": holder}
    host = naming.host_link_name(vpc, "42")
    assert f"10.42.0.77 lladdr {MAC} PERMANENT" in run_ip("neigh", "show", "dev", host)
    tool.ok("check", netns)
    tool.ok("del", netns)
    assert records(tmp_path / "ipam") == {}
    assert host not in links_in()


@pytest.mark.parametrize("form", ["runtimeConfig", "args", "CNI_ARGS"])
def test_the_three_forms_in_their_order(plugin: Plugin, vpc: str, netns: str, tmp_path: Path,
                                        form: str) -> None:
    """runtimeConfig (CAP_ARGS, for the declared capabilities) wins over args.cni in the
    conflist, which wins over CNI_ARGS; each form alone is read."""
    wanted = {"runtimeConfig": ("10.42.0.10", "0a:58:00:00:00:10"),
              "args": ("10.42.0.20", "0a:58:00:00:00:20"),
              "CNI_ARGS": ("10.42.0.30", "0a:58:00:00:00:30")}
    stanza = base_conf(vpc, "43", capabilities=CAPABILITIES,
                       ipam=ipam_pools(tmp_path / "ipam", address_families=["IPv4"]))
    if form in ("runtimeConfig", "args"):
        address, mac = wanted["args"]
        stanza["args"] = {"cni": {"ips": [address], "mac": mac}}
    cap_args = None
    if form == "runtimeConfig":
        address, mac = wanted["runtimeConfig"]
        cap_args = {"ips": [f"{address}/24"], "mac": mac}
    address, mac = wanted["CNI_ARGS"]
    tool = Cnitool(plugin, tmp_path, stanza)
    result = tool.add(netns, cap_args=cap_args, cni_args=f"IP={address};MAC={mac}")
    expected_address, expected_mac = wanted[form]
    assert [ip["address"] for ip in result["ips"]] == [f"{expected_address}/32"]
    assert pod_link(netns)["address"] == expected_mac
    assert pod_addresses(netns) == {expected_address}
    tool.ok("del", netns)


# --- refusals, as the runtime reads them ----------------------------------------------------------

def test_an_address_another_container_holds_is_code_102_naming_it(plugin: Plugin, vpc: str,
                                                                   tmp_path: Path) -> None:
    pools = ipam_pools(tmp_path / "ipam")
    request = {"ips": ["10.42.0.77"], "mac": MAC}
    holder_conf = base_conf(vpc, "44", ipam=pools, runtimeConfig=request)
    other_conf = base_conf(vpc, "45", ipam=pools, runtimeConfig=request)
    with netnses(2) as (first, second):
        held = plugin.ok("ADD", holder_conf, container_id="holder-ctr", netns=first)
        answer = plugin.call("ADD", other_conf, container_id="other-ctr", netns=second)
        print(f"\ntaken: code {answer.code}: {answer.body['msg']} ({answer.body['details']})")
        assert answer.code == 102, answer.stdout
        assert "10.42.0.77/32" in answer.body["msg"]
        assert "'holder-ctr'" in answer.body["msg"] and "'eth0'" in answer.body["msg"]
        assert links_in(second) == {"lo"}, "the refused ADD left nothing in its netns"
        assert naming.host_link_name(vpc, "45") not in links_in()
        assert records(tmp_path / "ipam")["10.42.0.77"] == "holder-ctr@eth0"
        assert pod_addresses(first) >= {"10.42.0.77"}, "the holder keeps its address"
        assert plugin.call("CHECK", with_prev(holder_conf, held), container_id="holder-ctr",
                           netns=first).status == 0
        plugin.ok("DEL", other_conf, container_id="other-ctr", netns=second)
        assert records(tmp_path / "ipam")["10.42.0.77"] == "holder-ctr@eth0", \
            "DEL of the refused container frees nothing of the holder's"
        plugin.ok("DEL", holder_conf, container_id="holder-ctr", netns=first)


@pytest.mark.parametrize(("ips", "needle"), [
    (["10.43.0.5"], "outside every pool"),  # another tenant's pool, not this config's
    (["10.42.0.1"], "reserved"),  # the pool's gateway
    (["fd00:42::7:0:1"], "not an address pool fd00:42::/64 hands out"),
    (["10.42.0.5", "10.42.0.6"], "both in pool"),
    (["fd00:42::1%/../../victim"], "zone index"),
])
def test_what_the_pool_would_not_hand_out_is_code_7_and_changes_nothing(
        plugin: Plugin, vpc: str, netns: str, tmp_path: Path, ips: list[str],
        needle: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("kept")
    conf = base_conf(vpc, "46", ipam=ipam_pools(tmp_path / "ipam"), runtimeConfig={"ips": ips})
    answer = plugin.call("ADD", conf, container_id="c1", netns=netns)
    print(f"\n{ips}: code {answer.code}: {answer.body['msg']}")
    assert answer.code == 7 and needle in answer.body["msg"], answer.stdout
    assert "runtimeConfig.ips" in answer.body["msg"]
    assert links_in(netns) == {"lo"} and naming.host_link_name(vpc, "46") not in links_in()
    assert records(tmp_path / "ipam") == {} and victim.read_text() == "kept"


@pytest.mark.parametrize(("where", "extra"), [
    ("runtimeConfig.mac", {"runtimeConfig": {"mac": "0a-58:00:00:00:01"}}),
    ("args.cni.mac", {"args": {"cni": {"mac": "0a:58:00:00:00"}}}),
    ("CNI_ARGS 'MAC'", {}),
])
def test_a_malformed_mac_is_code_7_naming_its_form(plugin: Plugin, vpc: str, netns: str,
                                                   tmp_path: Path, where: str,
                                                   extra: dict[str, Any]) -> None:
    conf = base_conf(vpc, "47", ipam=ipam_pools(tmp_path / "ipam"), **extra)
    answer = plugin.call("ADD", conf, container_id="c1", netns=netns,
                         CNI_ARGS="MAC=0a:58:zz:00:00:01")
    print(f"\n{where}: code {answer.code}: {answer.body['msg']}")
    assert answer.code == 7 and where in answer.body["msg"], answer.stdout
    assert links_in(netns) == {"lo"} and records(tmp_path / "ipam") == {}


def test_a_failed_add_frees_the_requested_address_it_reserved(plugin: Plugin, vpc: str,
                                                              netns: str,
                                                              tmp_path: Path) -> None:
    ns = os.path.basename(netns)
    run_ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "other0")
    conf = base_conf(vpc, "48", ipam=ipam_pools(tmp_path / "ipam"),
                     runtimeConfig={"ips": ["10.42.0.88"]})
    answer = plugin.call("ADD", conf, container_id="c1", netns=netns)
    assert answer.code == 105, answer.stdout  # eth0 is not ours: after IPAM reserved
    assert records(tmp_path / "ipam") == {}, "rollback released what this ADD reserved"
    run_ip("-n", ns, "link", "del", "eth0")
    result = plugin.ok("ADD", conf, container_id="c2", netns=netns)
    assert "10.42.0.88/32" in [ip["address"] for ip in result["ips"]]
    plugin.ok("DEL", conf, container_id="c2", netns=netns)


def test_a_tap_gets_the_requested_mac_and_address(plugin: Plugin, vpc: str, netns: str,
                                                  tmp_path: Path) -> None:
    conf = base_conf(vpc, "49", attachment="tap", ipam=ipam_pools(tmp_path / "ipam"),
                     runtimeConfig={"ips": ["fd00:42::9:0:0", "10.42.0.99"], "mac": MAC})
    result = plugin.ok("ADD", conf, container_id="vm-1", netns=netns)
    tap = naming.host_link_name(vpc, "49")
    assert [(i["name"], i["mac"]) for i in result["interfaces"]] == [(tap, MAC)]
    shown = json.loads(run_ip("-j", "link", "show", tap))[0]
    assert shown["address"] == MAC
    assert sorted(ip["address"] for ip in result["ips"]) == ["10.42.0.99/32",
                                                             "fd00:42::9:0:0/96"]
    assert plugin.call("CHECK", with_prev(conf, result), container_id="vm-1",
                       netns=netns).status == 0
    plugin.ok("DEL", conf, container_id="vm-1", netns=netns)
    assert records(tmp_path / "ipam") == {}


# --- delegated IPAM: the reference host-local -----------------------------------------------------

def test_host_local_gets_the_request_unchanged_and_honours_it(plugin: Plugin, vpc: str,
                                                              tmp_path: Path) -> None:
    data_dir = tmp_path / "host-local"
    stanza = base_conf(vpc, "50", capabilities=CAPABILITIES,
                       ipam=host_local(data_dir, "fd00:50::/64", "10.50.0.0/24"))
    tool = Cnitool(plugin, tmp_path, stanza)
    with netnses(4) as (first, second, third, fourth):
        result = tool.add(first, cap_args={"ips": ["10.50.0.9/24", "fd00:50::9"], "mac": MAC})
        assert sorted(ip["address"] for ip in result["ips"]) == ["10.50.0.9/32",
                                                                 "fd00:50::9/64"]
        assert pod_link(first)["address"] == MAC
        assert {"10.50.0.9", "fd00:50::9"} <= set(host_local_reservations(data_dir,
                                                                          tool.network))
        # CNI_ARGS IP reaches host-local too (it reads one address from it).
        other = base_conf(vpc, "51", ipam=host_local(data_dir, "10.50.0.0/24"),
                          name=tool.network)
        got = plugin.ok("ADD", other, container_id="c2", netns=second, CNI_ARGS="IP=10.50.0.11")
        assert [ip["address"] for ip in got["ips"]] == ["10.50.0.11/32"]
        in_args = base_conf(vpc, "53", ipam=host_local(data_dir, "10.50.0.0/24"),
                            name=tool.network, args={"cni": {"ips": ["10.50.0.12"]}})
        got = plugin.ok("ADD", in_args, container_id="c4", netns=fourth)
        assert [ip["address"] for ip in got["ips"]] == ["10.50.0.12/32"]
        plugin.ok("DEL", in_args, container_id="c4", netns=fourth)
        taken = plugin.call("ADD", base_conf(vpc, "52", ipam=host_local(data_dir, "10.50.0.0/24"),
                                             name=tool.network,
                                             runtimeConfig={"ips": ["10.50.0.9"]}),
                            container_id="c3", netns=third)
        print(f"\nhost-local, taken: code {taken.code}: {taken.body['msg']}")
        assert taken.status != 0 and "10.50.0.9" in taken.body["msg"], taken.stdout
        assert links_in(third) == {"lo"}
        plugin.ok("DEL", other, container_id="c2", netns=second)
        tool.ok("del", first)
        assert host_local_reservations(data_dir, tool.network) == []


# --- cluster pools on the real control plane ----------------------------------------------------

@pytest.mark.cluster
def test_a_cluster_pool_reserves_a_request_in_a_block_of_this_node_only(
        kube: Kube, cluster: Any, plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    """Two simulated nodes share one pool: node 1 gets the requested address (claiming the
    block that holds it), its other containers and node 2 are refused naming the holder."""
    network = f"req-{vpc.lower()}"
    pools = {"type": "vpc-attach-ipam", "scope": "cluster", "ipv4_subnet": "172.29.0.0/24",
             "ipv6_subnet": "fd00:29::/64"}
    with node_objects(kube, 2) as (node1, node2), netnses(3) as (pod1, pod2, pod3):
        def on(node: str) -> dict[str, str]:
            return {"VPC_ATTACH_NODE_NAME": node,
                    "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
                    "VPC_ATTACH_TENANCY": "off"}

        def conf(att: str, node: str, **extra: Any) -> dict[str, Any]:
            return base_conf(vpc, att, name=network, capabilities=CAPABILITIES,
                             ipam={**pools, "dataDir": str(tmp_path / node)}, **extra)

        plugin.environ.update(on(node1))
        tool = Cnitool(plugin, tmp_path / "tool", conf("53", node1))
        result = tool.add(pod1, cap_args={"ips": ["172.29.0.200/24"], "mac": MAC})
        assert "172.29.0.200/32" in [ip["address"] for ip in result["ips"]]
        assert pod_link(pod1)["address"] == MAC
        blocks = kube.list(IPAM_BLOCKS.path(), fields=f"spec.network={network}")
        held = {b["spec"]["cidr"]: b["spec"]["node"] for b in blocks}
        assert held.get("172.29.0.192/28") == node1, held
        tool.ok("check", pod1)

        request = {"ips": ["172.29.0.200"]}
        same_node = plugin.call("ADD", conf("54", node1, runtimeConfig=request),
                                container_id="other-ctr", netns=pod2)
        print(f"\ncluster, taken on the node: code {same_node.code}: {same_node.body['msg']}")
        assert same_node.code == 102, same_node.stdout
        assert f"'{cnitool_container_id(pod1)}'" in same_node.body["msg"]

        for address in ("172.29.0.200", "172.29.0.201"):  # taken there; free there
            other_node = plugin.call("ADD", conf("55", node2, runtimeConfig={"ips": [address]}),
                                     container_id="on-node2", netns=pod3, **on(node2))
            print(f"cluster, {address} from {node2}: code {other_node.code}: "
                  f"{other_node.body['msg']}")
            assert other_node.code == 102, other_node.stdout
            assert f"'{node1}'" in other_node.body["msg"]
            assert links_in(pod3) == {"lo"}
        assert not [p for p in (tmp_path / node2).rglob("172.29.*") if p.is_file()], \
            "node 2 recorded nothing"

        outside = plugin.call("ADD", conf("56", node1, runtimeConfig={"ips": ["172.30.0.5"]}),
                              container_id="c-out", netns=pod2)
        print(f"cluster, outside: code {outside.code}: {outside.body['msg']}")
        assert outside.code == 7 and "outside every pool" in outside.body["msg"]

        tool.ok("del", pod1)
        assert "172.29.0.200" not in records(tmp_path / node1)
        again = plugin.ok("ADD", conf("54", node1, runtimeConfig=request),
                          container_id="other-ctr", netns=pod2)
        assert "172.29.0.200/32" in [ip["address"] for ip in again["ips"]]
        plugin.ok("DEL", conf("54", node1), container_id="other-ctr", netns=pod2)
