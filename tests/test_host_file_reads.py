"""The node's host file is read once per verb and once per `vpc-attach doctor` run (issue 38):
every step and every check reads the settings resolved from that one read. Counted here as
opens of the file in this process; the ADD on the real kernel is counted end to end by
e2e/test_decode_once.py."""

from __future__ import annotations

import ast
import builtins
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import oplog
from cni_plugin.core.request import Invocation, Request
from cni_plugin.doctor import diagnose
from cni_plugin.doctor.node import Node
from cni_plugin.ipam.plugin.config import node_data_root
from netconf.host import lenient_host_settings

HOST = "host.json"


@pytest.fixture
def host_file_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every open of tmp_path/host.json in this process, from here on."""
    path = str(tmp_path / HOST)
    opens: list[str] = []
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike) and os.fspath(file) == path:
            opens.append(path)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    yield opens


def _write_host_file(tmp_path: Path, **settings: Any) -> dict[str, str]:
    """A host file of a galactic node (pins, locator's underlay, policy on) and the
    environment naming it."""
    (tmp_path / "locks").mkdir(exist_ok=True)
    (tmp_path / HOST).write_text(json.dumps({
        "nodeName": "worker-1", "lockDir": str(tmp_path / "locks"),
        "logFile": str(tmp_path / "vpc-attach.log"), "ipamDataRoot": str(tmp_path),
        "galacticPinDir": str(tmp_path / "pins"), "underlayMTU": 9000,
        "networkPolicy": "enforce", **settings}))
    return {"VPC_ATTACH_HOST_CONFIG": str(tmp_path / HOST)}


def _doctor_node(tmp_path: Path, environ: dict[str, str]) -> Node:
    """A node with two vpc-attach networks (vpc-attach-ipam, so each confines its dataDir to
    the node's ipamDataRoot) and nothing else running."""
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    conf_dir.mkdir()
    bin_dir.mkdir()
    for name in ("vpc-attach", "vpc-attach-ipam"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    for index, isolation in enumerate(("table", "vrf")):
        stanza = {"type": "vpc-attach", "vpc": f"1{index}", "vpcattachment": "1",
                  "isolation": isolation,
                  "ipam": {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / f"ipam{index}"),
                           "ipv4_subnet": f"10.{index}.0.0/24"}}
        (conf_dir / f"{index}-net.conflist").write_text(json.dumps(
            {"cniVersion": "1.1.0", "name": f"net{index}", "plugins": [stanza]}))
    return Node(environ=environ, cni_conf_dir=str(conf_dir), cni_bin_dir=str(bin_dir),
                metrics_address="", ipam_data_dirs=[])


def test_one_doctor_run_reads_the_host_file_once(tmp_path: Path,
                                                 host_file_opens: list[str]) -> None:
    node = _doctor_node(tmp_path, _write_host_file(tmp_path))
    findings = {f.check: f for f in diagnose(node)}
    # Positive control: the settings, both networks and the galactic check came from the file.
    assert findings["settings.nodeName"].detail.startswith("worker-1 (host file")
    assert [conf.name for _, conf in node.networks] == ["net0", "net1"]
    assert str(tmp_path / "pins") in findings["datapath.galactic"].detail
    assert len(host_file_opens) == 1, f"doctor read the host file {len(host_file_opens)} times"


def test_what_a_vrf_add_on_a_galactic_node_asks_of_its_node_comes_from_one_read(
        tmp_path: Path, host_file_opens: list[str]) -> None:
    """Every reader of node settings an ADD has (the log, the parse, host protection, the
    galactic steps, policy, vpc-attach-ipam in-process, the Event) reads what the request
    read once."""
    environ = {**_write_host_file(tmp_path), "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c-1",
               "CNI_NETNS": "/var/run/netns/absent", "CNI_IFNAME": "eth0",
               "CNI_PATH": str(tmp_path / "bin"),
               "CNI_ARGS": "K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-0"}
    stanza = {"cniVersion": "1.1.0", "name": "galactic-vrf", "type": "vpc-attach", "vpc": "10",
              "vpcattachment": "1", "isolation": "vrf",
              "ipam": {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / "ipam"),
                       "ipv4_subnet": "10.9.0.0/24"}}
    request = Request(environ, json.dumps(stanza).encode())
    log = oplog.settings(request)
    invocation = Invocation.parse(request)
    node = invocation.node
    read = (log.path, invocation.host.lock_dir, node.galactic.pin_dir, node.galactic.underlay_mtu,
            node.datapath, node.policy.network_policy, node_data_root(node),
            node.host({}).node_name, lenient_host_settings(
                stanza, request.environ, request.readable_host_file()).node_name)
    # Positive control: each came from the file, not from a default.
    assert read[:4] == (str(tmp_path / "vpc-attach.log"), str(tmp_path / "locks"),
                        str(tmp_path / "pins"), 9000)
    assert read[5:] == (True, os.path.realpath(tmp_path), "worker-1", "worker-1")
    assert len(host_file_opens) == 1, f"read {len(host_file_opens)} times"


# The modules that may read the host file themselves, and why; every other module takes the
# settings it is handed (a verb's `Invocation.node`, doctor's `Node.host_file()`).
READERS = {
    "netconf/host.py": "the reader and its resolvers",
    "cni_plugin/core/request.py": "the verb's one read (`Request.host_file`)",
    "cni_plugin/doctor/node.py": "doctor's one read (`Node.host_file`)",
    "cni_plugin/agent/client.py": "the thin client, a process of its own (its own reader)",
    "cni_plugin/agent/server.py": "the agent's start: its own settings, not a verb's",
    "cni_plugin/agent/metrics.py": "a scrape's data root, not a verb's",
    "cni_plugin/install/cli.py": "the installer, which writes the file",
}
# A call that reads the file: these functions with fewer arguments than the one that hands
# them a host file already read.
READING_CALLS = {"read_host_file": 99, "resolve_host_settings": 99, "read": 2,
                 "resolve_galactic_settings": 2, "resolve_datapath_settings": 2,
                 "lenient_host_settings": 3}
REPO = Path(__file__).resolve().parent.parent


def host_file_reads_in(path: Path) -> list[int]:
    """The lines of path that read the host file (by READING_CALLS; `read` only as
    `NodeSettings.read`)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "read" and not (isinstance(func, ast.Attribute)
                                   and getattr(func.value, "id", "") == "NodeSettings"):
            continue
        if name in READING_CALLS and len(node.args) + len(node.keywords) < READING_CALLS[name]:
            lines.append(node.lineno)
    return lines


def test_only_the_named_modules_read_the_host_file() -> None:
    reading = {str(path.relative_to(REPO)): lines
               for folder in ("cni_plugin", "netconf")
               for path in sorted((REPO / folder).rglob("*.py"))
               if (lines := host_file_reads_in(path))}
    assert {path: lines for path, lines in reading.items() if path not in READERS} == {}


def test_the_check_sees_a_second_read(tmp_path: Path) -> None:
    module = tmp_path / "step.py"
    module.write_text("from netconf.host import NodeSettings, read_host_file\n"
                      "settings = NodeSettings.read(environ)\n"
                      "kept = NodeSettings.read(environ, host_file)\n"
                      "raw = read_host_file(environ)\n"
                      "galactic = resolve_galactic_settings(environ)\n")
    assert host_file_reads_in(module) == [2, 4, 5]
