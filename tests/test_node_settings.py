"""The node's settings are read once per verb (`NodeSettings`, carried by the `Invocation`) and
a setting of the node alone is declared once: its group's field says where it comes from
(host file key, environment variable), how it is read and its default; it is then refused in
a network config like every other (SPEC §4, §14)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import oplog
from cni_plugin.core.request import Invocation, Request
from cni_plugin.ipam.plugin.caller import Caller
from cni_plugin.ipam.plugin.verbs import IpamInvocation
from cni_plugin.kube.session import ColdCluster, VerbCluster
from netconf import host
from netconf import node_setting as registry
from netconf.errors import INVALID_CONFIG, CniError
from netconf.host import (
    HOST_CONFIG_ENV,
    STANZA_HOST_SETTINGS_ENV,
    NodeSettings,
    node_only_keys,
    stanza_host_values,
)
from netconf.node_setting import NodeSetting, node_setting, node_settings_group, resolve_group

STANZA: dict[str, Any] = {
    "cniVersion": "1.1.0", "name": "net1", "type": "vpc-attach", "vpc": "10",
    "vpcattachment": "10", "isolation": "vrf",
    "publish": {"bgp": False, "endpointSlice": False},
    "ipam": {"type": "vpc-attach-ipam", "ipv6_subnet": "fd00::/64"},
}


def _request(host_file: Path, **extra: str) -> Request:
    environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
               "CNI_NETNS": "/var/run/netns/absent",
               "CNI_PATH": "/opt/cni/bin", HOST_CONFIG_ENV: str(host_file), **extra}
    return Request(environ, json.dumps(STANZA).encode())


def test_a_verb_reads_the_host_file_once_whatever_its_steps_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps({
        "nodeName": "w1", "lockDir": str(tmp_path / "locks"), "ipamDataRoot": str(tmp_path),
        "galacticPinDir": "/sys/fs/bpf/elsewhere", "underlayMTU": 9000,
        "hostAccess": ["udp/53"]}))
    opened: list[str] = []
    real_open = open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(host, "open", counting_open, raising=False)
    request = _request(host_file)
    assert oplog.settings(request).path is None  # the log settings, before the parse
    inv = Invocation.parse(request)
    # What the steps read: each group, the IPAM plugin's root, the node's own identity.
    assert inv.node.galactic.pin_dir == "/sys/fs/bpf/elsewhere"
    assert inv.node.galactic.underlay_mtu == 9000
    assert [str(p) for p in inv.node.datapath.host_access] == ["udp/53"]
    assert inv.node.host({}).node_name == inv.host.node_name == "w1"
    session = VerbCluster(ColdCluster(), inv.host.kubeconfig)
    caller = Caller(inv.node, inv.host, session, inv.deadline)
    ipam = IpamInvocation.parse(request, caller)  # vpc-attach-ipam in-process
    assert ipam.conf.data_dir == str(tmp_path.resolve())
    assert opened == [str(host_file)], "one read for the whole verb"


def test_a_malformed_group_is_code_7_where_it_is_read_not_before(tmp_path: Path) -> None:
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps({"underlayMTU": "9k"}))
    inv = Invocation.parse(_request(host_file))  # a verb that never reads it succeeds
    assert inv.node.datapath.host_access == ()
    with pytest.raises(CniError) as refused:
        _ = inv.node.galactic
    assert refused.value.code == INVALID_CONFIG and "underlayMTU" in refused.value.msg


def test_the_environment_given_to_an_ipam_executable_is_the_requests_node_settings(
        tmp_path: Path) -> None:
    inv = Invocation.parse(_request(tmp_path / "absent.json", VPC_ATTACH_NODE_NAME="w2"))
    assert inv.node.environ == {HOST_CONFIG_ENV: str(tmp_path / "absent.json"),
                                "VPC_ATTACH_NODE_NAME": "w2"}


@pytest.mark.parametrize("key", sorted(node_only_keys()))
@pytest.mark.parametrize("allow", [False, True])
def test_every_setting_of_the_node_alone_is_refused_in_a_network_config(
        key: str, allow: bool) -> None:
    environ = {STANZA_HOST_SETTINGS_ENV: "allow"} if allow else {}
    with pytest.raises(CniError) as refused:
        stanza_host_values({key: "x"}, environ, {})
    assert refused.value.code == INVALID_CONFIG
    assert f"config key {key!r} is a host setting" in refused.value.msg
    assert "allow" not in refused.value.details  # no way around it to suggest


def _switch(value: Any, source: NodeSetting[bool]) -> bool:
    if value in (True, False, "true", "false"):
        return value in (True, "true")
    raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}", "expected true or false")


def test_a_new_setting_is_one_field_of_its_group() -> None:
    """The pattern a new setting follows (e.g. galacticOffloads in `GalacticSettings`)."""
    @node_settings_group
    @dataclass(frozen=True)
    class Example:
        offloads: bool = node_setting("exampleOffloads", "VPC_ATTACH_EXAMPLE_OFFLOADS",
                                      _switch, True)

    try:
        assert resolve_group(Example, {}, {}) == Example(True)  # the default
        assert resolve_group(Example, {}, {"exampleOffloads": False}) == Example(False)
        assert resolve_group(Example, {"VPC_ATTACH_EXAMPLE_OFFLOADS": "true"},
                             {"exampleOffloads": False}) == Example(True)  # env wins
        with pytest.raises(CniError) as malformed:
            resolve_group(Example, {}, {"exampleOffloads": "maybe"})
        assert "exampleOffloads" in malformed.value.msg
        with pytest.raises(CniError) as refused:  # and no network config sets it
            stanza_host_values({"exampleoffloads": True}, {STANZA_HOST_SETTINGS_ENV: "allow"},
                               {})
        assert "VPC_ATTACH_EXAMPLE_OFFLOADS" in refused.value.msg
    finally:
        registry._GROUPS.remove(Example)


def test_settings_read_from_the_host_file_once_survive_its_removal(tmp_path: Path) -> None:
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps({"galacticPinDir": "/pins", "nodeName": "w3"}))
    node = NodeSettings.read({HOST_CONFIG_ENV: str(host_file)})
    host_file.unlink()
    assert (node.galactic.pin_dir, node.host({}).node_name) == ("/pins", "w3")
