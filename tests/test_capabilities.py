"""The `ips` and `mac` capabilities (SPEC §16): where a request comes from, which form wins,
and that anything malformed is code 7 naming the form. Pure; no root needed."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netconf.capabilities import IPS_SOURCES, MAC_SOURCES, requested_ips, requested_mac
from netconf.errors import INVALID_CONFIG, UNSUPPORTED_FIELD, CniError
from netconf.runtime import check_known_args

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10)


def config(runtime: Any = None, args: Any = None) -> dict[str, Any]:
    """A network config carrying the ips/mac forms given (None: that form is absent)."""
    conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": "n", "type": "vpc-attach"}
    if runtime is not None:
        conf["runtimeConfig"] = runtime
    if args is not None:
        conf["args"] = {"cni": args}
    return conf


def error_of(call: Any, *args: Any) -> CniError:
    with pytest.raises(CniError) as info:
        call(*args)
    return info.value


def addresses(conf: dict[str, Any], cni_args: dict[str, str]) -> tuple[list[str], str] | None:
    found = requested_ips(conf, cni_args)
    return None if found is None else ([str(a.ip) for a in found.addresses], found.source)


# --- ips: which form wins -----------------------------------------------------------------------

def test_runtime_config_wins_over_args_and_cni_args() -> None:
    conf = config(runtime={"ips": ["10.1.0.5/24"]}, args={"ips": ["10.1.0.6"]})
    assert addresses(conf, {"IP": "10.1.0.7"}) == (["10.1.0.5"], "runtimeConfig.ips")


def test_args_win_over_cni_args() -> None:
    conf = config(args={"ips": ["10.1.0.6", "fd00::6"]})
    assert addresses(conf, {"IP": "10.1.0.7"}) == (["10.1.0.6", "fd00::6"], "args.cni.ips")


def test_cni_args_ip_alone_is_read_comma_separated() -> None:
    assert addresses(config(), {"IP": "10.1.0.7/24, fd00::7"}) == \
        (["10.1.0.7", "fd00::7"], "CNI_ARGS 'IP'")


@pytest.mark.parametrize("empty", [[], None])
def test_an_empty_form_counts_as_absent(empty: Any) -> None:
    conf = config(runtime={"ips": empty}, args={"ips": empty})
    assert addresses(conf, {"IP": "10.1.0.7"}) == (["10.1.0.7"], "CNI_ARGS 'IP'")
    assert addresses(conf, {"IP": ""}) is None


def test_keys_match_case_insensitively_like_go() -> None:
    conf = {"RuntimeConfig": {"IPs": ["fd00::5"]}}
    assert addresses(conf, {}) == (["fd00::5"], "runtimeConfig.ips")
    assert addresses({"Args": {"CNI": {"Ips": ["fd00::6"]}}}, {}) == (["fd00::6"], "args.cni.ips")


def test_duplicates_are_dropped_and_the_prefix_is_ignored_like_host_local() -> None:
    conf = config(runtime={"ips": ["10.1.0.5/24", "10.1.0.5", "10.1.0.5/32"]})
    found = requested_ips(conf, {})
    assert found is not None and [a.text for a in found.addresses] == ["10.1.0.5/24"]


@pytest.mark.parametrize(("runtime", "args", "cni_args", "source"), [
    ({"ips": "10.1.0.5"}, None, {}, "runtimeConfig.ips"),
    ({"ips": [5]}, None, {}, "runtimeConfig.ips"),
    ({"ips": ["10.1.0.256"]}, None, {}, "runtimeConfig.ips"),
    ({"ips": ["10.1.0.5/33"]}, None, {}, "runtimeConfig.ips"),
    ({"ips": [""]}, None, {}, "runtimeConfig.ips"),
    ({"ips": ["fe80::1%eth0"]}, None, {}, "runtimeConfig.ips"),
    ({"ips": ["fd00::1%/../../etc"]}, None, {}, "runtimeConfig.ips"),
    ({"ips": ["../../../etc/passwd"]}, None, {}, "runtimeConfig.ips"),
    (None, {"ips": {"a": 1}}, {}, "args.cni.ips"),
    (None, None, {"IP": "10.1.0.5,,10.1.0.6"}, "CNI_ARGS 'IP'"),
    (None, None, {"IP": "ten.one"}, "CNI_ARGS 'IP'"),
])
def test_malformed_requests_are_code_7_naming_the_form(runtime: Any, args: Any,
                                                        cni_args: dict[str, str],
                                                        source: str) -> None:
    err = error_of(requested_ips, config(runtime, args), cni_args)
    assert err.code == INVALID_CONFIG and source in err.msg, err.msg


@given(st.ip_addresses(), st.booleans(), st.data())
def test_any_address_with_or_without_prefix_is_read_back(ip: Any, with_prefix: bool,
                                                         data: st.DataObject) -> None:
    text = str(ip)
    if with_prefix:
        text += f"/{data.draw(st.integers(0, ip.max_prefixlen))}"
    for conf, cni_args in ((config(runtime={"ips": [text]}), {}), (config(), {"IP": text})):
        found = requested_ips(conf, cni_args)
        assert found is not None and [a.ip for a in found.addresses] == [ip]


@given(json_values, json_values, st.text())
def test_any_input_is_a_request_none_or_code_7(runtime: Any, args: Any, ip: str) -> None:
    conf = {"runtimeConfig": {"ips": runtime}, "args": {"cni": {"ips": args}}}
    try:
        found = requested_ips(conf, {"IP": ip})
    except CniError as exc:
        assert exc.code == INVALID_CONFIG and any(s in exc.msg for s in IPS_SOURCES)
        return
    if found is not None:
        assert found.source in IPS_SOURCES and found.addresses
        for address in found.addresses:
            assert "%" not in str(address.ip) and "/" not in str(address.ip)
            assert ipaddress.ip_address(str(address.ip)) == address.ip


# --- mac ----------------------------------------------------------------------------------------

def test_mac_forms_win_in_the_same_order_as_ips() -> None:
    both = config(runtime={"mac": "0a:58:00:00:00:01"}, args={"mac": "0a:58:00:00:00:02"})
    assert requested_mac(both, {"MAC": "0a:58:00:00:00:03"}) == "0a:58:00:00:00:01"
    assert requested_mac(config(args={"mac": "0a:58:00:00:00:02"}),
                         {"MAC": "0a:58:00:00:00:03"}) == "0a:58:00:00:00:02"
    assert requested_mac(config(), {"MAC": "0a:58:00:00:00:03"}) == "0a:58:00:00:00:03"
    assert requested_mac(config(runtime={"mac": ""}), {}) is None


def test_mac_is_normalised_to_lower_case_with_colons() -> None:
    assert requested_mac(config(runtime={"mac": "0A-58-0A-00-00-FF"}), {}) == \
        "0a:58:0a:00:00:ff"


@pytest.mark.parametrize(("mac", "why"), [
    ("0a:58:0a:00:00", "not a MAC"), ("0a:58:0a:00:00:05:06", "not a MAC"),
    ("0a:58-0a:00:00:05", "not a MAC"), ("zz:58:0a:00:00:05", "not a MAC"),
    (5, "not a MAC"), ("0a:58:0a:00:00:0g", "not a MAC"), (" 0a:58:0a:00:00:05", "not a MAC"),
])
@pytest.mark.parametrize("form", MAC_SOURCES)
def test_a_malformed_mac_is_code_7_naming_the_form(mac: Any, why: str,
                                                            form: str) -> None:
    if form == MAC_SOURCES[2] and not isinstance(mac, str):
        return
    conf = config(runtime={"mac": mac} if form == MAC_SOURCES[0] else None,
                  args={"mac": mac} if form == MAC_SOURCES[1] else None)
    cni_args = {"MAC": mac} if form == MAC_SOURCES[2] else {}
    err = error_of(requested_mac, conf, cni_args)
    assert err.code == INVALID_CONFIG and form in err.msg and why in err.msg, err.msg


@given(json_values | st.text(alphabet="0123456789abcdefABCDEF:-", max_size=20))
def test_any_mac_input_is_six_octets_none_or_code_7(value: Any) -> None:
    try:
        mac = requested_mac(config(runtime={"mac": value}), {})
    except CniError as exc:
        assert exc.code == INVALID_CONFIG and "runtimeConfig.mac" in exc.msg
        return
    if mac is not None:
        assert [len(part) for part in mac.split(":")] == [2] * 6 and mac == mac.lower()
        assert [int(part, 16) for part in mac.split(":")] == \
            [int(part, 16) for part in value.replace("-", ":").split(":")]


def test_a_group_mac_is_left_to_the_kernel() -> None:
    assert requested_mac(config(runtime={"mac": "01:00:5E:00:00:01"}), {}) == \
        "01:00:5e:00:00:01"


# --- CNI_ARGS and args.cni keys -------------------------------------------------------------------

def test_ip_and_mac_are_known_cni_args_and_ips_and_mac_known_config_args() -> None:
    check_known_args({"IP": "10.1.0.5", "MAC": "0a:58:00:00:00:01"})
    check_known_args({}, {"ips": ["10.1.0.5"], "mac": "0a:58:00:00:00:01"})


@pytest.mark.parametrize(("env_args", "config_args", "unknown"), [
    ({"ips": "10.1.0.5"}, {}, "ips"), ({}, {"IP": "10.1.0.5"}, "IP"), ({}, {"MAC": "x"}, "MAC"),
])
def test_each_place_knows_only_its_own_spelling(env_args: dict[str, str],
                                                config_args: dict[str, Any],
                                                unknown: str) -> None:
    err = error_of(check_known_args, env_args, config_args)
    assert err.code == UNSUPPORTED_FIELD and f"'{unknown}'" in err.msg
    check_known_args({**env_args, "IgnoreUnknown": "1"}, config_args)
