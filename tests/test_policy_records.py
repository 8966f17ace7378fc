"""The node's policy records (cni_plugin/policy/records.py), one agent pass over them
(policy/sync.py) with a stand-in enforcer, and doctor's reading of the agent's status."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.doctor.node import Node
from cni_plugin.doctor.policy import policy as doctor_policy
from cni_plugin.kube.networks import NetworkName
from cni_plugin.policy import records
from cni_plugin.policy.compile import PRIMARY, Compiled, PodFacts, World
from cni_plugin.policy.enforce import Enforced
from cni_plugin.policy.model import parse_policy
from cni_plugin.policy.networks import PodKey
from cni_plugin.policy.records import LocalAttachment
from cni_plugin.policy.sync import sync
from netconf.errors import NEWER_FORMAT, CniError
from netconf.formats import FORMAT_VERSION
from netconf.host import HostSettings


def attachment(container: str = "c1", ifname: str = "net1", network_name: str = "net-a",
               kind: str = "veth") -> LocalAttachment:
    return LocalAttachment(container, ifname, kind, "/var/run/netns/x", "G000000a1001H", "a1",
                           "1", 7, PodKey("ns1", container, "uid"), NetworkName("ns1", "nad"),
                           ("10.0.0.5", "fd00::5"), network_name)


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    written = attachment()
    records.write(str(tmp_path), written)
    primary = LocalAttachment(**{**written.__dict__, "container_id": "c2", "network": PRIMARY})
    records.write(str(tmp_path), primary)
    assert sorted(records.read_all(str(tmp_path)), key=lambda a: a.container_id) == \
        [written, primary]
    body = json.loads(Path(records.record_path(str(tmp_path), "c1", "net1")).read_text())
    assert body["formatVersion"] == FORMAT_VERSION


def test_a_newer_format_is_refused_and_a_damaged_record_skipped(tmp_path: Path) -> None:
    with pytest.raises(CniError) as refused:
        records.parse({"formatVersion": FORMAT_VERSION + 1}, "/x.json")
    assert refused.value.code == NEWER_FORMAT  # more: tests/test_newer_formats.py
    records.write(str(tmp_path), attachment())
    (tmp_path / records.DIRECTORY / "broken.json").write_text("{")
    assert [a.container_id for a in records.read_all(str(tmp_path))] == ["c1"]


def test_gc_forgets_only_its_networks_attachments_the_runtime_no_longer_lists(
        tmp_path: Path) -> None:
    for container, network in (("kept", "net-a"), ("gone", "net-a"), ("other", "net-b")):
        records.write(str(tmp_path), attachment(container, network_name=network))
    assert records.remove_except(str(tmp_path), "net-a", {("kept", "net1")}) == 1
    assert sorted(a.container_id for a in records.read_all(str(tmp_path))) == ["kept", "other"]


class StandInEnforcer:
    """Remembers what it was asked to enforce; a tap it cannot filter."""

    def __init__(self) -> None:
        self.applied: dict[str, Compiled] = {}
        self.forgotten: list[str] = []

    def apply(self, attachment: LocalAttachment, compiled: Compiled,
              deadline: Deadline) -> Enforced:
        self.applied[attachment.key] = compiled
        if attachment.kind == "tap":
            return Enforced(0, "no stateful tc")
        return Enforced(len(compiled.ingress.allows))

    def forget(self, key: str) -> None:
        self.forgotten.append(key)


def test_one_pass_compiles_every_attachment_and_names_what_it_could_not_enforce() -> None:
    deny = parse_policy({"kind": "MultiNetworkPolicy", "metadata": {
        "name": "deny", "namespace": "ns1", "uid": "u",
        "annotations": {"k8s.v1.cni.cncf.io/policy-for": "ns1/nad"}},
        "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{}]}})
    pods = {("ns1", name): PodFacts("ns1", name, {"app": "db" if name != "web" else "web"})
            for name in ("db", "vm", "web")}
    world = World([deny], pods, {"ns1": {}}, ())
    enforcer = StandInEnforcer()
    result = sync(world, [attachment("db"), attachment("vm", kind="tap"), attachment("web")],
                  enforcer, Deadline(5))  # type: ignore[arg-type]
    assert enforcer.applied["db/net1"].ingress.isolated
    assert not enforcer.applied["web/net1"].enforced
    assert (result.rules, result.enforced) == (1, 2)
    assert [(u.attachment.container_id, u.reason, u.policies) for u in result.unenforced] == \
        [("vm", "no stateful tc", ("MultiNetworkPolicy ns1/deny",))]


def test_doctor_says_later_changes_are_not_followed_without_an_agent(tmp_path: Path) -> None:
    off = Node(environ={"VPC_ATTACH_MULTI_NETWORK_POLICY": "off"}, cni_conf_dir="",
               cni_bin_dir="", metrics_address="", ipam_data_dirs=[],
               settings=HostSettings(lock_dir=str(tmp_path)))
    node = Node(environ={}, cni_conf_dir="", cni_bin_dir="", metrics_address="",
                ipam_data_dirs=[], settings=HostSettings(lock_dir=str(tmp_path)))
    records.write(str(tmp_path), attachment())
    found = {f.check: f for f in doctor_policy(off)}
    assert found.pop("policy.mode").status == "warn"  # the operator's off: never silent
    assert {f.status for f in found.values()} == {"ok"} and "off" in found["policy.agent"].detail
    found = {f.check: f for f in doctor_policy(node)}
    assert found["policy.agent"].status == "warn"
    assert "not followed" in found["policy.agent"].detail
    (tmp_path / records.DIRECTORY / "status.json").write_text(json.dumps({
        "formatVersion": 1, "syncedAt": time.time(), "rules": 3, "enforced": 1,
        "unenforced": [{"attachment": "Pod ns1/vm interface net1 (tap G…H)",
                        "reason": "no stateful tc", "policies": ["MultiNetworkPolicy ns1/x"]}]}))
    found = {f.check: f for f in doctor_policy(node)}
    assert found["policy.agent"].status == "ok"
    assert found["policy.unenforced"].status == "warn"
    assert "Pod ns1/vm" in found["policy.unenforced"].detail


def test_doctor_reports_multi_network_policy_on_by_default_and_warns_of_taps_only_where_one_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cni_plugin.doctor import policy as doctor_module
    monkeypatch.setattr(doctor_module, "_module_available", lambda name: name != "act_ct")
    node = Node(environ={}, cni_conf_dir="", cni_bin_dir="", metrics_address="",
                ipam_data_dirs=[], settings=HostSettings(lock_dir=str(tmp_path)))
    found = {f.check: f for f in doctor_policy(node)}
    assert found["policy.mode"].status == "ok"
    assert found["policy.mode"].detail.startswith("MultiNetworkPolicy: enforce (the default)")
    assert found["policy.kernel"].status == "ok" and "act_ct" in found["policy.kernel"].detail
    records.write(str(tmp_path), attachment("vm", kind="tap"))
    found = {f.check: f for f in doctor_policy(node)}
    assert found["policy.kernel"].status == "warn" and "act_ct" in found["policy.kernel"].detail
    monkeypatch.setattr(doctor_module, "_module_available", lambda name: True)
    assert {f.check: f for f in doctor_policy(node)}["policy.kernel"].status == "ok"
