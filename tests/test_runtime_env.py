"""The CNI_* environment and CNI_ARGS (SPEC §3), and how config `args.cni` combines with them."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cni_plugin.core.request import Invocation, Request
from netconf.errors import INVALID_CONFIG, INVALID_ENV, UNSUPPORTED_FIELD, CniError
from netconf.runtime import (
    COMMANDS,
    KNOWN_CNI_ARGS,
    RuntimeEnv,
    check_known_args,
    ignore_unknown,
    parse_cni_args,
    validate_container_id,
    validate_ifname,
)

VALID_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/var/run/netns/p",
             "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
STANZA: dict[str, Any] = {
    "cniVersion": "1.1.0", "name": "tenant-net", "type": "vpc-attach", "vpc": "10",
    "vpcattachment": "10", "isolation": "table",
    "publish": {"bgp": False, "endpointSlice": False}, "ipam": {"type": "host-local"},
}
ID_START = string.ascii_letters + string.digits
ID_REST = ID_START + "_.-"
arg_keys = st.text(alphabet=st.characters(blacklist_characters="=;", codec="utf-8"),
                   min_size=1, max_size=12)
arg_values = st.text(alphabet=st.characters(blacklist_characters=";", codec="utf-8"),
                     max_size=12)


def env_error(environ: dict[str, str]) -> CniError:
    with pytest.raises(CniError) as info:
        RuntimeEnv.from_environ(environ)
    return info.value


@pytest.fixture
def isolated_environ(tmp_path: Path) -> dict[str, str]:
    """CNI env whose host settings come from a file that does not exist."""
    return {**VALID_ENV, "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent.json"),
            "VPC_ATTACH_LOCK_DIR": str(tmp_path / "locks")}


def invocation(environ: dict[str, str], **stanza: Any) -> Invocation:
    return Invocation.parse(Request(environ, json.dumps({**STANZA, **stanza}).encode()))


# --- CNI_ARGS --------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "parsed"), [
    ("", {}),
    ("K8S_POD_NAME=web", {"K8S_POD_NAME": "web"}),
    ("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web",
     {"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "web"}),
    ("A=;B=2", {"A": "", "B": "2"}),
    ("A=1;;B=2;", {"A": "1", "B": "2"}),
    ("A=x=y", {"A": "x=y"}),
    ("A=1;A=2", {"A": "2"}),
])
def test_cni_args_are_semicolon_separated_key_value_pairs(text: str,
                                                          parsed: dict[str, str]) -> None:
    assert parse_cni_args(text) == parsed


@pytest.mark.parametrize("text", ["K8S_POD_NAME", "=web", "A=1;B", "A=1;=2", "just text"])
def test_malformed_cni_args_pair_is_code_4_naming_the_pair(text: str) -> None:
    with pytest.raises(CniError) as info:
        parse_cni_args(text)
    assert info.value.code == INVALID_ENV
    assert "CNI_ARGS" in info.value.msg


@given(st.dictionaries(arg_keys, arg_values, max_size=6))
def test_cni_args_round_trip_through_their_wire_form(pairs: dict[str, str]) -> None:
    assert parse_cni_args(";".join(f"{k}={v}" for k, v in pairs.items())) == pairs


@given(st.text(max_size=40))
def test_any_cni_args_text_parses_or_is_code_4(text: str) -> None:
    try:
        parsed = parse_cni_args(text)
    except CniError as err:
        assert err.code == INVALID_ENV
    else:
        assert all(key and "=" not in key and ";" not in key for key in parsed)


@pytest.mark.parametrize(("value", "ignored"), [
    ("1", True), ("true", True), ("True", True), ("TRUE", True),
    ("0", False), ("false", False), ("", False),
])
def test_ignore_unknown_accepts_1_and_true_in_any_case(value: str, ignored: bool) -> None:
    assert ignore_unknown({"IgnoreUnknown": value}) is ignored


def test_unknown_cni_args_key_is_code_2_naming_it() -> None:
    with pytest.raises(CniError) as info:
        check_known_args({"K8S_POD_NAME": "p", "FOO": "1"})
    assert info.value.code == UNSUPPORTED_FIELD
    assert "'FOO'" in info.value.msg


def test_unknown_cni_args_keys_pass_with_ignore_unknown() -> None:
    check_known_args({"IgnoreUnknown": "1", "FOO": "1", "BAR": "2"})


@pytest.mark.parametrize("key", sorted(KNOWN_CNI_ARGS))
def test_every_documented_cni_args_key_is_known(key: str) -> None:
    check_known_args({key: "x"})


@given(st.dictionaries(arg_keys, arg_values, min_size=1, max_size=4))
def test_any_undocumented_key_is_rejected_unless_ignored(pairs: dict[str, str]) -> None:
    assume(not set(pairs) <= KNOWN_CNI_ARGS)
    assume("IgnoreUnknown" not in pairs)
    with pytest.raises(CniError) as info:
        check_known_args(pairs)
    assert info.value.code == UNSUPPORTED_FIELD
    check_known_args({**pairs, "IgnoreUnknown": "true"})


# --- config args.cni against CNI_ARGS (Invocation.parse) ------------------------------------


def test_config_args_cni_wins_over_cni_args_for_the_same_key(
        isolated_environ: dict[str, str]) -> None:
    environ = {**isolated_environ,
               "CNI_ARGS": "K8S_POD_NAMESPACE=from-env;K8S_POD_NAME=web;K8S_POD_UID=u1"}
    inv = invocation(environ, args={"cni": {"K8S_POD_NAMESPACE": "from-config"}})
    assert inv.pod.namespace == "from-config"
    assert inv.pod.name == "web"  # keys only in CNI_ARGS still count
    assert inv.pod.uid == "u1"


def test_pod_reference_comes_from_cni_args(isolated_environ: dict[str, str]) -> None:
    environ = {**isolated_environ, "CNI_ARGS": "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;"
               "K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=1234-5678"}
    pod = invocation(environ).pod
    assert (pod.namespace, pod.name, pod.infra_container_id, pod.uid) == \
        ("ns", "web", "c0ffee", "1234-5678")


def test_unknown_cni_args_key_fails_the_invocation_with_code_2(
        isolated_environ: dict[str, str]) -> None:
    environ = {**isolated_environ, "CNI_ARGS": "K8S_POD_NAME=web;MYSTERY=1"}
    with pytest.raises(CniError) as info:
        invocation(environ)
    assert info.value.code == UNSUPPORTED_FIELD and "'MYSTERY'" in info.value.msg


def test_ignore_unknown_in_config_args_covers_unknown_keys_of_cni_args(
        isolated_environ: dict[str, str]) -> None:
    environ = {**isolated_environ, "CNI_ARGS": "MYSTERY=1"}
    assert invocation(environ, args={"cni": {"IgnoreUnknown": True}}).pod.name is None


def test_ignore_unknown_in_cni_args_covers_unknown_keys_of_config_args(
        isolated_environ: dict[str, str]) -> None:
    environ = {**isolated_environ, "CNI_ARGS": "IgnoreUnknown=1"}
    invocation(environ, args={"cni": {"MYSTERY": "1"}})


def test_config_can_switch_ignore_unknown_back_off(isolated_environ: dict[str, str]) -> None:
    environ = {**isolated_environ, "CNI_ARGS": "IgnoreUnknown=1;MYSTERY=1"}
    with pytest.raises(CniError) as info:
        invocation(environ, args={"cni": {"IgnoreUnknown": "false"}})
    assert info.value.code == UNSUPPORTED_FIELD


def test_unknown_key_in_config_args_cni_is_code_2(isolated_environ: dict[str, str]) -> None:
    with pytest.raises(CniError) as info:
        invocation(isolated_environ, args={"cni": {"MYSTERY": "1"}})
    assert info.value.code == UNSUPPORTED_FIELD and "'MYSTERY'" in info.value.msg


def test_invocation_carries_the_mac_of_the_first_form_present(
        isolated_environ: dict[str, str]) -> None:
    environ = {**isolated_environ, "CNI_ARGS": "MAC=0A:58:00:00:00:03"}
    assert invocation(environ).mac == "0a:58:00:00:00:03"
    assert invocation(environ, args={"cni": {"mac": "0a:58:00:00:00:02"}}).mac == \
        "0a:58:00:00:00:02"
    assert invocation(environ, args={"cni": {"mac": "0a:58:00:00:00:02"}},
                      runtimeConfig={"mac": "0a:58:00:00:00:01"}).mac == "0a:58:00:00:00:01"
    assert invocation(isolated_environ).mac is None


def test_a_malformed_mac_in_cni_args_is_code_7_naming_it(
        isolated_environ: dict[str, str]) -> None:
    with pytest.raises(CniError) as info:
        invocation({**isolated_environ, "CNI_ARGS": "MAC=0a:58:00:00:00"})
    assert info.value.code == INVALID_CONFIG and "CNI_ARGS 'MAC'" in info.value.msg


def test_requested_ips_in_cni_args_and_config_args_are_not_unknown_keys(
        isolated_environ: dict[str, str]) -> None:
    # Passed through to the IPAM delegate unread: no IgnoreUnknown needed for them.
    invocation({**isolated_environ, "CNI_ARGS": "IP=10.1.0.5"}, args={"cni": {"ips": ["fd00::5"]}})


@pytest.mark.parametrize("netns", ["var/run/netns/p", "p", "./p"])
def test_relative_cni_netns_is_code_4_for_add(isolated_environ: dict[str, str],
                                               netns: str) -> None:
    with pytest.raises(CniError) as info:
        invocation({**isolated_environ, "CNI_NETNS": netns})
    assert info.value.code == INVALID_ENV and "CNI_NETNS" in info.value.msg


# --- container ID ----------------------------------------------------------------------------


@pytest.mark.parametrize("container_id", [
    "a", "0", "c0ffee", "A_b.c-d", "k8s_POD_web-1_ns_uid_0", "a" * 64, "1.2.3",
])
def test_container_ids_matching_the_spec_pattern_are_accepted(container_id: str) -> None:
    validate_container_id(container_id)


@pytest.mark.parametrize("container_id", [
    "-abc", "_abc", ".abc", "a b", "a/b", "a:b", "a;b", "ä", "a\tb", " abc", "abc ",
])
def test_container_ids_outside_the_spec_pattern_are_code_4(container_id: str) -> None:
    with pytest.raises(CniError) as info:
        validate_container_id(container_id)
    assert info.value.code == INVALID_ENV and "CNI_CONTAINERID" in info.value.msg


def test_container_id_with_trailing_newline_is_code_4() -> None:
    with pytest.raises(CniError) as info:
        validate_container_id("abc\n")
    assert info.value.code == INVALID_ENV


@given(st.text(alphabet=ID_START, min_size=1, max_size=1),
       st.text(alphabet=ID_REST, max_size=80))
def test_every_id_of_the_spec_alphabet_is_accepted(first: str, rest: str) -> None:
    validate_container_id(first + rest)


@given(st.text(min_size=1, max_size=20))
def test_an_id_is_accepted_only_if_it_is_in_the_spec_alphabet(container_id: str) -> None:
    assume("\n" not in container_id[-1:])  # see the xfail above
    valid = container_id[0] in ID_START and all(c in ID_REST for c in container_id)
    if valid:
        validate_container_id(container_id)
    else:
        with pytest.raises(CniError):
            validate_container_id(container_id)


# --- interface name --------------------------------------------------------------------------


@pytest.mark.parametrize("ifname", ["eth0", "net1", "a", "x" * 15, "eth0.100", "veth_a-b", "..."])
def test_valid_ifnames_are_accepted(ifname: str) -> None:
    validate_ifname(ifname)


@pytest.mark.parametrize(("ifname", "problem"), [
    ("x" * 16, "longer than 15"), (".", "'.' or '..'"), ("..", "'.' or '..'"),
    ("a/b", "'/'"), ("a:b", "'/'"), ("a b", "whitespace"), ("a\tb", "whitespace"),
    ("eth0\n", "whitespace"), ("\u00a0x", "whitespace"),
])
def test_invalid_ifname_is_code_4_naming_the_rule(ifname: str, problem: str) -> None:
    with pytest.raises(CniError) as info:
        validate_ifname(ifname)
    assert info.value.code == INVALID_ENV
    assert "CNI_IFNAME" in info.value.msg and problem in info.value.msg


def test_ifname_longer_than_15_bytes_is_code_4() -> None:
    with pytest.raises(CniError) as info:
        validate_ifname("é" * 9)
    assert info.value.code == INVALID_ENV


@given(st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=30))
def test_ascii_ifnames_are_accepted_exactly_up_to_15_characters(ifname: str) -> None:
    assume(ifname not in (".", ".."))
    if len(ifname) <= 15:
        validate_ifname(ifname)
    else:
        with pytest.raises(CniError):
            validate_ifname(ifname)


# --- the environment as a whole ------------------------------------------------------------


@pytest.mark.parametrize(("command", "required"), [
    ("ADD", ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH")),
    ("CHECK", ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH")),
    ("DEL", ("CNI_CONTAINERID", "CNI_IFNAME")),
])
def test_each_missing_variable_is_code_4_naming_it(command: str,
                                                   required: tuple[str, ...]) -> None:
    for name in required:
        environ = {k: v for k, v in VALID_ENV.items() if k != name}
        environ["CNI_COMMAND"] = command
        err = env_error(environ)
        assert err.code == INVALID_ENV
        assert name in err.msg
        assert err.msg.count("CNI_") == 1  # only the missing one is named
        assert env_error({**environ, name: ""}).msg == err.msg  # empty counts as missing


def test_del_needs_no_netns_and_no_path() -> None:
    env = RuntimeEnv.from_environ({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c",
                                   "CNI_IFNAME": "eth0"})
    assert env.netns == "" and env.cni_path == ()


@pytest.mark.parametrize("command", ["VERSION", "STATUS", "GC"])
def test_verbs_without_a_container_need_only_the_command(command: str) -> None:
    assert RuntimeEnv.from_environ({"CNI_COMMAND": command}).command == command


@pytest.mark.parametrize("command", ["", "add", "Add", "ATTACH", "ADD ", "DELETE"])
def test_missing_or_unknown_command_is_code_4_naming_cni_command(command: str) -> None:
    err = env_error({**VALID_ENV, "CNI_COMMAND": command})
    assert err.code == INVALID_ENV and "CNI_COMMAND" in err.msg


def test_cni_command_absent_is_code_4() -> None:
    environ = {k: v for k, v in VALID_ENV.items() if k != "CNI_COMMAND"}
    assert "CNI_COMMAND" in env_error(environ).msg


def test_invalid_ids_are_rejected_even_when_optional() -> None:
    err = env_error({"CNI_COMMAND": "GC", "CNI_CONTAINERID": "-x"})
    assert err.code == INVALID_ENV and "CNI_CONTAINERID" in err.msg
    err = env_error({"CNI_COMMAND": "STATUS", "CNI_IFNAME": "a/b"})
    assert err.code == INVALID_ENV and "CNI_IFNAME" in err.msg


def test_cni_path_is_split_on_colons_dropping_empty_entries() -> None:
    env = RuntimeEnv.from_environ({**VALID_ENV, "CNI_PATH": "/opt/cni/bin::/usr/lib/cni:"})
    assert env.cni_path == ("/opt/cni/bin", "/usr/lib/cni")


@given(st.sampled_from(COMMANDS), st.dictionaries(
    st.sampled_from(sorted(KNOWN_CNI_ARGS)), st.text(alphabet=ID_REST, max_size=10), max_size=5))
def test_to_environ_round_trips_the_invocation(command: str, args: dict[str, str]) -> None:
    environ = {**VALID_ENV, "CNI_COMMAND": command, "CNI_ARGS": ";".join(
        f"{k}={v}" for k, v in args.items())}
    env = RuntimeEnv.from_environ(environ)
    assert RuntimeEnv.from_environ(env.to_environ()) == env
    assert dict(env.cni_args) == args


@given(st.sampled_from(COMMANDS), st.text(max_size=20), st.text(max_size=20),
       st.text(max_size=40))
def test_any_environment_is_accepted_or_code_4_or_2(command: str, container_id: str,
                                                    ifname: str, cni_args: str) -> None:
    environ = {**VALID_ENV, "CNI_COMMAND": command, "CNI_CONTAINERID": container_id,
               "CNI_IFNAME": ifname, "CNI_ARGS": cni_args}
    try:
        env = RuntimeEnv.from_environ(environ)
    except CniError as err:
        assert err.code == INVALID_ENV
        assert "CNI_" in err.msg
    else:
        assert env.command == command


# --- CNI_NETNS -------------------------------------------------------------------------------

@pytest.mark.parametrize("own", ["/proc/self/ns/net", "/proc/thread-self/ns/net"])
def test_add_into_the_plugins_own_netns_is_code_4(isolated_environ: dict[str, str],
                                                   own: str) -> None:
    with pytest.raises(CniError) as refused:
        invocation({**isolated_environ, "CNI_NETNS": own})
    assert refused.value.code == INVALID_ENV and "own network namespace" in refused.value.msg
    with pytest.raises(CniError):
        invocation({**isolated_environ, "CNI_NETNS": own, "CNI_COMMAND": "CHECK"})


def test_del_and_tap_accept_the_plugins_own_netns(isolated_environ: dict[str, str]) -> None:
    own = "/proc/self/ns/net"
    assert invocation({**isolated_environ, "CNI_NETNS": own, "CNI_COMMAND": "DEL"})
    assert invocation({**isolated_environ, "CNI_NETNS": own}, attachment="tap")
