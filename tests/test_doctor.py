"""`vpc-attach doctor` without root or a cluster: the permissions it asks for are exactly the
packaged ClusterRole's, CNI configs are found and validated, settings name their source, and
the report's table and exit status (every check against real nodes: e2e/test_doctor.py)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import yaml

from cni_plugin.doctor import render_table
from cni_plugin.doctor.cluster import CLUSTER_ROLE
from cni_plugin.doctor.networks import networks as check_networks
from cni_plugin.doctor.node import FAIL, OK, WARN, Finding, Node
from cni_plugin.doctor.settings import host_settings

REPO = Path(__file__).resolve().parent.parent


def test_the_permissions_checked_are_exactly_the_packaged_cluster_roles() -> None:
    role = yaml.safe_load((REPO / "packaging" / "rbac" / "clusterrole.yaml").read_text())
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    checked = {(group, resource, verb) for group, resource, verbs in CLUSTER_ROLE
               for verb in verbs}
    assert checked == granted


def _node(tmp_path: Path, **environ: str) -> Node:
    return Node(environ={"VPC_ATTACH_HOST_CONFIG": str(tmp_path / "host.json"), **environ},
                cni_conf_dir=str(tmp_path / "net.d"), cni_bin_dir=str(tmp_path / "bin"),
                metrics_address="", ipam_data_dirs=[])


def test_each_setting_says_where_it_came_from(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(json.dumps({"nodeName": "worker-1"}))
    node = _node(tmp_path, VPC_ATTACH_LOG_BACKUPS="5")
    found = {f.check: f for f in host_settings(node)}
    assert found["settings.nodeName"].detail == \
        f"worker-1 (host file {tmp_path / 'host.json'})"
    assert found["settings.logBackups"].detail == "5 (environment VPC_ATTACH_LOG_BACKUPS)"
    assert found["settings.logMaxBytes"].detail == "10485760 (default)"
    assert found["settings.kubeconfig"].detail == "(unset) (default)"
    assert node.settings.node_name == "worker-1"


def test_a_broken_host_file_fails_and_the_rest_still_resolves(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text("{")
    found = host_settings(_node(tmp_path))
    assert found[0].check == "settings.hostFile" and found[0].status == FAIL and found[0].fix


def _write_conflist(tmp_path: Path, name: str, stanza: dict[str, Any]) -> None:
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / name).write_text(json.dumps(
        {"cniVersion": "1.1.0", "name": name.split(".")[0],
         "plugins": [{"type": "vpc-attach", **stanza}, {"type": "tuning"}]}))


def _binaries(tmp_path: Path, *names: str) -> None:
    (tmp_path / "bin").mkdir(exist_ok=True)
    for name in names:
        path = tmp_path / "bin" / name
        path.write_text("#!/bin/sh\n")
        os.chmod(path, 0o755)


def test_configs_referencing_vpc_attach_are_validated(tmp_path: Path) -> None:
    _binaries(tmp_path, "vpc-attach", "vpc-attach-ipam")
    good: dict[str, Any] = {"vpc": "10", "vpcattachment": "1", "isolation": "table",
            "ipam": {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / "ipam"),
                     "ipv4_subnet": "10.9.0.0/24"}}
    _write_conflist(tmp_path, "10-good.conflist", good)
    _write_conflist(tmp_path, "20-bad.conflist", {**good, "mtuu": 1500})
    _write_conflist(tmp_path, "30-missing.conflist", {**good, "ipam": {"type": "host-local"}})
    _write_conflist(tmp_path, "35-host-key.conflist", {**good, "logFile": "/etc/shadow"})
    _write_conflist(tmp_path, "36-outside-root.conflist",
                    {**good, "ipam": {**good["ipam"], "dataDir": "/srv/elsewhere"}})
    (tmp_path / "net.d" / "40-other.conf").write_text('{"type": "bridge"}')
    node = _node(tmp_path, VPC_ATTACH_IPAM_DATA_ROOT=str(tmp_path))
    found = check_networks(node)
    assert [f.status for f in found] == [OK, FAIL, FAIL, FAIL, FAIL, WARN]
    assert found[5].check == "routes.remote" and "'10-good'" in found[5].detail
    assert "unknown config key 'mtuu'" in found[1].detail
    assert "'host-local' not found in CNI_PATH" in found[2].detail
    assert "config key 'logFile' is a host setting" in found[3].detail
    assert "'ipam.dataDir'" in found[4].detail and "ipamDataRoot" in found[4].detail
    assert [conf.name for _, conf in node.networks] == ["10-good"]
    assert node.ipam_data_dirs == [str(tmp_path / "ipam")]


def test_only_table_mode_networks_that_publish_bgp_are_warned_about_remote_routes(
        tmp_path: Path) -> None:
    _binaries(tmp_path, "vpc-attach", "host-local")
    ipam = {"type": "host-local", "subnet": "10.9.0.0/24"}
    _write_conflist(tmp_path, "10-vrf.conflist", {"vpc": "10", "vpcattachment": "1",
                                                 "isolation": "vrf", "ipam": ipam})
    _write_conflist(tmp_path, "20-local.conflist", {"vpc": "20", "vpcattachment": "1",
                                                   "isolation": "table", "ipam": ipam,
                                                   "publish": {"bgp": False}})
    _write_conflist(tmp_path, "30-table.conflist", {"vpc": "30", "vpcattachment": "1",
                                                   "isolation": "table", "ipam": ipam})
    listed = check_networks(_node(tmp_path))
    assert [f.status for f in listed if f.check == "cni.conflist"] == [OK, OK, OK]
    found = {f.check: f for f in listed}
    assert found["routes.remote"].status == WARN
    assert "networks '30-table' use isolation 'table'" in found["routes.remote"].detail
    assert "vrf" in found["routes.remote"].fix
    (tmp_path / "net.d" / "30-table.conflist").unlink()
    assert "routes.remote" not in {f.check for f in check_networks(_node(tmp_path))}


def test_a_node_that_allows_stanza_host_settings_is_warned_about(tmp_path: Path) -> None:
    found = {f.check: f for f in host_settings(
        _node(tmp_path, VPC_ATTACH_STANZA_HOST_SETTINGS="allow"))}
    assert found["settings.stanzaHostSettings"].status == WARN
    assert "settings.stanzaHostSettings" not in {f.check for f in host_settings(
        _node(tmp_path))}
    assert found["settings.ipamDataRoot"].detail == "/var/lib/cni/vpc-attach-ipam"


def test_no_config_referencing_vpc_attach_is_only_a_warning(tmp_path: Path) -> None:
    (tmp_path / "net.d").mkdir()
    found = check_networks(_node(tmp_path))
    assert [f.status for f in found] == [WARN]


def test_the_table_shows_each_problems_fix_and_counts_the_problems() -> None:
    table = render_table([Finding("kernel.vrf", WARN, "no VRF", "modprobe vrf"),
                          Finding("bgp.router", FAIL, "0 BGPRouters", "create one"),
                          Finding("api.server", OK, "answered", "unused")])
    assert table.splitlines() == [
        "CHECK       STATUS  DETAIL",
        "kernel.vrf  warn    no VRF",
        "                    fix: modprobe vrf",
        "bgp.router  fail    0 BGPRouters",
        "                    fix: create one",
        "api.server  ok      answered",
        "1 problem(s)"]


def test_pending_migration_targets_are_listed_and_an_unannounced_ready_one_warned(
        tmp_path: Path) -> None:
    from typing import cast

    from cni_plugin.kube.client import KubeClient
    from cni_plugin.kubevirt.doctor import migration_targets
    from cni_plugin.kubevirt.migration import (
        READY_ANNOTATION,
        MigrationSource,
        PendingTarget,
        write_pending,
    )
    node = _node(tmp_path)
    node.settings = dataclasses.replace(node.settings, lock_dir=str(tmp_path / "locks"))
    assert [f.status for f in migration_targets(node)] == [OK]
    write_pending(node.settings.lock_dir, PendingTarget(
        network="vms", container_id="ctr-target", ifname="net1", pod_namespace="vms",
        pod_name="target", pod_uid="uid-t", node="node-2", bgp_namespace="galactic-system",
        advertisement="ad", annotations={}, spec={}, owner_references=[], created_by="c",
        slices=[], source=MigrationSource("vms", "source", "node-1"), source_advertisement="s"))
    waiting = migration_targets(node)
    assert waiting[0].status == OK and "vms/target" in waiting[0].detail
    assert "source vms/source on node node-1" in waiting[0].detail

    class Pods:
        def get(self, *_: Any, **__: Any) -> dict[str, Any]:
            return {"metadata": {"uid": "uid-t", "annotations": {READY_ANNOTATION: "now"}}}

    node.client = cast(KubeClient, Pods())
    overdue = migration_targets(node)
    assert overdue[0].status == WARN and "marked ready but not announced" in overdue[0].detail
