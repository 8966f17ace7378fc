"""Requested addresses (the `ips` capability, SPEC §16) in vpc-attach-ipam: matched to the
config's pools, reserved for the container under the pool's lock, refused with code 7 outside
what the config hands out and with code 102 naming the holder when taken. Node pools through
the dispatcher (as the executable answers); cluster pools in tests/test_ipam_cluster.py, the
real API server and kernel in e2e/test_requested_addresses.py. No root."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_plugin import dispatch
from cni_plugin.core.request import Request
from cni_plugin.ipam.plugin.config import IpamConfig, parse_ipam
from cni_plugin.ipam.plugin.requests import match_pools
from netconf.capabilities import requested_ips
from netconf.errors import INVALID_CONFIG, IPAM_EXHAUSTED, CniError
from netconf.host import IPAM_DATA_ROOT_ENV
from tests.ipam_files import IpamFiles

DATA_ROOT = tempfile.gettempdir()  # this node's ipamDataRoot: every tmp_path is below it
NETWORK = "net1"


def network(data_dir: Path, runtime_ips: list[str] | None = None, **ipam: Any,
            ) -> dict[str, Any]:
    conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": NETWORK, "type": "vpc-attach",
                            "ipam": {"type": "vpc-attach-ipam", "dataDir": str(data_dir), **ipam}}
    if runtime_ips is not None:
        conf["runtimeConfig"] = {"ips": runtime_ips}
    return conf


def call(command: str, conf: dict[str, Any], container_id: str = "c1", ifname: str = "eth0",
         **env: str) -> tuple[int, dict[str, Any] | None]:
    """The vpc-attach-ipam executable's answer, in this process."""
    environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname,
               "CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin",
               IPAM_DATA_ROOT_ENV: DATA_ROOT, **env}
    outcome = dispatch.run(Request(environ=environ, stdin=json.dumps(conf).encode()),
                           dispatch.ipam_verbs, log_line=False)
    return outcome.status, outcome.payload


def added(conf: dict[str, Any], container_id: str = "c1", **env: str) -> list[str]:
    status, answer = call("ADD", conf, container_id, **env)
    assert status == 0 and answer is not None, answer
    return [ip["address"] for ip in answer["ips"]]


def refused(conf: dict[str, Any], container_id: str = "c2", **env: str) -> dict[str, Any]:
    status, answer = call("ADD", conf, container_id, **env)
    assert status != 0 and answer is not None, answer
    return answer


def records(data_dir: Path) -> dict[str, str]:
    """address -> 'containerID@ifname' of every vpc-attach-ipam record under data_dir."""
    return IpamFiles.read(data_dir).holders()


# --- node pools: the three outcomes ---------------------------------------------------------------

def test_a_free_address_inside_the_pool_is_reserved_for_the_container(tmp_path: Path) -> None:
    conf = network(tmp_path, ["10.9.0.77/24", "fd00:9::7:0:0"], ipv4_subnet="10.9.0.0/24",
                   ipv6_subnet="fd00:9::/64")
    assert added(conf) == ["fd00:9::7:0:0/96", "10.9.0.77/32"]
    assert records(tmp_path) == {"fd00:9::7:0:0": "c1@eth0", "10.9.0.77": "c1@eth0"}


def test_a_repeated_add_of_the_same_container_gets_the_same_address(tmp_path: Path) -> None:
    conf = network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24")
    assert added(conf) == added(conf) == ["10.9.0.77/32"]
    assert records(tmp_path) == {"10.9.0.77": "c1@eth0"}


def test_only_the_requested_family_is_chosen_the_other_is_the_next_free(tmp_path: Path) -> None:
    conf = network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24", ipv6_subnet="fd00:9::/64")
    assert added(conf) == ["fd00:9::1:0:0/96", "10.9.0.77/32"]


def test_an_address_another_container_holds_is_code_102_naming_it_and_the_holder(
        tmp_path: Path) -> None:
    conf = network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24")
    added(conf, "holder")
    answer = refused(conf, "other")
    assert answer["code"] == IPAM_EXHAUSTED
    assert "10.9.0.77/32" in answer["msg"] and "'holder'" in answer["msg"]
    assert "'eth0'" in answer["msg"] and "runtimeConfig.ips" in answer["details"]
    assert records(tmp_path) == {"10.9.0.77": "holder@eth0"}, "the holder keeps it"


def test_an_address_held_by_another_interface_of_the_same_container_is_taken(
        tmp_path: Path) -> None:
    conf = network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24")
    added(conf, "c1")
    status, answer = call("ADD", conf, "c1", ifname="net1")
    assert status != 0 and answer is not None and answer["code"] == IPAM_EXHAUSTED
    assert "'net1'" not in answer["msg"] and "'eth0'" in answer["msg"]


@pytest.mark.parametrize(("ips", "needle"), [
    (["10.8.0.5"], "outside every pool"),
    (["172.16.0.1/12"], "outside every pool"),
    (["fd00:9::7:0:0"], "outside every pool"),  # an IPv6 request, and no IPv6 pool
    (["::ffff:10.9.0.5"], "outside every pool"),  # IPv4-mapped is IPv6, not the IPv4 pool
    (["10.9.0.0"], "reserved"), (["10.9.0.1"], "reserved"), (["10.9.0.255"], "reserved"),
    (["10.9.0.5", "10.9.0.6"], "at most one"),
])
def test_what_the_config_would_not_hand_out_is_code_7_naming_the_source(
        tmp_path: Path, ips: list[str], needle: str) -> None:
    answer = refused(network(tmp_path, ips, ipv4_subnet="10.9.0.0/24"))
    assert answer["code"] == INVALID_CONFIG, answer
    assert needle in answer["msg"] + answer["details"], answer
    assert "runtimeConfig.ips" in answer["msg"]
    assert not tmp_path.exists() or records(tmp_path) == {}, "refused before any write"


@pytest.mark.parametrize(("ips", "needle"), [
    (["fd00:9::"], "reserved"), (["fd00:9::1"], "reserved"),  # block 0: network, gateway
    (["fd00:9::7:0:1"], "request fd00:9::7:0:0 for block fd00:9::7:0:0/96"),
])
def test_ipv6_requests_name_a_block_by_its_first_address(tmp_path: Path, ips: list[str],
                                                         needle: str) -> None:
    answer = refused(network(tmp_path, ips, ipv6_subnet="fd00:9::/64"))
    assert answer["code"] == INVALID_CONFIG
    assert needle in answer["msg"] + answer["details"], answer


def test_every_address_of_a_128_pool_can_be_requested(tmp_path: Path) -> None:
    conf = network(tmp_path, ["fd00:9::1234"], ipv6_subnet="fd00:9::/112",
                   ipv6_prefix_length=128)
    assert added(conf) == ["fd00:9::1234/128"]


def test_a_malformed_request_is_code_7_naming_its_form(tmp_path: Path) -> None:
    answer = refused(network(tmp_path, ipv4_subnet="10.9.0.0/24"), CNI_ARGS="IP=10.9.0.300")
    assert answer["code"] == INVALID_CONFIG and "CNI_ARGS 'IP'" in answer["msg"]


def test_a_repeated_add_asking_for_another_address_keeps_its_own_and_is_code_7(
        tmp_path: Path) -> None:
    assert added(network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24")) == \
        ["10.9.0.77/32"]
    answer = refused(network(tmp_path, ["10.9.0.78"], ipv4_subnet="10.9.0.0/24"), "c1")
    assert answer["code"] == INVALID_CONFIG and "holds 10.9.0.77/32" in answer["msg"]
    assert records(tmp_path) == {"10.9.0.77": "c1@eth0"}


# --- node pools: precedence, fixed modes, rollback, release ---------------------------------------

def test_the_three_forms_in_their_order(tmp_path: Path) -> None:
    pools: dict[str, Any] = {"ipv4_subnet": "10.9.0.0/24"}
    args_form = {**network(tmp_path / "a", **pools), "args": {"cni": {"ips": ["10.9.0.20"]}}}
    assert added(args_form, CNI_ARGS="IP=10.9.0.30") == ["10.9.0.20/32"]
    both = {**network(tmp_path / "b", ["10.9.0.10"], **pools),
            "args": {"cni": {"ips": ["10.9.0.20"]}}}
    assert added(both, CNI_ARGS="IP=10.9.0.30") == ["10.9.0.10/32"]
    assert added(network(tmp_path / "c", **pools), CNI_ARGS="IP=10.9.0.30") == ["10.9.0.30/32"]


def test_cni_args_ip_is_ignored_when_a_config_form_is_present_even_if_it_is_bad(
        tmp_path: Path) -> None:
    conf = {**network(tmp_path, ipv4_subnet="10.9.0.0/24"), "args": {"cni": {"ips": ["10.9.0.20"]}}}
    assert added(conf, CNI_ARGS="IP=not-an-address") == ["10.9.0.20/32"]


def test_in_the_addresses_mode_a_request_must_name_a_configured_address(tmp_path: Path) -> None:
    fixed = [{"address": "fd00::5/80"}, {"address": "10.0.0.5/32"}]
    assert added(network(tmp_path, ["10.0.0.5/24"], addresses=fixed)) == \
        ["fd00::5/80", "10.0.0.5/32"]
    answer = refused(network(tmp_path, ["10.0.0.6"], addresses=fixed))
    assert answer["code"] == INVALID_CONFIG and "10.0.0.6" in answer["msg"]
    answer = refused(network(tmp_path, ["fd00::8"], static_ip="fd00::7"))
    assert answer["code"] == INVALID_CONFIG and "fd00::7" in answer["details"]


def test_a_failing_second_pool_releases_the_requested_first_only(tmp_path: Path) -> None:
    pools: dict[str, Any] = {"ipv6_subnet": "fd00:9::/64", "ipv4_subnet": "10.9.0.0/24"}
    added(network(tmp_path, ["10.9.0.77"], **pools), "holder")
    answer = refused(network(tmp_path, ["fd00:9::5:0:0", "10.9.0.77"], **pools), "other")
    assert answer["code"] == IPAM_EXHAUSTED
    assert records(tmp_path) == {"fd00:9::1:0:0": "holder@eth0", "10.9.0.77": "holder@eth0"}
    assert added(network(tmp_path, ["fd00:9::5:0:0"], **pools), "third")[0] == \
        "fd00:9::5:0:0/96", "the rolled-back request is free again"


def test_del_frees_a_requested_address_for_the_next_container(tmp_path: Path) -> None:
    conf = network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24")
    added(conf, "c1")
    assert call("DEL", conf, "c1")[0] == 0
    assert added(conf, "c2") == ["10.9.0.77/32"]


def test_del_and_gc_do_not_read_the_request(tmp_path: Path) -> None:
    conf = network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24")
    added(conf, "c1")
    assert call("DEL", {**conf, "runtimeConfig": {"ips": "garbage"}}, "c1")[0] == 0
    assert records(tmp_path) == {}


def test_check_names_a_held_address_other_than_the_requested_one(tmp_path: Path) -> None:
    added(network(tmp_path, ipv4_subnet="10.9.0.0/24"))
    status, answer = call("CHECK", network(tmp_path, ["10.9.0.77"], ipv4_subnet="10.9.0.0/24"))
    assert status != 0 and answer is not None and "10.9.0.77 was requested" in answer["details"]
    status, _ = call("CHECK", network(tmp_path, ["10.9.0.2"], ipv4_subnet="10.9.0.0/24"))
    assert status == 0


def test_a_request_never_writes_outside_the_pools_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("kept")
    data_dir = tmp_path / "ipam"
    for ips in (["../victim"], ["fd00:9::1%/../../victim"], ["10.9.0.5/../../victim"]):
        answer = refused(network(data_dir, ips, ipv4_subnet="10.9.0.0/24"))
        assert answer["code"] == INVALID_CONFIG, answer
    added(network(data_dir, ["10.9.0.5/24"], ipv4_subnet="10.9.0.0/24"))
    assert victim.read_text() == "kept"
    written = {p.relative_to(data_dir).parts[0] for p in data_dir.rglob("*")}
    assert written == {NETWORK}


# --- the matching, for any pool and address -------------------------------------------------------

def conf_of(subnet: str, length: int) -> IpamConfig:
    key = "ipv6" if ":" in subnet else "ipv4"
    extra = {"ipv6_prefix_length": length} if key == "ipv6" else {}
    return parse_ipam({"type": "vpc-attach-ipam", f"{key}_subnet": subnet, **extra}, "1.1.0",
                      NETWORK)


@given(st.sampled_from([("10.9.0.0/24", 32), ("10.0.0.0/16", 32), ("fd00:9::/64", 96),
                        ("fd00:9::/120", 124), ("fd00:9::/112", 128)]),
       st.ip_addresses())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_a_request_matches_exactly_the_allocation_the_pool_would_answer_or_is_code_7(
        pool_shape: tuple[str, int], ip: Any) -> None:
    conf = conf_of(*pool_shape)
    (pool,) = conf.pools
    requested = requested_ips({"runtimeConfig": {"ips": [str(ip)]}}, {})
    try:
        matched = match_pools(conf, requested)
    except CniError as exc:
        assert exc.code == INVALID_CONFIG
        index = pool.index_containing(ip)
        assert index is None or index in pool.reserved or \
            pool.block(index).network_address != ip
        return
    assert pool.answer(matched[pool].index).split("/")[0] == str(ip)
    assert matched[pool].index not in pool.reserved
