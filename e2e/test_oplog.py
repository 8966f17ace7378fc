"""Operator logs: one JSON line per verb in the configured file, nothing on stdout but the
answer, and never a credential."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, host_local
from e2e.harness.publishing import create_pod, make_node

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]


def test_each_verb_writes_one_json_line_without_credentials(
        kube: Kube, cluster: Any, plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    log = tmp_path / "vpc-attach.log"
    uid = create_pod(kube, "logged", node.name)
    args = node.cni_args("logged", uid)
    plugin.environ["VPC_ATTACH_LOG_FILE"] = str(log)  # the node's log (SPEC §14)
    conf = base_conf(vpc, "1", ipam=host_local(tmp_path / "ipam", "fd00:10a::/64"))
    conf.pop("publish")
    added = plugin.call("ADD", conf, container_id="ctr-logged", netns=netns, CNI_ARGS=args)
    assert added.status == 0 and json.loads(added.stdout)["cniVersion"] == "1.1.0"
    failed = plugin.call("ADD", {**conf, "mtu": 1}, container_id="ctr-bad", netns=netns,
                         CNI_ARGS=args)
    assert failed.code == 7
    plugin.ok("DEL", conf, container_id="ctr-logged", netns=netns, CNI_ARGS=args)

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    verbs = [line for line in lines if "verb" in line]
    assert [(v["verb"], v["containerID"], v["outcome"], v["code"]) for v in verbs] == [
        ("ADD", "ctr-logged", "ok", 0), ("ADD", "ctr-bad", "error", 7),
        ("DEL", "ctr-logged", "ok", 0)]
    assert all(v["pod"] == "default/logged" and v["durationMs"] > 0 for v in verbs)
    assert all(v["netns"] == str(netns) and v["cniVersion"] == conf["cniVersion"]
               for v in verbs)
    assert "mtu" in verbs[1]["error"]
    text = log.read_text()
    assert cluster.plugin_token not in text, "a credential reached the log"
    assert "BEGIN" not in text and "Bearer" not in text
