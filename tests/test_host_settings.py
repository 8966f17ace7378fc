"""Host settings (SPEC §4, §14): VPC_ATTACH_* env > host file > defaults; a network config that
sets one is code 7 naming it, unless the node allows stanza host settings (then it comes
first)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.agent import client
from cni_plugin.core.request import STATUS_TIMEOUT_S, Invocation, Request
from netconf.errors import INVALID_CONFIG, CniError
from netconf.host import (
    DEFAULT_AGENT_SOCKET,
    DEFAULT_LOCK_DIR,
    DEFAULT_NAMESPACE,
    DEFAULT_TIMEOUT_SECONDS,
    HOST_CONFIG_ENV,
    STANZA_HOST_SETTINGS_ENV,
    HostSettings,
    lenient_host_settings,
    read_host_file,
    resolve_host_settings,
)

# setting -> (stanza / host-file key, environment variable, three distinct valid values)
STRING_SETTINGS: dict[str, tuple[str, str | None, tuple[str, str, str]]] = {
    "node_name": ("nodeName", "VPC_ATTACH_NODE_NAME", ("stanza-node", "env-node", "file-node")),
    "kubeconfig": ("kubeconfig", "VPC_ATTACH_KUBECONFIG", ("/s/kube", "/e/kube", "/f/kube")),
    "namespace": ("namespace", "VPC_ATTACH_NAMESPACE", ("stanza-ns", "env-ns", "file-ns")),
    "log_file": ("logFile", "VPC_ATTACH_LOG_FILE", ("/s/log", "/e/log", "/f/log")),
    "log_level": ("logLevel", "VPC_ATTACH_LOG_LEVEL", ("debug", "warning", "error")),
    "agent_socket": ("agentSocket", "VPC_ATTACH_AGENT_SOCKET", ("/s/sock", "/e/sock",
                                                                "/f/sock")),
    "lock_dir": ("lockDir", "VPC_ATTACH_LOCK_DIR", ("/s/locks", "/e/locks", "/f/locks")),
}
STANZA: dict[str, Any] = {
    "cniVersion": "1.1.0", "name": "tenant-net", "type": "vpc-attach", "vpc": "10",
    "vpcattachment": "10", "isolation": "table",
    "publish": {"bgp": False, "endpointSlice": False}, "ipam": {"type": "host-local"},
}
CNI_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/var/run/netns/p",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    """Path of a host file (not yet written)."""
    return tmp_path / "host.json"


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


ALLOW = {STANZA_HOST_SETTINGS_ENV: "allow"}


def resolve(stanza: dict[str, Any], env: dict[str, str], host_path: Path,
            allow: bool = False) -> HostSettings:
    environ = {**env, HOST_CONFIG_ENV: str(host_path), **(ALLOW if allow else {})}
    return resolve_host_settings(stanza, environ)


def test_defaults_apply_when_nothing_is_configured(host_file: Path) -> None:
    settings = resolve({}, {}, host_file)  # the file does not exist
    assert settings == HostSettings()
    assert settings.namespace == DEFAULT_NAMESPACE == "galactic-system"
    assert settings.agent_socket == DEFAULT_AGENT_SOCKET
    assert settings.timeout_seconds == DEFAULT_TIMEOUT_SECONDS
    assert settings.lock_dir == DEFAULT_LOCK_DIR
    assert settings.node_name is None and settings.kubeconfig is None
    assert settings.log_level == "info"


@pytest.mark.parametrize("setting", sorted(STRING_SETTINGS))
def test_allowed_stanza_beats_env_beats_host_file_beats_default(setting: str,
                                                                host_file: Path) -> None:
    key, env_name, (from_stanza, from_env, from_file) = STRING_SETTINGS[setting]
    write(host_file, {key: from_file})
    env = {env_name: from_env} if env_name else {}
    assert getattr(resolve({key: from_stanza}, env, host_file, allow=True), setting) == \
        from_stanza
    assert getattr(resolve({}, env, host_file), setting) == (from_env if env_name else from_file)
    assert getattr(resolve({}, {}, host_file), setting) == from_file
    default = getattr(HostSettings(), setting)
    assert getattr(resolve({}, {}, host_file.with_name("absent.json")), setting) == default


@pytest.mark.parametrize("setting", sorted(STRING_SETTINGS))
def test_empty_values_fall_through_to_the_next_source(setting: str, host_file: Path) -> None:
    key, env_name, (_, from_env, from_file) = STRING_SETTINGS[setting]
    write(host_file, {key: from_file})
    env = {env_name: ""} if env_name else {}
    assert getattr(resolve({key: None}, env, host_file, allow=True), setting) == from_file
    assert getattr(resolve({key: ""}, env, host_file, allow=True), setting) == from_file
    if env_name:
        assert getattr(resolve({key: ""}, {env_name: from_env}, host_file, allow=True),
                       setting) == from_env


def test_timeout_precedence_and_string_values_from_env(host_file: Path) -> None:
    write(host_file, {"timeoutSeconds": 20})
    env = {"VPC_ATTACH_TIMEOUT_SECONDS": "12.5"}
    assert resolve({"timeoutSeconds": 3}, env, host_file, allow=True).timeout_seconds == 3.0
    assert resolve({}, env, host_file).timeout_seconds == 12.5
    assert resolve({}, {}, host_file).timeout_seconds == 20.0


def test_namespace_comes_from_its_environment_variable(host_file: Path) -> None:
    write(host_file, {"namespace": "from-file"})
    settings = resolve({}, {"VPC_ATTACH_NAMESPACE": "from-env"}, host_file)
    assert settings.namespace == "from-env"


def test_unknown_keys_in_the_host_file_are_ignored(host_file: Path) -> None:
    write(host_file, {"nodeName": "w1", "futureSetting": {"a": 1}})
    assert resolve({}, {}, host_file).node_name == "w1"


@given(setting=st.sampled_from(sorted(STRING_SETTINGS)),
       stanza=st.sampled_from([None, "", 0]), env=st.sampled_from([None, "", 1]),
       file=st.sampled_from([None, "", 2]))
def test_each_setting_comes_from_the_first_non_empty_source(
        setting: str, stanza: int | str | None, env: int | str | None,
        file: int | str | None) -> None:
    key, env_name, values = STRING_SETTINGS[setting]
    # An int picks the valid value of that source; None is absent, "" is empty.
    def pick(choice: int | str | None) -> str | None:
        return values[choice] if isinstance(choice, int) else choice
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "host.json"
        if file is not None:
            write(path, {key: pick(file)})
        environ = {env_name: pick(env) or ""} if env_name and env is not None else {}
        sources = (pick(stanza), pick(env) if env_name else None, pick(file))
        expected = next((v for v in sources if v), getattr(HostSettings(), setting))
        assert getattr(resolve({key: pick(stanza)}, environ, path, allow=True),
                       setting) == expected


# --- through a real invocation (stanza keys as the runtime sends them) -------------------------


def test_allowed_stanza_keys_win_over_env_and_host_file(host_file: Path) -> None:
    write(host_file, {"nodeName": "file-node", "kubeconfig": "/f/kube", "namespace": "file-ns",
                      "logLevel": "error", "timeoutSeconds": 20, "stanzaHostSettings": "allow"})
    environ = {**CNI_ENV, HOST_CONFIG_ENV: str(host_file), "VPC_ATTACH_NODE_NAME": "env-node",
               "VPC_ATTACH_LOG_LEVEL": "warning"}
    stanza = {**STANZA, "nodeName": "stanza-node", "namespace": "stanza-ns",
              "timeoutSeconds": 4}
    inv = Invocation.parse(Request(environ, json.dumps(stanza).encode()))
    assert inv.host.node_name == "stanza-node"
    assert inv.host.kubeconfig == "/f/kube"
    assert inv.host.namespace == inv.namespace == "stanza-ns"
    assert inv.host.log_level == "warning"
    assert inv.host.timeout_seconds == 4.0
    assert inv.final_deadline.seconds == 4.0


def test_status_answers_within_its_own_short_deadline(host_file: Path) -> None:
    environ = {**CNI_ENV, HOST_CONFIG_ENV: str(host_file), "CNI_COMMAND": "STATUS",
               "VPC_ATTACH_TIMEOUT_SECONDS": "20"}
    inv = Invocation.parse(Request(environ, json.dumps(STANZA).encode()))
    assert inv.host.timeout_seconds == 20.0
    assert inv.final_deadline.seconds == inv.deadline.seconds == STATUS_TIMEOUT_S < 20.0
    short = Invocation.parse(Request({**environ, "VPC_ATTACH_TIMEOUT_SECONDS": "2"},
                                     json.dumps(STANZA).encode()))
    assert short.final_deadline.seconds == 2.0


def test_bgp_namespace_defaults_from_host_file_then_galactic_system(host_file: Path) -> None:
    environ = {**CNI_ENV, HOST_CONFIG_ENV: str(host_file)}
    inv = Invocation.parse(Request(environ, json.dumps(STANZA).encode()))
    assert inv.namespace == "galactic-system"
    write(host_file, {"namespace": "bgp"})
    inv = Invocation.parse(Request(environ, json.dumps(STANZA).encode()))
    assert inv.namespace == "bgp"


# --- invalid host settings -------------------------------------------------------------------


def test_missing_host_file_is_empty(host_file: Path) -> None:
    assert read_host_file({HOST_CONFIG_ENV: str(host_file)}) == {}


@pytest.mark.parametrize(("content", "fragment"), [
    (b"{not json", "cannot read host settings file"),
    (b"\xff\xfe", "cannot read host settings file"),
    (b"[]", "is not a JSON object"),
    (b'"x"', "is not a JSON object"),
])
def test_unusable_host_file_is_code_7_naming_the_file(host_file: Path, content: bytes,
                                                      fragment: str) -> None:
    host_file.write_bytes(content)
    with pytest.raises(CniError) as info:
        read_host_file({HOST_CONFIG_ENV: str(host_file)})
    assert info.value.code == INVALID_CONFIG
    assert fragment in info.value.msg and str(host_file) in info.value.msg


def test_host_file_that_is_a_directory_is_code_7(tmp_path: Path) -> None:
    with pytest.raises(CniError) as info:
        read_host_file({HOST_CONFIG_ENV: str(tmp_path)})
    assert info.value.code == INVALID_CONFIG


@pytest.mark.parametrize(("stanza", "env", "file", "named"), [
    ({"logLevel": "verbose"}, {}, {}, "log level"),
    ({}, {"VPC_ATTACH_LOG_LEVEL": "trace"}, {}, "log level"),
    ({}, {}, {"logLevel": "loud"}, "log level"),
    ({}, {"VPC_ATTACH_TIMEOUT_SECONDS": "soon"}, {}, "timeoutSeconds"),
    ({}, {"VPC_ATTACH_TIMEOUT_SECONDS": "0"}, {}, "timeoutSeconds"),
    ({}, {"VPC_ATTACH_TIMEOUT_SECONDS": "601"}, {}, "timeoutSeconds"),
    ({}, {"VPC_ATTACH_TIMEOUT_SECONDS": "nan"}, {}, "timeoutSeconds"),
    ({}, {"VPC_ATTACH_TIMEOUT_SECONDS": "inf"}, {}, "timeoutSeconds"),
    ({}, {}, {"timeoutSeconds": -5}, "timeoutSeconds"),
    ({}, {}, {"timeoutSeconds": [1]}, "timeoutSeconds"),
    ({}, {}, {"nodeName": 5}, "node_name"),
    ({}, {}, {"kubeconfig": ["/k"]}, "kubeconfig"),
    ({}, {}, {"lockDir": {"a": 1}}, "lock_dir"),
])
def test_invalid_setting_from_any_source_is_code_7_naming_it(
        host_file: Path, stanza: dict[str, Any], env: dict[str, str], file: dict[str, Any],
        named: str) -> None:
    write(host_file, file)
    with pytest.raises(CniError) as info:
        resolve(stanza, env, host_file, allow=True)
    assert info.value.code == INVALID_CONFIG
    assert named in info.value.msg


@pytest.mark.parametrize("level", ["debug", "INFO", "Warning", "error"])
def test_log_level_is_case_insensitive(host_file: Path, level: str) -> None:
    assert resolve({"logLevel": level}, {}, host_file, allow=True).log_level == level


def test_non_string_log_level_in_host_file_is_code_7(host_file: Path) -> None:
    write(host_file, {"logLevel": 5})
    with pytest.raises(CniError) as info:
        resolve({}, {}, host_file)
    assert info.value.code == INVALID_CONFIG


# --- log rotation settings (SPEC §12) ------------------------------------------------------------


def test_log_rotation_defaults_are_10_mib_and_3_backups(host_file: Path) -> None:
    settings = resolve({}, {}, host_file)
    assert (settings.log_max_bytes, settings.log_backups) == (10 * 1024 * 1024, 3)


@pytest.mark.parametrize(("setting", "key", "env_name"), [
    ("log_max_bytes", "logMaxBytes", "VPC_ATTACH_LOG_MAX_BYTES"),
    ("log_backups", "logBackups", "VPC_ATTACH_LOG_BACKUPS"),
])
def test_log_rotation_settings_follow_the_usual_precedence(
        host_file: Path, setting: str, key: str, env_name: str) -> None:
    write(host_file, {key: 7})
    env = {env_name: "5"}
    assert getattr(resolve({key: 3}, env, host_file, allow=True), setting) == 3
    # 0 is a value, not unset
    assert getattr(resolve({key: 0}, env, host_file, allow=True), setting) == 0
    assert getattr(resolve({}, env, host_file), setting) == 5
    assert getattr(resolve({}, {}, host_file), setting) == 7


@pytest.mark.parametrize(("source", "value"), [
    ("env", "ten"), ("env", "-1"), ("env", "1.5"), ("env", "²"), ("file", -1), ("file", 2.5),
    ("file", True), ("file", "3"), ("file", 101),
])
def test_invalid_log_backups_is_code_7_naming_it(host_file: Path, source: str,
                                                 value: object) -> None:
    write(host_file, {"logBackups": value} if source == "file" else {})
    env = {"VPC_ATTACH_LOG_BACKUPS": str(value)} if source == "env" else {}
    if source == "file" and value == "3":  # digits in a string are fine, as from the env
        assert resolve({}, env, host_file).log_backups == 3
        return
    with pytest.raises(CniError) as info:
        resolve({}, env, host_file)
    assert info.value.code == INVALID_CONFIG and "logBackups" in info.value.msg


@given(st.integers(min_value=0, max_value=2**40))
def test_any_whole_number_of_bytes_from_the_environment_is_taken(number: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = resolve({}, {"VPC_ATTACH_LOG_MAX_BYTES": str(number)}, Path(tmp) / "h.json")
    assert settings.log_max_bytes == number


def test_allowed_stanza_log_rotation_keys_are_accepted_through_a_real_invocation(
        host_file: Path) -> None:
    environ = {**CNI_ENV, HOST_CONFIG_ENV: str(host_file), **ALLOW}
    stanza = {**STANZA, "logMaxBytes": 4096, "logBackups": 1}
    inv = Invocation.parse(Request(environ, json.dumps(stanza).encode()))
    assert (inv.host.log_max_bytes, inv.host.log_backups) == (4096, 1)


def test_sources_name_where_each_setting_came_from(host_file: Path) -> None:
    from netconf.host import read_host_file, resolve_with_sources
    write(host_file, {"nodeName": "file-node", "logBackups": 2})
    environ = {HOST_CONFIG_ENV: str(host_file), "VPC_ATTACH_KUBECONFIG": "/e/kube"}
    settings, sources = resolve_with_sources({}, environ, read_host_file(environ))
    assert settings.node_name == "file-node" and settings.log_backups == 2
    assert sources["node_name"] == "host file nodeName"
    assert sources["kubeconfig"] == "environment VPC_ATTACH_KUBECONFIG"
    assert sources["log_max_bytes"] == "default"


# --- the lenient reading (the operator log, Events), and the thin client's copy of it ---------


def test_lenient_settings_take_what_is_usable_and_never_raise(host_file: Path) -> None:
    write(host_file, {"logFile": "/f/log", "logLevel": "loud", "logBackups": 2,
                      "kubeconfig": "/f/kube"})
    environ = {HOST_CONFIG_ENV: str(host_file), "VPC_ATTACH_TIMEOUT_SECONDS": "forever"}
    refused = {**STANZA, "logFile": "/tenant/log", "nodeName": "tenant-node"}
    settings = lenient_host_settings(refused, environ)  # the verb answers code 7 for each
    assert (settings.log_file, settings.log_level, settings.log_backups) == ("/f/log", "info", 2)
    assert (settings.node_name, settings.kubeconfig) == (None, "/f/kube")
    assert settings.timeout_seconds == DEFAULT_TIMEOUT_SECONDS
    allowed = lenient_host_settings(refused, {**environ, **ALLOW})
    assert (allowed.log_file, allowed.node_name) == ("/tenant/log", "tenant-node")
    host_file.write_text("{broken")
    assert lenient_host_settings({}, environ) == HostSettings()


SOCKETS = st.sampled_from([None, "", "/run/a.sock", "/run/b.sock"])
TIMEOUTS = st.sampled_from([None, "", 7, 2.5, "12", "0", 0, 601, "soon", "1e1"])


@given(env_socket=SOCKETS, file_socket=SOCKETS, stanza_socket=SOCKETS, env_timeout=TIMEOUTS,
       file_timeout=TIMEOUTS, stanza_timeout=TIMEOUTS,
       allow=st.sampled_from([None, "allow", "deny", "maybe"]), in_file=st.booleans())
def test_the_thin_client_finds_the_socket_and_deadline_the_resolver_chooses(
        env_socket: str | None, file_socket: str | None, stanza_socket: str | None,
        env_timeout: str | float | None, file_timeout: str | float | None,
        stanza_timeout: str | float | None, allow: str | None, in_file: bool) -> None:
    """`agent/client.py` keeps a standard-library copy of the precedence: wherever the verb
    accepts the settings, it forwards to the same socket and waits for the same deadline
    (where the verb refuses them, code 7 comes at once: the client's wait is only a bound)."""
    with tempfile.TemporaryDirectory() as directory:
        host: dict[str, Any] = {key: value for key, value in (
            ("agentSocket", file_socket), ("timeoutSeconds", file_timeout)) if value is not None}
        environ = {"CNI_COMMAND": "ADD", HOST_CONFIG_ENV: f"{directory}/host.json"}
        if allow is not None:
            if in_file:
                host["stanzaHostSettings"] = allow
            else:
                environ[STANZA_HOST_SETTINGS_ENV] = allow
        write(Path(directory) / "host.json", host)
        if env_socket is not None:
            environ["VPC_ATTACH_AGENT_SOCKET"] = env_socket
        if env_timeout is not None:
            environ["VPC_ATTACH_TIMEOUT_SECONDS"] = str(env_timeout)
        stanza = {**STANZA, **{key: value for key, value in (
            ("agentSocket", stanza_socket), ("timeoutSeconds", stanza_timeout))
            if value is not None}}
        path, seconds = client.route(environ, json.dumps(stanza).encode())
        try:
            resolved = resolve_host_settings(stanza, environ)
        except CniError:
            assert path and 0 < seconds <= 600 + client.ANSWER_GRACE_SECONDS
            return
        assert (path, seconds) == \
            (resolved.agent_socket, resolved.timeout_seconds + client.ANSWER_GRACE_SECONDS)
