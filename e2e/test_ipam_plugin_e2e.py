"""The installed `vpc-attach-ipam` executable, run as a runtime runs it: CNI env + stdin.

Needs no root: every test keeps its state in its own tmp dir (the `dataDir`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core.locks import file_lock
from e2e.harness.plugin import IPAM_DATA_ROOT
from netconf.versions import LEGACY_RESULT_VERSIONS, SUPPORTED_VERSIONS

TYPE = "vpc-attach-ipam"
NETWORK = "e2e-net"


@dataclass(frozen=True)
class Answer:
    """What the plugin printed and its exit status."""

    status: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        """stdout as exactly one JSON object."""
        data = json.loads(self.stdout)
        assert isinstance(data, dict)
        return data

    @property
    def code(self) -> int:
        """The CNI error code (the answer must be an error)."""
        assert self.status != 0, self.stdout
        return int(self.json["code"])


Runner = Callable[..., Answer]


@pytest.fixture(scope="session")
def executable() -> str:
    """Path of the installed `vpc-attach-ipam`."""
    found = shutil.which("vpc-attach-ipam")
    if found is None:
        pytest.fail("vpc-attach-ipam is not installed (run `pip install -e .`)")
    return found


def env_for(command: str, container_id: str, ifname: str, extra: dict[str, str]) -> dict[str, str]:
    """A runtime's environment for one invocation."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "VPC_ATTACH_"))}
    return {**base, "CNI_COMMAND": command, "CNI_CONTAINERID": container_id,
            "CNI_IFNAME": ifname, "CNI_NETNS": f"/var/run/netns/{container_id}",
            "CNI_PATH": "/opt/cni/bin", "VPC_ATTACH_IPAM_DATA_ROOT": IPAM_DATA_ROOT, **extra}


@pytest.fixture
def run(executable: str) -> Runner:
    """Run the plugin once and return its Answer."""
    def _run(command: str, conf: dict[str, Any] | bytes, container_id: str = "ctr1",
             ifname: str = "eth0", **extra: str) -> Answer:
        stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
        proc = subprocess.run([executable], input=stdin, capture_output=True, timeout=60,
                              env=env_for(command, container_id, ifname, extra), check=False)
        stdout = proc.stdout.decode()
        assert "Traceback" not in stdout
        if stdout:
            json.loads(stdout)  # exactly one JSON document, or this raises
        return Answer(proc.returncode, stdout, proc.stderr.decode())
    return _run


def network(data_dir: Path, version: str = "1.1.0", **ipam: Any) -> dict[str, Any]:
    """A vpc-attach network config delegating to vpc-attach-ipam."""
    return {"cniVersion": version, "name": NETWORK, "type": "vpc-attach", "vpc": "10",
            "vpcattachment": "10",
            "ipam": {"type": TYPE, "dataDir": str(data_dir), **ipam}}


# A pool's lock, cursor and format marker (`.formatVersion`, SPEC §18): no attachment's state.
NOT_RECORDS = ("lock", "last_reserved", ".formatVersion")


def records(data_dir: Path) -> list[str]:
    """Every allocation record under data_dir (file names are the addresses)."""
    found = []
    for path in data_dir.rglob("*"):
        if path.is_file() and path.parent.name != "attachments" and \
                path.name not in NOT_RECORDS:
            found.append(path.name)
    return sorted(found)


MODES: dict[str, dict[str, Any]] = {
    "ipv6-pool": {"ipv6_subnet": "fd00:10::/64"},
    "ipv6-pool-112": {"ipv6_subnet": "fd00:10::/64", "ipv6_prefix_length": 112},
    "ipv4-pool": {"ipv4_subnet": "10.20.0.0/24"},
    "dual-stack": {"ipv6_subnet": "fd00:10::/64", "ipv4_subnet": "10.20.0.0/24"},
    "narrowed": {"ipv6_subnet": "fd00:10::/64", "ipv4_subnet": "10.20.0.0/24",
                 "address_families": ["IPv6"]},
    "addresses": {"addresses": [{"address": "fd00:99::5/80", "gateway": "fd00:99::1"},
                                {"address": "10.99.0.5/32", "gateway": "10.99.0.1"}]},
    "static_ip": {"static_ip": "fd00:77::5"},
}
EXPECTED: dict[str, list[tuple[str, str | None]]] = {
    "ipv6-pool": [("fd00:10::1:0:0/96", "fd00:10::1")],
    "ipv6-pool-112": [("fd00:10::1:0/112", "fd00:10::1")],
    "ipv4-pool": [("10.20.0.2/32", "10.20.0.1")],
    "dual-stack": [("fd00:10::1:0:0/96", "fd00:10::1"), ("10.20.0.2/32", "10.20.0.1")],
    "narrowed": [("fd00:10::1:0:0/96", "fd00:10::1")],
    "addresses": [("fd00:99::5/80", "fd00:99::1"), ("10.99.0.5/32", "10.99.0.1")],
    "static_ip": [("fd00:77::5/64", None)],
}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_answers_in_every_version(run: Runner, tmp_path: Path, mode: str,
                                             version: str) -> None:
    conf = network(tmp_path, version, **MODES[mode])
    answer = run("ADD", conf)
    assert answer.status == 0, answer.stdout + answer.stderr
    result = answer.json
    assert result["cniVersion"] == version
    assert "interfaces" not in result
    assert [(ip["address"], ip.get("gateway")) for ip in result["ips"]] == EXPECTED[mode]
    assert all("interface" not in ip for ip in result["ips"])
    for ip in result["ips"]:
        family = ipaddress.ip_interface(ip["address"]).version
        assert ip.get("version") == (str(family) if version in LEGACY_RESULT_VERSIONS else None)
    stored = mode not in ("addresses", "static_ip")
    assert len(records(tmp_path)) == (len(EXPECTED[mode]) if stored else 0)
    assert run("ADD", conf).json == result  # repeated ADD: the same answer
    if version not in ("0.3.0", "0.3.1"):
        assert run("CHECK", {**conf, "prevResult": result}).status == 0
    assert run("DEL", conf).status == 0
    assert records(tmp_path) == []
    assert run("DEL", conf).status == 0  # idempotent


def test_repeated_add_keeps_the_allocation_while_others_get_new_ones(run: Runner,
                                                                     tmp_path: Path) -> None:
    conf = network(tmp_path, **MODES["dual-stack"])
    first = run("ADD", conf, "ctr1").json
    other = run("ADD", conf, "ctr2").json
    second_if = run("ADD", conf, "ctr1", "net1").json
    assert run("ADD", conf, "ctr1").json == first
    addresses = [ip["address"] for r in (first, other, second_if) for ip in r["ips"]]
    assert len(addresses) == len(set(addresses)) == 6


def test_del_releases_only_that_container_and_ifname(run: Runner, tmp_path: Path) -> None:
    conf = network(tmp_path, **MODES["ipv4-pool"])
    run("ADD", conf, "ctr1")
    run("ADD", conf, "ctr1", "net1")
    run("ADD", conf, "ctr2")
    assert records(tmp_path) == ["10.20.0.2", "10.20.0.3", "10.20.0.4"]
    assert run("DEL", conf, "ctr1").status == 0
    assert records(tmp_path) == ["10.20.0.3", "10.20.0.4"]
    assert run("DEL", conf, "unknown-ctr").status == 0
    assert run("CHECK", conf, "ctr1", "net1").status == 0
    assert run("CHECK", conf, "ctr1").code == 103


def test_del_without_netns_or_path_succeeds(run: Runner, tmp_path: Path) -> None:
    conf = network(tmp_path, **MODES["ipv6-pool"])
    run("ADD", conf)
    assert run("DEL", conf, CNI_NETNS="", CNI_PATH="").status == 0
    assert records(tmp_path) == []


def test_gc_releases_attachments_not_listed(run: Runner, tmp_path: Path) -> None:
    conf = network(tmp_path, **MODES["dual-stack"])
    for cid in ("ctr1", "ctr2", "ctr3"):
        assert run("ADD", conf, cid).status == 0
    valid = [{"containerID": "ctr2", "ifname": "eth0"}]
    answer = run("GC", {**conf, "cni.dev/valid-attachments": valid}, CNI_CONTAINERID="",
                 CNI_IFNAME="", CNI_NETNS="")
    assert answer.status == 0, answer.stdout
    assert records(tmp_path) == ["10.20.0.3", "fd00:10::2:0:0"]
    assert run("CHECK", conf, "ctr2").status == 0
    assert run("GC", {**conf, "cni.dev/attachments": []}).status == 0
    assert records(tmp_path) == []


def test_exhausted_pool_is_code_102(run: Runner, tmp_path: Path) -> None:
    conf = network(tmp_path, ipv4_subnet="10.30.0.0/29")  # .2 … .6
    for n in range(5):
        assert run("ADD", conf, f"ctr{n}").status == 0
    answer = run("ADD", conf, "ctr-late")
    assert answer.code == 102
    assert "10.30.0.0/29" in answer.json["msg"]
    assert run("DEL", conf, "ctr0").status == 0
    assert run("ADD", conf, "ctr-late").json["ips"][0]["address"] == "10.30.0.2/32"


def test_exhausted_second_pool_leaves_no_record_in_the_first(run: Runner,
                                                             tmp_path: Path) -> None:
    conf = network(tmp_path, ipv6_subnet="fd00:10::/64", ipv4_subnet="10.30.0.0/30")
    assert run("ADD", conf, "ctr1").status == 0
    assert run("ADD", conf, "ctr2").code == 102
    assert records(tmp_path) == ["10.30.0.2", "fd00:10::1:0:0"]


@pytest.mark.parametrize("keys", [
    {"static_ip": "fd00::5", "ipv6_subnet": "fd00::/64"},
    {"addresses": [{"address": "fd00::5/64"}], "static_ip": "fd00::6"},
    {"addresses": [{"address": "10.0.0.5/32"}], "ipv4_subnet": "10.0.0.0/24"},
])
def test_mixing_modes_is_code_7_naming_the_keys(run: Runner, tmp_path: Path,
                                                keys: dict[str, Any]) -> None:
    answer = run("ADD", network(tmp_path, **keys))
    assert answer.code == 7
    for key in keys:
        assert f"ipam.{key}" in answer.json["msg"]


@pytest.mark.parametrize(("keys", "named"), [
    ({"ipv6_subnet": "fd00::/64", "colour": "red"}, "ipam.colour"),
    ({"ipv6_subnet": "fd00::/zz"}, "ipam.ipv6_subnet"),
    ({"ipv4_subnet": "10.0.0.0/24", "ipv4_gateway": "10.9.9.9"}, "ipam.ipv4_gateway"),
    ({"addresses": [{"address": "10.0.0.5/24"}]}, "ipam.addresses.0.address"),
    ({"ipv6_subnet": "fd00::/64", "ipv6_prefix_length": 129}, "ipam.ipv6_prefix_length"),
])
def test_invalid_config_is_code_7_naming_the_key(run: Runner, tmp_path: Path,
                                                 keys: dict[str, Any], named: str) -> None:
    answer = run("ADD", network(tmp_path, **keys))
    assert answer.code == 7
    assert named in answer.json["msg"]


def test_garbage_stdin_is_one_error_document(run: Runner) -> None:
    answer = run("ADD", b"{not json")
    assert answer.code == 6
    assert set(answer.json) == {"cniVersion", "code", "msg", "details"}


def test_missing_environment_is_code_4(run: Runner, tmp_path: Path) -> None:
    answer = run("ADD", network(tmp_path, **MODES["ipv6-pool"]), CNI_CONTAINERID="")
    assert answer.code == 4 and "CNI_CONTAINERID" in answer.json["msg"]


def test_version_ignores_stdin(run: Runner) -> None:
    answer = run("VERSION", b"this is not read")
    assert answer.status == 0
    assert answer.json == {"cniVersion": "1.1.0", "supportedVersions": list(SUPPORTED_VERSIONS)}


def test_status_checks_that_data_dir_is_writable(run: Runner, tmp_path: Path) -> None:
    assert run("STATUS", network(tmp_path / "state", **MODES["ipv6-pool"])).status == 0
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    answer = run("STATUS", network(blocker, **MODES["ipv6-pool"]))
    assert answer.code == 50 and "dataDir" in answer.json["msg"]


def test_check_reports_a_missing_allocation_with_103(run: Runner, tmp_path: Path) -> None:
    conf = network(tmp_path, "1.0.0", **MODES["ipv6-pool"])
    answer = run("CHECK", conf, "never-added")
    assert answer.code == 103 and "never-added" in answer.json["msg"]


def test_held_pool_lock_is_code_11_not_a_hang(run: Runner, tmp_path: Path) -> None:
    conf = network(tmp_path, lockTimeoutSeconds=0.3, **MODES["ipv6-pool"])
    lock = tmp_path / NETWORK / "fd00:10::_64_96" / "lock"
    with file_lock(str(lock), 1.0):
        answer = run("ADD", conf)
    assert answer.code == 11
    assert run("ADD", conf).status == 0


def test_32_parallel_adds_get_distinct_addresses_and_del_leaves_nothing(
        executable: str, tmp_path: Path) -> None:
    conf_file = tmp_path / "conf.json"
    conf_file.write_text(json.dumps(network(tmp_path / "state", **MODES["dual-stack"])))
    containers = [f"par-{n:02d}" for n in range(32)]

    def start(command: str, cid: str) -> subprocess.Popen[bytes]:
        with conf_file.open("rb") as stdin:
            return subprocess.Popen([executable], stdin=stdin, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE,
                                    env=env_for(command, cid, "eth0", {}))

    adds = [start("ADD", cid) for cid in containers]  # all running at once
    results = []
    for proc in adds:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stdout.decode() + stderr.decode()
        results.append(json.loads(stdout))
    addresses = [ip["address"] for result in results for ip in result["ips"]]
    assert len(addresses) == 64
    assert len(set(addresses)) == 64
    assert len(records(tmp_path / "state")) == 64
    dels = [start("DEL", cid) for cid in containers]
    for proc in dels:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stdout.decode() + stderr.decode()
        assert stdout == b""
    assert records(tmp_path / "state") == []
    leftovers = [p for p in (tmp_path / "state").rglob("*")
                 if p.is_file() and p.name not in NOT_RECORDS]
    assert leftovers == []
