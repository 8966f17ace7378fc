"""A network config is tenant input (SPEC §14): one that sets a host setting is code 7 naming
the key and where it belongs, on every verb, before anything is logged, written or connected
to — unless the node sets `stanzaHostSettings: allow`. The executable's own run of these
(installed, in-process and through the agent) is e2e/test_stanza_host_settings.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin import dispatch
from cni_plugin.agent import client
from cni_plugin.core import oplog
from cni_plugin.core.request import Invocation, Request
from netconf.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError
from netconf.host import (
    DEFAULT_HOST_CONFIG,
    HOST_CONFIG_ENV,
    STANZA_HOST_SETTINGS_ENV,
    resolve_host_settings,
)

# host-file key -> (environment variable, a valid value)
HOST_KEYS: dict[str, tuple[str, Any]] = {
    "nodeName": ("VPC_ATTACH_NODE_NAME", "other-node"),
    "kubeconfig": ("VPC_ATTACH_KUBECONFIG", "/etc/kubernetes/admin.conf"),
    "namespace": ("VPC_ATTACH_NAMESPACE", "kube-system"),
    "logFile": ("VPC_ATTACH_LOG_FILE", "/tmp/victim/precious.conf"),
    "logLevel": ("VPC_ATTACH_LOG_LEVEL", "debug"),
    "logMaxBytes": ("VPC_ATTACH_LOG_MAX_BYTES", 1),
    "logBackups": ("VPC_ATTACH_LOG_BACKUPS", 1),
    "agentSocket": ("VPC_ATTACH_AGENT_SOCKET", "/tmp/victim/agent.sock"),
    "timeoutSeconds": ("VPC_ATTACH_TIMEOUT_SECONDS", 2),
    "lockDir": ("VPC_ATTACH_LOCK_DIR", "/tmp/victim/locks"),
}
# Never from a network config, even on a node that allows the others.
NODE_ONLY: dict[str, tuple[str, Any]] = {
    "stanzaHostSettings": ("VPC_ATTACH_STANZA_HOST_SETTINGS", "allow"),
    "ipamDataRoot": ("VPC_ATTACH_IPAM_DATA_ROOT", "/"),
    "tenancy": ("VPC_ATTACH_TENANCY", "off"),
    # a tenant's NAD turning policy off for its own attachments (SPEC §17)
    "multiNetworkPolicy": ("VPC_ATTACH_MULTI_NETWORK_POLICY", "off"),
}
VERBS = ("ADD", "DEL", "CHECK", "STATUS", "GC")
STANZA: dict[str, Any] = {
    "cniVersion": "1.1.0", "name": "tenant-net", "type": "vpc-attach", "vpc": "10",
    "vpcattachment": "10", "isolation": "table",
    "publish": {"bgp": False, "endpointSlice": False}, "ipam": {"type": "host-local"},
}


def cni_env(tmp_path: Path, verb: str = "ADD", **extra: str) -> dict[str, str]:
    return {"CNI_COMMAND": verb, "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/var/run/netns/p",
            "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
            HOST_CONFIG_ENV: str(tmp_path / "host.json"), **extra}


def refused(tmp_path: Path, config: dict[str, Any], verb: str = "ADD",
            **extra: str) -> CniError:
    with pytest.raises(CniError) as info:
        Invocation.parse(Request(cni_env(tmp_path, verb, **extra), json.dumps(config).encode()))
    return info.value


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("key", sorted(HOST_KEYS))
def test_each_host_key_in_a_config_is_code_7_naming_it_and_where_it_belongs(
        tmp_path: Path, key: str, verb: str) -> None:
    env_name, value = HOST_KEYS[key]
    err = refused(tmp_path, {**STANZA, key: value}, verb)
    assert err.code == INVALID_CONFIG
    assert f"config key {key!r} is a host setting" in err.msg
    assert env_name in err.msg and str(tmp_path / "host.json") in err.msg
    assert "stanzaHostSettings: allow" in err.details


@pytest.mark.parametrize("key", sorted(NODE_ONLY))
@pytest.mark.parametrize("allow", [False, True])
def test_node_only_keys_are_refused_even_where_stanza_host_settings_are_allowed(
        tmp_path: Path, key: str, allow: bool) -> None:
    env_name, value = NODE_ONLY[key]
    extra = {STANZA_HOST_SETTINGS_ENV: "allow"} if allow else {}
    err = refused(tmp_path, {**STANZA, key: value}, **extra)
    assert err.code == INVALID_CONFIG and repr(key) in err.msg and env_name in err.msg
    assert "allow" not in err.details  # no way around it to suggest


@pytest.mark.parametrize("verb", VERBS)
def test_a_key_repeating_the_nodes_own_value_chooses_nothing_and_is_accepted(
        tmp_path: Path, verb: str) -> None:
    """Configs written before SPEC §14 (the shared veth example sets the default namespace)."""
    config = {**STANZA, "namespace": "galactic-system", "nodeName": "w1"}
    env = cni_env(tmp_path, verb, VPC_ATTACH_NODE_NAME="w1")
    inv = Invocation.parse(Request(env, json.dumps(config).encode()))
    assert (inv.host.namespace, inv.host.node_name) == ("galactic-system", "w1")
    other = refused(tmp_path, {**config, "namespace": "kube-system"}, verb,
                    VPC_ATTACH_NODE_NAME="w1")
    assert "'namespace' is a host setting" in other.msg


def test_the_message_names_the_default_host_file_when_none_is_set() -> None:
    with pytest.raises(CniError) as info:
        resolve_host_settings({"nodeName": "x"}, {})
    assert DEFAULT_HOST_CONFIG in info.value.msg


@pytest.mark.parametrize("value", [None, "", 0, [], {"nested": 1}])
def test_presence_alone_is_refused_whatever_the_value(tmp_path: Path, value: Any) -> None:
    assert refused(tmp_path, {**STANZA, "logFile": value}).code == INVALID_CONFIG


def test_the_host_key_is_named_before_anything_else_wrong_with_the_config(
        tmp_path: Path) -> None:
    config = {**STANZA, "vpc": "not base62!", "mystery": 1, "LogFile": "/tmp/victim/x"}
    err = refused(tmp_path, config)
    assert "'logFile' is a host setting" in err.msg


@given(keys=st.lists(st.sampled_from(sorted(HOST_KEYS)), min_size=1, unique=True),
       spelling=st.lists(st.booleans(), min_size=20, max_size=20))
def test_any_host_keys_in_any_letter_case_are_refused_naming_one(
        keys: list[str], spelling: list[bool]) -> None:
    # Keys match case-insensitively, like every stanza key (containerd capitalises some).
    def respell(key: str) -> str:
        return "".join(c.upper() if up else c.lower() for c, up in zip(key, spelling, strict=False))
    config = {**STANZA, **{respell(k): HOST_KEYS[k][1] for k in keys}}
    with pytest.raises(CniError) as info:
        resolve_host_settings(config, {HOST_CONFIG_ENV: "/nonexistent/host.json"})
    assert info.value.code == INVALID_CONFIG
    assert any(f"config key {k!r} is a host setting" in info.value.msg for k in keys)


# --- the node's switch -------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "file", "allowed"), [
    ({}, {}, False),
    ({STANZA_HOST_SETTINGS_ENV: "deny"}, {}, False),
    ({}, {"stanzaHostSettings": "deny"}, False),
    ({STANZA_HOST_SETTINGS_ENV: "allow"}, {}, True),
    ({}, {"stanzaHostSettings": "allow"}, True),
    ({STANZA_HOST_SETTINGS_ENV: "deny"}, {"stanzaHostSettings": "allow"}, False),  # env first
    ({STANZA_HOST_SETTINGS_ENV: ""}, {"stanzaHostSettings": "allow"}, True),  # empty: unset
])
def test_the_node_allows_stanza_host_settings_only_with_allow(
        tmp_path: Path, env: dict[str, str], file: dict[str, Any], allowed: bool) -> None:
    (tmp_path / "host.json").write_text(json.dumps(file))
    config = {**STANZA, "nodeName": "stanza-node", "timeoutSeconds": 3}
    request = Request(cni_env(tmp_path, **env), json.dumps(config).encode())
    if not allowed:
        with pytest.raises(CniError):
            Invocation.parse(request)
        return
    inv = Invocation.parse(request)
    assert inv.host.node_name == "stanza-node" and inv.final_deadline.seconds == 3.0


@pytest.mark.parametrize("value", ["yes", "Allow", "true", "1", "ALLOW", 1, True])
def test_any_other_switch_value_is_code_7_even_for_a_config_without_host_keys(
        tmp_path: Path, value: Any) -> None:
    (tmp_path / "host.json").write_text(json.dumps({"stanzaHostSettings": value}))
    err = refused(tmp_path, STANZA)
    assert err.code == INVALID_CONFIG and "stanzaHostSettings" in err.msg
    assert STANZA_HOST_SETTINGS_ENV in err.details


# --- nothing is logged to, rotated or connected to a stanza's choice ---------------------------


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file with content, in its own directory, that a tenant's config points the log at."""
    directory = tmp_path / "victim"
    directory.mkdir()
    precious = directory / "precious.conf"
    precious.write_text("root:do-not-touch\n" * 4)
    return precious


@pytest.mark.parametrize("verb", VERBS)
def test_a_refused_config_never_touches_the_log_file_it_names(
        tmp_path: Path, victim: Path, verb: str) -> None:
    node_log = tmp_path / "node.log"
    config = {**STANZA, "logFile": str(victim), "logMaxBytes": "1", "logBackups": "1",
              "logLevel": "debug"}
    request = Request(cni_env(tmp_path, verb, VPC_ATTACH_LOG_FILE=str(node_log)),
                      json.dumps(config).encode())
    oplog.configure(request)
    outcome = dispatch.run(request)
    status, payload = outcome.status, outcome.payload
    assert victim.read_text() == "root:do-not-touch\n" * 4
    assert sorted(p.name for p in victim.parent.iterdir()) == ["precious.conf"]
    lines = [json.loads(line) for line in node_log.read_text().splitlines()]
    if verb == "DEL":  # SPEC §3: DEL succeeds after a failed ADD; it changes nothing
        assert (status, payload) == (0, None)
        assert any("'logFile' is a host setting" in line.get("msg", "") for line in lines)
    else:
        assert status == 1 and payload is not None and payload["code"] == INVALID_CONFIG
    assert (lines[-1]["verb"], lines[-1]["code"]) == (verb, 0 if verb == "DEL" else 7)


def test_log_settings_ignore_the_stanza_unless_allowed(tmp_path: Path, victim: Path) -> None:
    config = json.dumps({**STANZA, "LOGFILE": str(victim), "logMaxBytes": 1}).encode()
    denied = oplog.settings(Request(cni_env(tmp_path), config))
    assert denied.path is None and denied.max_bytes == 10 * 1024 * 1024
    allowed = oplog.settings(Request(cni_env(tmp_path, **{STANZA_HOST_SETTINGS_ENV: "allow"}),
                                     config))
    assert (allowed.path, allowed.max_bytes) == (str(victim), 1)


# --- the forwarding client -----------------------------------------------------------------------


def test_the_client_never_picks_a_configs_socket_or_deadline_unless_allowed(
        tmp_path: Path) -> None:
    config = json.dumps({**STANZA, "agentSocket": "/tmp/victim/agent.sock",
                         "timeoutSeconds": 500}).encode()
    env = cni_env(tmp_path)
    assert client.route(env, config) == (client.DEFAULT_SOCKET, 30.0 + client.ANSWER_GRACE_SECONDS)
    (tmp_path / "host.json").write_text(json.dumps({"agentSocket": "/run/node.sock",
                                                    "timeoutSeconds": 7}))
    assert client.route(env, config) == ("/run/node.sock", 7.0 + client.ANSWER_GRACE_SECONDS)
    env_set = {**env, "VPC_ATTACH_AGENT_SOCKET": "/run/env.sock",
               "VPC_ATTACH_TIMEOUT_SECONDS": "4.5"}
    assert client.route(env_set, config) == ("/run/env.sock", 4.5 + client.ANSWER_GRACE_SECONDS)
    allowed = {**env, STANZA_HOST_SETTINGS_ENV: "allow"}
    assert client.route(allowed, config) == ("/tmp/victim/agent.sock",
                                              500.0 + client.ANSWER_GRACE_SECONDS)


@pytest.mark.parametrize(("timeout", "expected"), [
    ('"12"', 12.0), ("0.5", 0.5), ("1e1", 10.0), ("0", 30.0), ("601", 30.0), ('"soon"', 30.0),
    ("[1]", 30.0), ("null", 30.0),
])
def test_the_client_reads_the_host_files_timeout_leniently(
        tmp_path: Path, timeout: str, expected: float) -> None:
    (tmp_path / "host.json").write_text('{"timeoutSeconds": ' + timeout + "}")
    _, seconds = client.route(cni_env(tmp_path), b"{}")
    assert seconds == expected + client.ANSWER_GRACE_SECONDS


def test_status_waits_only_its_own_short_deadline(tmp_path: Path) -> None:
    env = cni_env(tmp_path, "STATUS", VPC_ATTACH_TIMEOUT_SECONDS="60")
    assert client.route(env, b"{}")[1] == client.STATUS_TIMEOUT_S + client.ANSWER_GRACE_SECONDS


@pytest.fixture
def silent_agent(unix_listener: socket.socket) -> Iterator[str]:
    """A Unix socket that accepts connections and never answers."""
    listener = unix_listener
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield str(listener.getsockname())
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()


def test_a_silent_agent_is_code_11_once_the_deadline_has_passed(
        tmp_path: Path, silent_agent: str) -> None:
    started = time.monotonic()
    answer = client.forward(cni_env(tmp_path), json.dumps(STANZA).encode(), silent_agent, 0.6)
    took = time.monotonic() - started
    assert answer is not None
    status, text = answer
    body = json.loads(text)
    assert status == 1 and body["code"] == TRY_AGAIN_LATER
    assert body["msg"] == "node agent did not answer ADD within 0.6 s"
    assert body["cniVersion"] == "1.1.0"
    assert 0.6 <= took < 1.6
