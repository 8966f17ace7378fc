"""vpc-attach-ipam on a full disk and on damaged state files (issue 10), with the real executables
and the real filesystem: a tiny tmpfs runs out of inodes or pages at each write of an ADD in
turn; records, index entries and the cursor are damaged from outside. The state is read back
independently of the store (tests/ipam_files.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from e2e.harness import kernel
from e2e.harness.cnibin import installed
from e2e.harness.kernel import links_in
from e2e.harness.plugin import IPAM_DATA_ROOT, Plugin, base_conf, with_prev
from e2e.harness.tinyfs import Resource, TinyFs, tiny_tmpfs
from tests.ipam_files import IpamFiles, pool_dirs

pytestmark = pytest.mark.root

NETWORK = "faults-net"
DUAL_STACK = {"ipv6_subnet": "fd00:10::/64", "ipv4_subnet": "10.20.0.0/24"}
NO_SPACE = "No space left on device"


@dataclass(frozen=True)
class Answer:
    """What vpc-attach-ipam printed and its exit status."""

    status: int
    body: dict[str, Any] | None

    @property
    def code(self) -> int | None:
        """The CNI error code, if it failed."""
        return int(self.body["code"]) if self.status != 0 and self.body else None

    @property
    def msg(self) -> str:
        """The error message."""
        return str(self.body.get("msg", "")) if self.body else ""


def ipam(command: str, conf: dict[str, Any], container_id: str = "", ifname: str = "eth0",
         **extra: str) -> Answer:
    """Run the installed vpc-attach-ipam once, as a runtime does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "VPC_ATTACH_"))}
    env.update({"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname,
                "CNI_NETNS": f"/var/run/netns/{container_id}", "CNI_PATH": "/opt/cni/bin",
                "VPC_ATTACH_IPAM_DATA_ROOT": IPAM_DATA_ROOT, **extra})
    proc = subprocess.run([installed("vpc-attach-ipam")], input=json.dumps(conf).encode(),
                          env=env, capture_output=True, timeout=60, check=False)
    stdout = proc.stdout.decode()
    assert "Traceback" not in stdout + proc.stderr.decode()
    body = json.loads(stdout) if stdout.strip() else None
    return Answer(proc.returncode, body)


def network(data_dir: Path, **ipam_keys: Any) -> dict[str, Any]:
    """A network config delegating to vpc-attach-ipam."""
    return {"cniVersion": "1.1.0", "name": NETWORK, "type": "vpc-attach", "vpc": "10",
            "vpcattachment": "10",
            "ipam": {"type": "vpc-attach-ipam", "dataDir": str(data_dir), **ipam_keys}}


def write_point(msg: str, data_dir: Path) -> str:
    """The write an error names, relative to dataDir, temp names folded (`write P/.tmp-*`)."""
    found = re.search(r"cannot (.+?) '([^']+)'", msg)
    assert found, msg
    action, where = found.group(1), os.path.relpath(found.group(2), data_dir)
    if action == "create record":
        where = os.path.join(os.path.dirname(where), "*")
    return f"{action} {re.sub(r'[.]tmp-[^/]+$', '.tmp-*', where)}"


def assert_nothing_held(files: IpamFiles, container_id: str) -> None:
    """No record and no index entry of container_id's eth0."""
    assert files.held_by(container_id) == []
    assert [key for key in files.index if key.endswith(f"/{container_id}@eth0")] == []


def cursors(data_dir: Path) -> dict[str, str | None]:
    """Each pool's `last_reserved`, None where there is none."""
    found: dict[str, str | None] = {}
    for pool in pool_dirs(data_dir, NETWORK):
        cursor = pool / "last_reserved"
        found[pool.name] = cursor.read_text() if cursor.exists() else None
    return found


@pytest.fixture
def tinyfs(tmp_path: Path) -> Iterator[TinyFs]:
    """A 256 KiB tmpfs with 96 inodes, unmounted after the test."""
    if not kernel.IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    with tiny_tmpfs(tmp_path / "tinyfs") as fs:
        yield fs


@pytest.mark.parametrize("start", ["fresh dataDir", "pool in use"])
@pytest.mark.parametrize("resource", ["inodes", "pages"])
def test_add_on_a_full_disk_fails_at_each_write_with_code_5_and_leaves_nothing(
        tinyfs: TinyFs, resource: Resource, start: str) -> None:
    data = tinyfs.data
    conf = network(data, **DUAL_STACK)
    if start == "pool in use":
        assert ipam("ADD", conf, "ctr-other").status == 0
    others = IpamFiles.read(data).bodies
    failed_at: list[str] = []
    for room in range(40):  # one more inode or page each time, until the ADD fits
        if start == "fresh dataDir":  # every directory and the lock file are writes too
            shutil.rmtree(data)
            data.mkdir()
        tinyfs.fill(resource)
        tinyfs.give_back(resource, room)
        before_cursors = cursors(data)
        answer = ipam("ADD", conf, "ctr-full")
        files = IpamFiles.read(data)
        if answer.status == 0:
            break
        assert answer.code in (5, 11), answer.body
        assert NO_SPACE in answer.msg and str(data) in answer.msg, answer.msg
        failed_at.append(write_point(answer.msg, data))
        assert_nothing_held(files, "ctr-full")
        assert files.temps == []
        assert files.bodies == others, "another container's record changed"
        tinyfs.empty()
        retried = ipam("ADD", conf, "ctr-full")
        assert retried.status == 0, retried.body
        assert ipam("DEL", conf, "ctr-full").status == 0
        assert_nothing_held(IpamFiles.read(data), "ctr-full")
    else:
        pytest.fail(f"ADD never fitted; failed at {failed_at}")
    # The first ADD that fits leaves only the last pool's cursor unwritten: a hint, not state.
    assert answer.body is not None
    mine = files.addresses_of("ctr-full")
    assert len(mine) == 2 and not set(mine) & {k.split("/")[1] for k in others}
    last_pool = pool_dirs(data, NETWORK)[0]  # 10.20.0.0_24_32 sorts before fd00:…
    assert cursors(data)[last_pool.name] == before_cursors.get(last_pool.name)
    assert files.index_sound() and files.temps == []
    tinyfs.empty()
    assert ipam("DEL", conf, "ctr-full").status == 0
    assert_nothing_held(IpamFiles.read(data), "ctr-full")
    assert IpamFiles.read(data).bodies == others

    points = set(failed_at)
    for pool in pool_dirs(data, NETWORK):  # a record and an index entry, in both pools
        where = f"{NETWORK}/{pool.name}"
        if resource == "inodes":  # its temp file, or its hard link: tmpfs counts both
            record, index = {f"write in {where}", f"create record {where}/*"}, \
                f"write in {where}/attachments"
        else:
            record, index = {f"write {where}/.tmp-*"}, f"write {where}/attachments/.tmp-*"
        assert points & record and index in points, points
    print(f"\n{resource}, {start}: failed at {failed_at}, then the cursor only")


def test_damaged_state_never_hands_out_a_held_address(tmp_path: Path) -> None:
    data = tmp_path / "ipam"
    conf = network(data, **DUAL_STACK)
    for cid in ("a", "b", "c"):
        assert ipam("ADD", conf, cid).status == 0
    v4_pool, v6_pool = pool_dirs(data, NETWORK)
    held = {cid: IpamFiles.read(data).addresses_of(cid) for cid in ("a", "b", "c")}
    a_v4 = next(address for address in held["a"] if "." in address)
    # Garbage records where the next blocks would go, and a cursor that names nothing.
    garbage = {"10.20.0.5": b"\x00garbage", "10.20.0.6": b"", "fd00:10::4:0:0": b'{"contai'}
    for name, body in garbage.items():
        ((v4_pool if "." in name else v6_pool) / name).write_bytes(body)
    (v4_pool / "last_reserved").write_text("not an address")
    # A dangling index entry, and b's entries naming another container's record or nothing.
    (v4_pool / "attachments" / "d@eth0").write_text("10.20.0.99")
    (v4_pool / "attachments" / "e@eth0").write_text(a_v4)
    (v4_pool / "attachments" / "b@eth0").write_text(a_v4)  # b's own record is intact
    (v6_pool / "attachments" / "b@eth0").write_bytes(b"\x00\xff")

    for cid in ("d", "e", "b"):
        assert ipam("ADD", conf, cid).status == 0
    files = IpamFiles.read(data)
    assert files.addresses_of("b") == held["b"], "a repeated ADD keeps its block"
    everyone = [address for cid in "abcde" for address in files.addresses_of(cid)]
    assert len(everyone) == len(set(everyone)) == 10, "never an address held twice"
    assert not set(everyone) & set(garbage)

    # e's entries damaged after its ADD: one names a's record, one is gone.
    (v4_pool / "attachments" / "e@eth0").write_text(a_v4)
    (v6_pool / "attachments" / "e@eth0").unlink()
    untouched = {k: v for k, v in files.bodies.items()
                 if files.records[k] is not None and files.records[k] != ("e", "eth0")}
    assert ipam("DEL", conf, "e").status == 0
    after = IpamFiles.read(data)
    assert_nothing_held(after, "e")
    assert {k: after.bodies[k] for k in untouched} == untouched, "DEL took another's record"
    assert ipam("DEL", conf, "b").status == 0
    assert_nothing_held(IpamFiles.read(data), "b")
    assert all(IpamFiles.read(data).addresses_of(cid) == held[cid] for cid in ("a", "c"))

    valid = [{"containerID": cid, "ifname": "eth0"} for cid in ("a", "c", "d")]
    assert ipam("GC", {**conf, "cni.dev/valid-attachments": valid}).status == 0
    files = IpamFiles.read(data)
    assert sorted(files.records) == sorted(
        key for cid in ("a", "c", "d") for key in files.held_by(cid))
    assert len(files.records) == 6 and files.index_sound() and files.temps == []


@pytest.mark.both_paths
@pytest.mark.parametrize(("resource", "room", "write"), [
    ("inodes", 0, "record"), ("inodes", 1, "record link"), ("inodes", 2, "index entry"),
    ("pages", 0, "record"), ("pages", 1, "index entry")])
def test_disk_full_add_through_vpc_attach_leaves_no_link_and_no_record(
        plugin: Plugin, netns: str, vpc: str, tinyfs: TinyFs, resource: Resource, room: int,
        write: str) -> None:
    conf = base_conf(vpc, "5", ipam={"type": "vpc-attach-ipam", "dataDir": str(tinyfs.data),
                                     "ipv6_subnet": "fd00:35::/48",
                                     "ipv4_subnet": "172.30.5.0/24"})
    assert ipam("ADD", conf, "other-pod").status == 0  # the pool is in use by another
    others = IpamFiles.read(tinyfs.data).bodies
    host_link = naming.host_link_name(vpc, "5")

    tinyfs.fill(resource)
    tinyfs.give_back(resource, room)  # enough for the writes before the one that must fail
    answer = plugin.call("ADD", conf, container_id="full-pod", netns=netns)
    assert answer.code == 5, answer.stdout + answer.stderr
    assert "vpc-attach-ipam" in answer.body["msg"] and NO_SPACE in answer.body["msg"]
    files = IpamFiles.read(tinyfs.data)
    assert_nothing_held(files, "full-pod")
    assert files.bodies == others and files.temps == []
    assert host_link not in links_in(), f"the {write} failed, yet the host link stayed"
    assert "eth0" not in links_in(netns)

    tinyfs.empty()
    result = plugin.ok("ADD", conf, container_id="full-pod", netns=netns)
    assert host_link in links_in()
    plugin.ok("DEL", with_prev(conf, result), container_id="full-pod", netns=netns)
    assert_nothing_held(IpamFiles.read(tinyfs.data), "full-pod")
    assert host_link not in links_in() and "eth0" not in links_in(netns)
    assert IpamFiles.read(tinyfs.data).bodies == others
