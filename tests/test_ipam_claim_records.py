"""vpc-attach-ipam records owned by an IPAMClaim (SPEC §16): the claim is given in-process
(`verbs.add_owned`, as vpc-attach's delegate gives it), another container of the same claim
adopts its record, anyone else gets code 102 naming the claim, DEL detaches, GC keeps it, only
`allocator.free_claim` frees it, and a failed ADD's undo gives back only what it did. DEL and
GC go through the dispatcher, as the executable answers. The state is read with the harness's
independent reader. No root."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin import dispatch
from cni_plugin.core.request import Request
from cni_plugin.ipam.plugin import allocator, verbs
from cni_plugin.ipam.plugin.store import Attachment, ClaimOwner, PoolState, Record
from netconf.errors import INVALID_CONFIG, IPAM_EXHAUSTED, CniError
from netconf.host import IPAM_DATA_ROOT_ENV
from tests.ipam_files import IpamFiles

CLAIM = ClaimOwner("vms", "vm1.net1", "uid-1")
OTHER_CLAIM = ClaimOwner("vms", "vm2.net1", "uid-2")


def network(data_dir: Path, **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": "net1", "type": "vpc-attach",
            "ipam": {"type": "vpc-attach-ipam", "dataDir": str(data_dir),
                     "ipv6_subnet": "fd00:9::/64", "ipv4_subnet": "10.9.0.0/24"}, **extra}


def request(command: str, conf: dict[str, Any], container_id: str, root: Path | None = None,
            **more: Any) -> Request:
    """root: the node's ipamDataRoot (default: the dataDir itself, the test's own)."""
    environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": "eth0",
               "CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin",
               IPAM_DATA_ROOT_ENV: str(root or conf["ipam"]["dataDir"])}
    return Request(environ=environ, stdin=json.dumps({**conf, **more}).encode())


def add(conf: dict[str, Any], container_id: str, claim: ClaimOwner | None = CLAIM,
        claim_ips: tuple[str, ...] = ()) -> verbs.OwnedAdd:
    return verbs.add_owned(request("ADD", conf, container_id), claim, claim_ips)


def addresses(done: verbs.OwnedAdd) -> list[str]:
    return [str(ip.address) for ip in done.result.ips]


def run(command: str, conf: dict[str, Any], container_id: str, **more: Any) -> int:
    return dispatch.run(request(command, conf, container_id, **more), dispatch.ipam_verbs,
                        log_line=False).status


def files(data_dir: Path) -> IpamFiles:
    return IpamFiles.read(data_dir)


def test_a_claims_reserve_records_the_claim_beside_the_container(tmp_path: Path) -> None:
    conf = network(tmp_path)
    assert addresses(add(conf, "c1")) == ["fd00:9::1:0:0/96", "10.9.0.2/32"]
    state = files(tmp_path)
    assert state.holders() == {"fd00:9::1:0:0": "c1@eth0", "10.9.0.2": "c1@eth0"}
    assert state.claims() == {"fd00:9::1:0:0": "vms/vm1.net1@uid-1",
                              "10.9.0.2": "vms/vm1.net1@uid-1"}


def test_del_of_a_claims_container_detaches_and_keeps_the_record(tmp_path: Path) -> None:
    conf = network(tmp_path)
    add(conf, "c1")
    assert run("DEL", conf, "c1") == 0
    state = files(tmp_path)
    assert state.holders() == {}  # no container holds them
    assert set(state.claims()) == {"fd00:9::1:0:0", "10.9.0.2"}
    assert state.index == {}
    assert run("DEL", conf, "c1") == 0  # idempotent


def test_another_container_of_the_same_claim_adopts_its_records_after_del(tmp_path: Path) -> None:
    conf = network(tmp_path)
    first = addresses(add(conf, "c1"))
    run("DEL", conf, "c1")
    again = add(conf, "c2")
    assert addresses(again) == first
    assert files(tmp_path).holders() == {"fd00:9::1:0:0": "c2@eth0", "10.9.0.2": "c2@eth0"}
    assert all(a.adopted is not None and not a.created for a in again.allocations)


def test_a_recreated_pod_adopts_the_claim_while_the_old_container_still_holds_it(
        tmp_path: Path) -> None:
    conf = network(tmp_path)
    first = addresses(add(conf, "c1"))
    assert addresses(add(conf, "c2")) == first  # the old sandbox's DEL has not come yet
    assert files(tmp_path).holders() == {"fd00:9::1:0:0": "c2@eth0", "10.9.0.2": "c2@eth0"}
    assert files(tmp_path).index_sound()
    assert run("DEL", conf, "c1") == 0  # the late DEL of the old container changes nothing
    assert files(tmp_path).holders() == {"fd00:9::1:0:0": "c2@eth0", "10.9.0.2": "c2@eth0"}


def test_the_claims_status_ips_are_reserved_exactly(tmp_path: Path) -> None:
    conf = network(tmp_path)
    done = add(conf, "c1", claim_ips=("fd00:9::7:0:0/96", "10.9.0.77/32"))
    assert addresses(done) == ["fd00:9::7:0:0/96", "10.9.0.77/32"]


def test_an_ips_request_for_a_claims_address_by_another_container_is_102_naming_the_claim(
        tmp_path: Path) -> None:
    conf = network(tmp_path)
    add(conf, "c1", claim_ips=("10.9.0.77/32", "fd00:9::7:0:0/96"))
    run("DEL", conf, "c1")
    taken = conf | {"runtimeConfig": {"ips": ["10.9.0.77"]}}
    with pytest.raises(CniError) as caught:
        verbs.add_owned(request("ADD", taken, "intruder"))
    assert caught.value.code == IPAM_EXHAUSTED
    assert "IPAMClaim vms/vm1.net1 holds it" in caught.value.msg
    assert files(tmp_path).claims()["10.9.0.77"] == "vms/vm1.net1@uid-1"


def test_another_claim_asking_for_a_claims_address_is_102_naming_the_holder(
        tmp_path: Path) -> None:
    conf = network(tmp_path)
    add(conf, "c1", claim_ips=("10.9.0.77/32", "fd00:9::7:0:0/96"))
    with pytest.raises(CniError) as caught:
        add(conf, "c2", OTHER_CLAIM, ("10.9.0.77/32", "fd00:9::7:0:0/96"))
    assert caught.value.code == IPAM_EXHAUSTED
    assert "IPAMClaim vms/vm1.net1 (attached to container 'c1' interface 'eth0')" in \
        caught.value.msg


def test_claim_addresses_outside_the_pools_are_code_7_naming_the_claim(tmp_path: Path) -> None:
    with pytest.raises(CniError) as caught:
        add(network(tmp_path), "c1", claim_ips=("10.8.0.5/32",))
    assert caught.value.code == INVALID_CONFIG
    assert caught.value.msg.startswith("invalid IPAMClaim vms/vm1.net1 status.ips: 10.8.0.5/32 "
                                       "is outside every pool")
    assert files(tmp_path).records == {}


def test_a_claim_without_an_address_of_every_pool_is_code_7_naming_the_pool(
        tmp_path: Path) -> None:
    # E.g. the network got an IPv4 pool after the claim got its IPv6 address.
    with pytest.raises(CniError) as caught:
        add(network(tmp_path), "c1", claim_ips=("fd00:9::7:0:0/96",))
    assert caught.value.code == INVALID_CONFIG
    assert caught.value.msg == ("invalid IPAMClaim vms/vm1.net1 status.ips: it holds "
                                "fd00:9::7:0:0/96, no address of pool 10.9.0.0/24 of network "
                                "'net1'")
    assert files(tmp_path).records == {}


def test_an_ips_capability_other_than_the_claims_addresses_is_code_7_naming_both(
        tmp_path: Path) -> None:
    conf = network(tmp_path) | {"runtimeConfig": {"ips": ["10.9.0.5"]}}
    with pytest.raises(CniError) as caught:
        add(conf, "c1", claim_ips=("10.9.0.77/32", "fd00:9::7:0:0/96"))
    assert caught.value.code == INVALID_CONFIG
    assert "'runtimeConfig.ips': it asks for 10.9.0.5, but IPAMClaim vms/vm1.net1 status.ips " \
        "holds 10.9.0.77/32, fd00:9::7:0:0/96" in caught.value.msg


def test_gc_never_frees_a_claims_records_on_container_grounds(tmp_path: Path) -> None:
    conf = network(tmp_path)
    add(conf, "c1")
    add(conf, "plain", claim=None)
    run("DEL", conf, "c1")
    assert run("GC", conf, "gc", **{"cni.dev/valid-attachments": []}) == 0
    assert set(files(tmp_path).claims()) == {"fd00:9::1:0:0", "10.9.0.2"}
    assert files(tmp_path).holders() == {}  # the unclaimed one went


def test_free_claim_frees_only_that_claims_records(tmp_path: Path) -> None:
    conf = network(tmp_path)
    add(conf, "c1")
    add(conf, "c2", OTHER_CLAIM)
    freed = allocator.free_claim(str(tmp_path), CLAIM.uid, lock_timeout=5)
    assert sorted(path.rsplit("/", 1)[1] for path in freed) == ["10.9.0.2", "fd00:9::1:0:0"]
    state = files(tmp_path)
    assert set(state.claims().values()) == {"vms/vm2.net1@uid-2"}
    assert state.index_sound() and sorted(state.index.values()) == ["10.9.0.3", "fd00:9::2:0:0"]
    assert allocator.claim_owners(str(tmp_path)) == {"uid-2": OTHER_CLAIM}
    assert sorted(p.name for p in (tmp_path / ".claims").iterdir()) == [".formatVersion", "uid-2"]


def test_free_claim_finds_the_claims_pools_under_every_data_dir_of_the_node(
        tmp_path: Path) -> None:
    first = network(tmp_path / "a")
    second = network(tmp_path / "b" / "deeper") | {"name": "net2"}
    for conf, container in ((first, "c1"), (second, "c2")):
        verbs.add_owned(request("ADD", conf, container, root=tmp_path), CLAIM)
    freed = allocator.free_claim(str(tmp_path), CLAIM.uid, lock_timeout=5)
    assert len(freed) == 4
    assert files(tmp_path).records == {}
    assert not (tmp_path / ".claims" / CLAIM.uid).exists()


def test_undo_of_a_fresh_claim_reserve_frees_it(tmp_path: Path) -> None:
    add(network(tmp_path), "c1").undo()
    assert files(tmp_path).records == {}


@pytest.mark.parametrize("undone", ["c2", "c1"], ids=["an_adoption_by_another_container",
                                                   "a_repeated_add_of_the_holder"])
def test_undo_of_an_add_of_a_held_claim_record_leaves_it_as_it_was(tmp_path: Path,
                                                                    undone: str) -> None:
    conf = network(tmp_path)
    add(conf, "c1")
    before = files(tmp_path)
    add(conf, undone).undo()
    after = files(tmp_path)
    assert after.bodies == before.bodies and after.index == before.index


def test_undo_of_an_adoption_of_a_detached_record_leaves_it_detached(tmp_path: Path) -> None:
    conf = network(tmp_path)
    add(conf, "c1")
    run("DEL", conf, "c1")
    before = files(tmp_path)
    add(conf, "c2").undo()
    assert files(tmp_path).bodies == before.bodies
    assert files(tmp_path).index == {}




def test_a_network_config_cannot_name_a_claim(tmp_path: Path) -> None:
    conf = network(tmp_path) | {"runtimeConfig": {"claim": CLAIM.to_wire()},
                                "args": {"cni": {"claim": "vms/vm1.net1", "IgnoreUnknown": True}}}
    verbs.add(request("ADD", conf, "c1"))
    assert files(tmp_path).claims() == {}


TEXT = st.text(min_size=1, max_size=20)


@given(st.one_of(st.none(), st.builds(Attachment, TEXT, TEXT)),
       st.one_of(st.none(), st.builds(ClaimOwner, TEXT, TEXT, TEXT)))
def test_a_record_reads_back_as_written(attachment: Attachment | None,
                                        claim: ClaimOwner | None) -> None:
    record = Record("10.9.0.2", attachment, claim)
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / record.name).write_bytes(record.to_json())
        read = PoolState(directory, 1).read_record(record.name)
    assert read is not None and read == record
    assert read.readable == (attachment is not None or claim is not None)
