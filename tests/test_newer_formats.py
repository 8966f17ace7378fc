"""A file on the node written by a newer vpc-attach (SPEC §18): each reader refuses a higher
`formatVersion` with code 108 naming the file, and writes nothing next to it; a field it does
not know in a file of its own version is ignored (the next release adds fields)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core.records import DIRECTORY_FORMAT, directory_format, mark_directory
from cni_plugin.doctor.formats import state_formats
from cni_plugin.doctor.node import FAIL, OK
from cni_plugin.doctor.node import Node as DoctorNode
from cni_plugin.galactic import record as galactic_record
from cni_plugin.install.errors import InstallError
from cni_plugin.install.manifest import Manifest
from cni_plugin.ipam.plugin import claimed
from cni_plugin.ipam.plugin.store import Attachment, PoolState
from cni_plugin.kernel import tableids
from cni_plugin.kube.networks import NetworkName
from cni_plugin.kubevirt import migration
from cni_plugin.policy import records as policy_records
from cni_plugin.policy.networks import PodKey
from cni_plugin.tenancy import choice
from netconf.errors import NEWER_FORMAT, CniError
from netconf.formats import FORMAT_VERSION, check_format
from netconf.host import HostSettings, read_host_file

NEWER = FORMAT_VERSION + 1


def newer(body: dict[str, Any]) -> str:
    return json.dumps({"formatVersion": NEWER, **body})


def refused(path: Path, call: Any) -> CniError:
    """`call()` raises code 108 naming path; the error."""
    with pytest.raises(CniError) as caught:
        call()
    assert caught.value.code == NEWER_FORMAT, caught.value
    assert str(path) in caught.value.msg and f"formatVersion {NEWER}" in caught.value.msg
    return caught.value


def mark_newer(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / DIRECTORY_FORMAT
    marker.write_text(newer({}))
    return marker


# -- files that carry formatVersion themselves ---------------------------------------------------


def test_an_ipam_record_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    (pool / "attachments").mkdir(parents=True)
    (pool / "10.0.0.2").write_text(newer({"containerID": "c1", "ifname": "eth0"}))
    (pool / "attachments" / "c1@eth0").write_text("10.0.0.2")
    with PoolState(str(pool), 5.0).locked() as state:
        refused(pool / "10.0.0.2", lambda: state.lookup(Attachment("c1", "eth0")))
        refused(pool / "10.0.0.2", lambda: state.collect_garbage(set()))
    assert (pool / "10.0.0.2").exists()  # never collected as unreadable


def test_an_ipam_block_record_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    (pool / "blocks").mkdir(parents=True)
    (pool / "blocks" / "b-1").write_text(newer({"name": "b-1", "cidr": "10.1.0.0/28",
                                                "uid": "u", "state": "held"}))
    with PoolState(str(pool), 5.0).locked() as state:
        refused(pool / "blocks" / "b-1", state.blocks)


def test_a_choice_record_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    record = tmp_path / "attachments" / "c1@eth0.json"
    record.parent.mkdir()
    record.write_text(newer({"network": "n", "vpc": "a", "vpcattachment": "1"}))
    refused(record, lambda: choice.read_record(str(record)))
    refused(record, lambda: choice.records_of(str(tmp_path), "n"))  # GC touches none


def test_a_galactic_registration_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    record = Path(galactic_record.record_path(str(tmp_path), "c1", "eth0"))
    record.parent.mkdir(parents=True)
    record.write_text(newer({"network": "n", "hostLink": "G1H", "rows": [], "uses": []}))
    refused(record, lambda: galactic_record.read_record(str(record)))
    refused(record, lambda: list(galactic_record.records_of(str(tmp_path), "n")))


def test_a_host_file_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text(newer({"nodeName": "w1"}))
    refused(host, lambda: read_host_file({"VPC_ATTACH_HOST_CONFIG": str(host)}))


def test_an_install_manifest_of_a_newer_release_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"formatVersion": NEWER, "version": 1, "files": {}}))
    with pytest.raises(InstallError, match=f"newer vpc-attach install .formatVersion {NEWER}"):
        Manifest.load(path)


def test_a_policy_record_of_a_newer_release_is_refused_and_a_current_one_read(
        tmp_path: Path) -> None:
    """Every reader of the records (ADD's peers, the agent's pass, GC, doctor: read_all) and
    GC's removal refuse; a record of this release beside it was read before it came."""
    current = policy_attachment("c1")
    policy_records.write(str(tmp_path), current)
    assert list(policy_records.read_all(str(tmp_path))) == [current]  # the positive control
    record = Path(policy_records.record_path(str(tmp_path), "c2", "net1"))
    body = json.loads(Path(policy_records.record_path(str(tmp_path), "c1", "net1")).read_text())
    record.write_text(json.dumps(body | {"formatVersion": NEWER, "container_id": "c2"}))
    refused(record, lambda: list(policy_records.read_all(str(tmp_path))))
    refused(record, lambda: policy_records.remove_except(str(tmp_path), "net-a", set()))
    assert record.exists() and Path(policy_records.record_path(str(tmp_path), "c1", "net1")) \
        .exists()  # never collected as unreadable, nor the others on its account


def test_a_policy_file_without_format_version_is_damaged_not_the_previous_releases(
        tmp_path: Path) -> None:
    """041aa67 (packaging/upgrade-from) predates policy: every policy file any release wrote
    carries formatVersion, so one without it is read as damaged (skipped), not as format 1."""
    policy_records.write(str(tmp_path), policy_attachment("c1"))
    path = Path(policy_records.record_path(str(tmp_path), "c1", "net1"))
    body = json.loads(path.read_text())
    assert [a.container_id for a in policy_records.read_all(str(tmp_path))] == ["c1"]
    path.write_text(json.dumps({k: v for k, v in body.items() if k != "formatVersion"}))
    assert list(policy_records.read_all(str(tmp_path))) == []
    policy_records.write_status(str(tmp_path), {"syncedAt": 1.0, "rules": 0})
    assert policy_records.read_status(str(tmp_path)) is not None  # the positive control
    Path(policy_records.status_path(str(tmp_path))).write_text('{"syncedAt": 1.0}')
    assert policy_records.read_status(str(tmp_path)) is None


def test_the_policy_keepers_status_of_a_newer_release_is_refused_and_a_current_one_read(
        tmp_path: Path) -> None:
    policy_records.write_status(str(tmp_path), {"syncedAt": 1.0, "rules": 3})
    assert policy_records.read_status(str(tmp_path)) == {"formatVersion": FORMAT_VERSION,
                                                          "syncedAt": 1.0, "rules": 3}
    path = Path(policy_records.status_path(str(tmp_path)))
    path.write_text(newer({"syncedAt": 1.0, "rules": 3}))
    refused(path, lambda: policy_records.read_status(str(tmp_path)))
    assert list(policy_records.read_all(str(tmp_path))) == []  # the status is no record


def test_the_agents_policy_pass_stops_at_a_newer_record_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No pass acts on the node's records without the newer one (the rules stay as they
    are); the keeper logs it once, not at every retry."""
    from cni_plugin.agent.policies import PolicyKeeper
    from cni_plugin.kube.config import KubeCredentials
    creds = KubeCredentials("https://127.0.0.1:1", None, True, "t", None, None, None)
    keeper = PolicyKeeper(creds, str(tmp_path), "w1", network_policy=False)  # never started
    policy_records.write(str(tmp_path), policy_attachment("c1"))
    assert keeper.sync_once(None) is None  # read, then no pass: its caches never listed
    record = Path(policy_records.record_path(str(tmp_path), "c2", "net1"))
    record.write_text(newer({}))
    error = refused(record, lambda: keeper.sync_once(None))
    for _ in range(2):
        keeper._refused(error)  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records if "not kept current" in r.getMessage()]
    assert len(said) == 1 and str(record) in said[0], said


@pytest.mark.parametrize("version", [0, -1, "1", 1.5, True, None])
def test_a_format_version_that_is_no_version_is_refused(version: object) -> None:
    with pytest.raises(CniError) as caught:
        check_format({"formatVersion": version}, "/x", "a file")
    assert caught.value.code == NEWER_FORMAT


# -- files whose directory carries the format ------------------------------------------------------


def test_a_pool_marked_by_a_newer_release_is_neither_read_nor_written(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    marker = mark_newer(pool)

    def reserve() -> None:
        with PoolState(str(pool), 5.0).locked() as state:
            state.reserve(Attachment("c1", "eth0"), ["10.0.0.2"])

    refused(marker, reserve)
    assert not (pool / "10.0.0.2").exists()


def test_table_ids_marked_by_a_newer_release_are_neither_read_nor_written(
        tmp_path: Path) -> None:
    marker = mark_newer(tmp_path / tableids.DIRECTORY)
    (tmp_path / tableids.DIRECTORY / "G1V").write_text("17\n")
    refused(marker, lambda: tableids.kept(str(tmp_path)))
    refused(marker, lambda: tableids.keep(str(tmp_path), "G2V", 18))
    assert not (tmp_path / tableids.DIRECTORY / "G2V").exists()


def test_claim_notes_marked_by_a_newer_release_are_refused_and_left_alone(
        tmp_path: Path) -> None:
    marker = mark_newer(tmp_path / claimed.CLAIMS_DIR)
    (tmp_path / claimed.CLAIMS_DIR / "uid-1").mkdir()
    refused(marker, lambda: claimed.uids(str(tmp_path)))
    refused(marker, lambda: claimed.pools_of(str(tmp_path), "uid-1"))
    claimed.note(str(tmp_path), "uid-2", "/pool")  # best effort: writes nothing into them
    assert not (tmp_path / claimed.CLAIMS_DIR / "uid-2").exists() or \
        not list((tmp_path / claimed.CLAIMS_DIR / "uid-2").iterdir())


def test_migration_records_marked_by_a_newer_release_are_neither_read_nor_written(
        tmp_path: Path) -> None:
    marker = mark_newer(tmp_path / migration.RECORDS_DIR)
    refused(marker, lambda: migration.pending_targets(str(tmp_path)))
    refused(marker, lambda: migration.write_pending(str(tmp_path), pending()))
    assert [p.name for p in marker.parent.iterdir()] == [DIRECTORY_FORMAT]


def test_a_migration_record_of_the_next_release_with_more_fields_is_read(
        tmp_path: Path) -> None:
    """This release writes no formatVersion into the record (the previous release's reader
    refuses any key it does not know), and reads one with extra fields and the key."""
    path = Path(migration.write_pending(str(tmp_path), pending()))
    assert "formatVersion" not in json.loads(path.read_text())
    body = json.loads(path.read_text())
    body.update(formatVersion=1, laterField={"x": 1})
    body["source"]["laterField"] = 2
    path.write_text(json.dumps(body))
    assert migration.pending_targets(str(tmp_path)) == [pending()]


def test_a_directory_is_marked_once_and_a_missing_marker_is_the_previous_release(
        tmp_path: Path) -> None:
    assert directory_format(str(tmp_path), "files") == 1  # 041aa67 wrote none
    mark_directory(str(tmp_path), "files")
    written = (tmp_path / DIRECTORY_FORMAT).read_text()
    mark_directory(str(tmp_path), "files")
    assert (tmp_path / DIRECTORY_FORMAT).read_text() == written
    assert json.loads(written)["formatVersion"] == FORMAT_VERSION
    assert [p.name for p in tmp_path.iterdir()] == [DIRECTORY_FORMAT]  # no temporary left


# -- fields a reader does not know ---------------------------------------------------------------


def test_fields_of_a_later_release_are_ignored(tmp_path: Path) -> None:
    record = tmp_path / "attachments" / "c1@eth0.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"formatVersion": 1, "network": "n", "vpc": "a",
                                  "vpcattachment": "1", "later": True}))
    assert choice.read_record(str(record)) == {"network": "n", "vpc": "a", "vpcattachment": "1"}
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"formatVersion": 1, "nodeName": "w1", "later": [1]}))
    assert read_host_file({"VPC_ATTACH_HOST_CONFIG": str(host)})["nodeName"] == "w1"
    pool = tmp_path / "pool"
    (pool / "attachments").mkdir(parents=True)
    (pool / "10.0.0.2").write_text(json.dumps({"formatVersion": 1, "containerID": "c1",
                                               "ifname": "eth0", "later": 1}))
    with PoolState(str(pool), 5.0).locked() as state:
        assert state.find(Attachment("c1", "eth0")) == "10.0.0.2"


def policy_attachment(container: str) -> policy_records.LocalAttachment:
    return policy_records.LocalAttachment(
        container, "net1", "veth", "/var/run/netns/x", "G000000a1001H", "a1", "1", 7,
        PodKey("ns1", container, "uid"), NetworkName("ns1", "nad"), ("10.0.0.5",), "net-a")


def pending() -> migration.PendingTarget:
    return migration.PendingTarget(
        network="n", container_id="c1", ifname="net1", pod_namespace="ns", pod_name="p",
        pod_uid="u", node="w1", bgp_namespace="galactic-system", advertisement="3e-3e-w1",
        annotations={}, spec={}, owner_references=[], created_by="c1/net1/x", slices=[],
        source=migration.MigrationSource("ns", "s", "w2"), source_advertisement="3e-3e-w2")


# -- vpc-attach doctor ---------------------------------------------------------------------------


def test_doctor_names_the_files_a_newer_release_wrote(tmp_path: Path) -> None:
    lock_dir, data_dir = tmp_path / "locks", tmp_path / "ipam"
    node = DoctorNode({"VPC_ATTACH_IPAM_DATA_ROOT": str(data_dir),
                       "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "none.json")},
                      "/etc/cni/net.d", "/opt/cni/bin", "", [str(data_dir)],
                      HostSettings(lock_dir=str(lock_dir)))
    (lock_dir / choice.RECORDS_DIR).mkdir(parents=True)
    (lock_dir / choice.RECORDS_DIR / "c1@eth0.json").write_text(json.dumps(
        {"network": "n", "vpc": "a", "vpcattachment": "1"}))  # the previous release's
    with PoolState(str(data_dir / "n" / "pool"), 5.0).locked() as state:
        state.reserve(Attachment("c2", "eth0"), ["10.0.0.2"])  # this release's, and its marker
    (ok,) = state_formats(node)
    assert (ok.status, ok.detail) == (OK, "2 file(s) of formatVersion 1, 1 of the previous "
                                           "release's format (no formatVersion)")
    marker = mark_newer(lock_dir / tableids.DIRECTORY)
    (failed,) = state_formats(node)
    assert failed.status == FAIL and str(marker) in failed.detail


def test_doctor_names_the_policy_files_a_newer_release_wrote(tmp_path: Path) -> None:
    """state.formats counts the policy records and the keeper's status of this release (the
    positive control), never a policy file without formatVersion as the previous release's
    (it predates policy), and names a newer one; policy.agent says what it stops."""
    from cni_plugin.doctor.policy import policy as doctor_policy
    lock_dir = tmp_path / "locks"
    node = DoctorNode({"VPC_ATTACH_IPAM_DATA_ROOT": str(tmp_path / "ipam"),
                       "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "none.json")},
                      "/etc/cni/net.d", "/opt/cni/bin", "", [],
                      HostSettings(lock_dir=str(lock_dir)))
    policy_records.write(str(lock_dir), policy_attachment("c1"))
    policy_records.write_status(str(lock_dir), {"syncedAt": 1.0, "rules": 0})
    (lock_dir / policy_records.DIRECTORY / "c0-net1.json").write_text("{}")  # no release's
    (ok,) = state_formats(node)
    assert (ok.status, ok.detail) == (OK, "2 file(s) of formatVersion 1, 0 of the previous "
                                           "release's format (no formatVersion)")
    agent = {f.check: f for f in doctor_policy(node)}["policy.agent"]
    assert agent.status != FAIL, agent
    status = Path(policy_records.status_path(str(lock_dir)))
    status.write_text(newer({"syncedAt": 1.0}))
    (failed,) = state_formats(node)
    assert failed.status == FAIL and str(status) in failed.detail
    agent = {f.check: f for f in doctor_policy(node)}["policy.agent"]
    assert agent.status == "warn" and str(status) in agent.detail, agent
    record = Path(policy_records.record_path(str(lock_dir), "c2", "net1"))
    record.write_text(newer({}))
    (failed,) = state_formats(node)
    assert failed.status == FAIL and str(record) in failed.detail
    agent = {f.check: f for f in doctor_policy(node)}["policy.agent"]
    assert agent.status == FAIL and str(record) in agent.detail and \
        f"formatVersion {NEWER}" in agent.detail, agent
