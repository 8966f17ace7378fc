"""The plugin stanza (SPEC §4): every key's validation, case-insensitive keys, decode errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from netconf.base62 import ATTACHMENT_LIMIT, VPC_LIMIT, encode_base62
from netconf.config import (
    STANDARD_KEYS,
    NetConf,
    canonical_keys,
    config_version,
    decode_json,
    lookup_ci,
    parse_netconf,
)
from netconf.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, INVALID_CONFIG, CniError, quoted
from netconf.versions import SUPPORTED_VERSIONS

BASE: dict[str, Any] = {
    "cniVersion": "1.1.0", "name": "tenant-net", "type": "vpc-attach", "vpc": "10",
    "vpcattachment": "10", "isolation": "table",
    "publish": {"bgp": False, "endpointSlice": False},
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00:77::/64"}]]},
}
# Every top-level key the stanza knows, in its canonical spelling.
KNOWN_KEYS = tuple(f.alias or name for name, f in NetConf.model_fields.items())

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | \
    st.text(max_size=10)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=8)


def conf(**changes: Any) -> dict[str, Any]:
    """BASE with keys replaced; a value of ... removes the key."""
    out: dict[str, Any] = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        if value is ...:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def rejected(data: dict[str, Any]) -> CniError:
    with pytest.raises(CniError) as info:
        parse_netconf(data)
    return info.value


def swap_case_randomly(key: str, flips: list[bool]) -> str:
    return "".join(c.swapcase() if flip else c for c, flip in zip(key, flips + [False] * len(key),
                                                                   strict=False))


# --- a valid stanza ------------------------------------------------------------------------------


def test_minimal_veth_stanza_gets_the_documented_defaults() -> None:
    parsed = parse_netconf(conf(isolation=..., publish=...))
    assert parsed.attachment == "veth"
    assert parsed.isolation == "vrf"
    assert parsed.mtu is None
    assert parsed.namespace is None
    assert parsed.publish.bgp and parsed.publish.endpoint_slice
    assert parsed.publish.endpoint_slice_families == ["IPv6"]


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_supported_cni_version_is_accepted(version: str) -> None:
    assert parse_netconf(conf(cniVersion=version)).cni_version == version


def test_full_tap_stanza_is_accepted() -> None:
    parsed = parse_netconf(conf(
        attachment="tap", mtu=9000, namespace="bgp-ns",
        tap={"owner": 107, "group": 107, "multiQueue": True, "vnetHdr": True},
        publish={"bgp": True, "endpointSlice": True, "endpointSliceFamilies": ["IPv6", "IPv4"]}))
    assert parsed.tap_options.owner == 107 and parsed.tap_options.multi_queue
    assert parsed.tap_options.vnet_hdr and parsed.mtu == 9000
    assert parsed.publish.endpoint_slice_families == ["IPv6", "IPv4"]


def test_tap_without_ipam_is_l2_only_and_valid() -> None:
    assert parse_netconf(conf(attachment="tap", ipam=...)).ipam is None


def test_existing_attachment_needs_no_ipam() -> None:
    assert parse_netconf(conf(attachment="existing", ipam=...)).attachment == "existing"


@pytest.mark.parametrize(("key", "value"), [
    ("cniVersion", "1.1.0"), ("name", "n"), ("type", "vpc-attach"),
    ("args", {"cni": {"K8S_POD_NAME": "p"}}), ("runtimeConfig", {"mac": "0a:58:0a:00:00:05"}),
    ("capabilities", {"mac": True}),
    ("prevResult", {"cniVersion": "1.1.0", "interfaces": [], "ips": []}),
    ("dns", {"nameservers": ["fd00::53"]}),
])
def test_standard_cni_keys_are_accepted(key: str, value: Any) -> None:
    assert key in STANDARD_KEYS
    parse_netconf(conf(**{key: value}))


@pytest.mark.parametrize(("key", "value"), [
    ("nodeName", "worker-1"), ("kubeconfig", "/etc/k.conf"), ("logFile", "/var/log/x"),
    ("logLevel", "debug"), ("agentSocket", "/run/a.sock"), ("timeoutSeconds", 5),
    ("timeoutSeconds", 2.5),
])
def test_host_settings_may_be_set_in_the_stanza(key: str, value: Any) -> None:
    parse_netconf(conf(**{key: value}))


# --- case-insensitive keys -------------------------------------------------------------------


def test_top_level_and_nested_keys_match_case_insensitively() -> None:
    parsed = parse_netconf({
        "CNIVERSION": "0.4.0", "Name": "n", "TYPE": "vpc-attach", "VPC": "jU",
        "VpcAttachment": "G", "MTU": 1400, "Isolation": "table",
        "Publish": {"BGP": False, "EndpointSlice": False, "endpointslicefamilies": ["IPv4"]},
        "IPAM": {"type": "static"}, "RuntimeConfig": {"HostPort": 1},
    })
    assert (parsed.cni_version, parsed.vpc, parsed.vpcattachment, parsed.mtu) == \
        ("0.4.0", "jU", "G", 1400)
    assert parsed.publish.endpoint_slice_families == ["IPv4"] and not parsed.publish.bgp
    assert parsed.runtime_config == {"HostPort": 1}


def test_tap_option_keys_match_case_insensitively() -> None:
    parsed = parse_netconf(conf(attachment="tap", tap={"OWNER": 1, "MultiQueue": True,
                                                       "VNETHDR": True}))
    assert parsed.tap_options.owner == 1 and parsed.tap_options.multi_queue
    assert parsed.tap_options.vnet_hdr


@given(st.sampled_from(KNOWN_KEYS), st.lists(st.booleans(), max_size=20))
def test_any_capitalisation_of_a_known_key_means_the_same(key: str, flips: list[bool]) -> None:
    values = {"mtu": 1400, "attachment": "veth", "isolation": "vrf", "namespace": "ns",
              "timeoutSeconds": 3, "args": {}, "runtimeConfig": {}, "capabilities": {},
              "dns": {}, "nodeName": "w", "kubeconfig": "/k", "logFile": "/l",
              "logLevel": "info", "agentSocket": "/s", "prevResult": {}, "tap": None,
              "publish": {"bgp": False}, "vpcFromPod": False, "allowPersistentIPs": False}
    value = values.get(key, BASE.get(key))
    spelled = swap_case_randomly(key, flips)
    data = {k: v for k, v in conf(**{key: value}).items() if k != key}
    data[spelled] = value
    assert parse_netconf(data) == parse_netconf(conf(**{key: value}))


@pytest.mark.parametrize("duplicate", ["VPC", "Vpc", "vPC"])
def test_a_key_given_twice_in_different_case_is_rejected(duplicate: str) -> None:
    err = rejected({**conf(), duplicate: "11"})
    assert err.code == INVALID_CONFIG
    assert "duplicate" in err.msg and duplicate in err.msg


def test_canonical_keys_renames_only_known_keys() -> None:
    assert canonical_keys({"MTU": 1, "Other": 2}, ("mtu",)) == {"mtu": 1, "Other": 2}


def test_lookup_ci_prefers_the_exact_spelling_then_any_case() -> None:
    assert lookup_ci({"HostPort": 1}, "hostPort") == 1
    assert lookup_ci({"hostPort": 2, "HOSTPORT": 3}, "hostPort") == 2
    assert lookup_ci(None, "x") is None
    assert lookup_ci({}, "x") is None


# --- missing and unknown keys ----------------------------------------------------------------


@pytest.mark.parametrize("key", ["vpc", "vpcattachment", "name", "type"])
def test_missing_required_key_is_code_7_naming_it(key: str) -> None:
    err = rejected(conf(**{key: ...}))
    assert err.code == INVALID_CONFIG
    assert err.msg == f"missing config key {key!r}"


@pytest.mark.parametrize("value", [..., ""])
def test_missing_cni_version_is_code_7_naming_it(value: Any) -> None:
    err = rejected(conf(cniVersion=value))
    assert err.code == INVALID_CONFIG and "'cniVersion'" in err.msg


def test_veth_without_ipam_is_code_7_naming_ipam() -> None:
    err = rejected(conf(ipam=...))
    assert (err.code, err.msg) == (INVALID_CONFIG, "missing config key 'ipam'")


@pytest.mark.parametrize(("data", "named"), [
    (conf(frobnicate=1), "'frobnicate'"),
    (conf(Frobnicate=1), "'Frobnicate'"),
    (conf(vrf="x"), "'vrf'"),
    (conf(publish={"bgp": False, "endpointSlice": False, "bfd": True}), "'publish.bfd'"),
    (conf(attachment="tap", tap={"owner": 0, "queues": 4}), "'tap.queues'"),
    # The model's attribute names are not a second spelling: a host setting would pass by it.
    (conf(log_backups=1), "'log_backups'"),
    (conf(lock_dir="/tmp"), "'lock_dir'"),
    (conf(vpc_from_pod=True), "'vpc_from_pod'"),
    (conf(publish={"endpoint_slice": False}), "'publish.endpoint_slice'"),
])
def test_unknown_key_is_code_7_naming_it(data: dict[str, Any], named: str) -> None:
    err = rejected(data)
    assert err.code == INVALID_CONFIG
    assert err.msg.startswith("unknown config key") and named in err.msg


@given(st.text(min_size=1, max_size=20))
def test_every_unknown_top_level_key_is_rejected_by_name(key: str) -> None:
    assume(key.lower() not in {k.lower() for k in KNOWN_KEYS})
    err = rejected({**conf(), key: 1})
    assert err.code == INVALID_CONFIG
    assert quoted(key) in err.msg


# --- per-key type and range errors -------------------------------------------------------------


@pytest.mark.parametrize(("changes", "key"), [
    ({"vpc": 10}, "vpc"), ({"vpc": None}, "vpc"), ({"vpc": ""}, "vpc"), ({"vpc": "1-2"}, "vpc"),
    ({"vpc": encode_base62(VPC_LIMIT)}, "vpc"),
    ({"vpcattachment": 10}, "vpcattachment"), ({"vpcattachment": "!"}, "vpcattachment"),
    ({"vpcattachment": encode_base62(ATTACHMENT_LIMIT)}, "vpcattachment"),
    ({"mtu": "1500"}, "mtu"), ({"mtu": 1500.0}, "mtu"), ({"mtu": True}, "mtu"),
    ({"mtu": 67}, "mtu"), ({"mtu": 65536}, "mtu"), ({"mtu": -1}, "mtu"),
    ({"attachment": "macvlan"}, "attachment"), ({"attachment": "VETH"}, "attachment"),
    ({"attachment": 1}, "attachment"),
    ({"isolation": "VRF"}, "isolation"), ({"isolation": "none"}, "isolation"),
    ({"isolation": None}, "isolation"),
    ({"name": ""}, "name"), ({"name": 5}, "name"),
    ({"type": "ptp"}, "type"), ({"type": "VPC-ATTACH"}, "type"),
    ({"namespace": "Bad_NS"}, "namespace"), ({"namespace": "-a"}, "namespace"),
    ({"namespace": "a" * 64}, "namespace"), ({"namespace": ""}, "namespace"),
    ({"namespace": 3}, "namespace"),
    ({"publish": True}, "publish"), ({"publish": {"bgp": "false"}}, "publish.bgp"),
    ({"publish": {"endpointSlice": 0}}, "publish.endpointSlice"),
    ({"publish": {"endpointSliceFamilies": "IPv6"}}, "publish.endpointSliceFamilies"),
    ({"publish": {"endpointSliceFamilies": ["IPv5"]}}, "publish.endpointSliceFamilies"),
    ({"publish": {"endpointSliceFamilies": ["ipv6"]}}, "publish.endpointSliceFamilies"),
    ({"ipam": []}, "ipam"), ({"ipam": {}}, "ipam"), ({"ipam": {"type": ""}}, "ipam"),
    ({"ipam": {"type": 4}}, "ipam"), ({"ipam": {"type": "../../bin/sh"}}, "ipam"),
    ({"timeoutSeconds": 0}, "timeoutSeconds"), ({"timeoutSeconds": 601}, "timeoutSeconds"),
    ({"timeoutSeconds": "5"}, "timeoutSeconds"),
    ({"logLevel": 3}, "logLevel"), ({"nodeName": ["w"]}, "nodeName"),
    ({"args": []}, "args"), ({"runtimeConfig": "x"}, "runtimeConfig"),
    ({"prevResult": "x"}, "prevResult"), ({"dns": []}, "dns"), ({"capabilities": 1},
                                                                  "capabilities"),
])
def test_invalid_value_is_code_7_naming_the_key(changes: dict[str, Any], key: str) -> None:
    err = rejected(conf(**changes))
    assert err.code == INVALID_CONFIG
    assert f"'{key}" in err.msg, err.msg


@pytest.mark.parametrize(("tap", "key"), [
    ({"owner": -1}, "tap.owner"), ({"owner": 2**32 - 1}, "tap.owner"), ({"owner": "0"},
                                                                         "tap.owner"),
    ({"group": -1}, "tap.group"), ({"multiQueue": "yes"}, "tap.multiQueue"),
    ({"vnetHdr": 1}, "tap.vnetHdr"), ([], "tap"),
])
def test_invalid_tap_option_is_code_7_naming_it(tap: Any, key: str) -> None:
    err = rejected(conf(attachment="tap", tap=tap))
    assert err.code == INVALID_CONFIG and f"'{key}" in err.msg, err.msg


@pytest.mark.parametrize("attachment", ["veth", "existing"])
def test_tap_options_without_tap_attachment_are_rejected(attachment: str) -> None:
    changes: dict[str, Any] = {"attachment": attachment, "tap": {"owner": 0}}
    if attachment == "existing":
        changes["ipam"] = ...
    err = rejected(conf(**changes))
    assert (err.code, err.msg) == (INVALID_CONFIG, "invalid config key 'tap'")


def test_existing_attachment_with_ipam_is_rejected_naming_ipam() -> None:
    err = rejected(conf(attachment="existing"))
    assert (err.code, err.msg) == (INVALID_CONFIG, "invalid config key 'ipam'")


@given(st.integers(min_value=0, max_value=2 * VPC_LIMIT))
def test_vpc_is_accepted_exactly_below_2_to_the_48(vpc: int) -> None:
    data = conf(vpc=encode_base62(vpc))
    if vpc < VPC_LIMIT:
        assert parse_netconf(data).vpc == encode_base62(vpc)
    else:
        assert "'vpc'" in rejected(data).msg


@given(st.integers(min_value=0, max_value=2 * ATTACHMENT_LIMIT))
def test_vpcattachment_is_accepted_exactly_below_2_to_the_16(att: int) -> None:
    data = conf(vpcattachment=encode_base62(att))
    if att < ATTACHMENT_LIMIT:
        assert parse_netconf(data).vpcattachment == encode_base62(att)
    else:
        assert "'vpcattachment'" in rejected(data).msg


def test_boundary_identifiers_are_accepted() -> None:
    parse_netconf(conf(vpc=encode_base62(VPC_LIMIT - 1),
                       vpcattachment=encode_base62(ATTACHMENT_LIMIT - 1)))
    parse_netconf(conf(vpc="0", vpcattachment="0"))


@given(st.integers(min_value=-(2**31), max_value=2**31))
def test_mtu_is_accepted_exactly_in_68_to_65535(mtu: int) -> None:
    data = conf(mtu=mtu)
    if 68 <= mtu <= 65535:
        assert parse_netconf(data).mtu == mtu
    else:
        assert rejected(data).msg.startswith("invalid config key 'mtu'")


@given(st.sampled_from(["vpc", "vpcattachment", "name", "type", "attachment", "isolation",
                        "namespace", "mtu", "publish", "ipam", "tap", "args"]), json_values)
def test_any_wrong_value_for_a_key_is_code_7_naming_that_key(key: str, value: Any) -> None:
    data = conf(**{key: value})
    try:
        parse_netconf(data)
    except CniError as err:
        assert err.code == INVALID_CONFIG
        assert f"'{key}" in err.msg, err.msg


# --- cniVersion ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0", "1.2.0", "2.0.0", "1.1", "latest"])
def test_unsupported_cni_version_is_code_1(version: str) -> None:
    err = rejected(conf(cniVersion=version))
    assert err.code == INCOMPATIBLE_VERSION
    assert version in err.msg
    assert "1.1.0" in err.details  # lists what is supported


@pytest.mark.parametrize("version", [1, 1.1, True, ["1.1.0"], {"v": "1.1.0"}])
def test_non_string_cni_version_is_code_7(version: Any) -> None:
    err = rejected(conf(cniVersion=version))
    assert err.code == INVALID_CONFIG and "'cniVersion'" in err.msg


def test_cni_version_key_is_found_in_any_case() -> None:
    data = conf(cniVersion=...)
    data["CNIVersion"] = "0.3.1"
    assert config_version(data) == "0.3.1"


# --- decoding stdin --------------------------------------------------------------------------


@pytest.mark.parametrize("stdin", [b"", b"{", b"not json", b"\xff\xfe\x00", b"{'a': 1}",
                                   b'{"a": 1} trailing'])
def test_undecodable_stdin_is_code_6(stdin: bytes) -> None:
    with pytest.raises(CniError) as info:
        decode_json(stdin)
    assert info.value.code == DECODE_FAILURE


@pytest.mark.parametrize("stdin", [b"[]", b"[{}]", b"1", b'"x"', b"null", b"true"])
def test_json_that_is_not_an_object_is_code_6(stdin: bytes) -> None:
    with pytest.raises(CniError) as info:
        decode_json(stdin)
    assert info.value.code == DECODE_FAILURE
    assert "object" in info.value.msg


@given(json_values.filter(lambda v: not isinstance(v, dict)))
def test_every_non_object_json_value_is_code_6(value: Any) -> None:
    with pytest.raises(CniError) as info:
        decode_json(json.dumps(value).encode())
    assert info.value.code == DECODE_FAILURE


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_to_an_object_or_code_6(stdin: bytes) -> None:
    try:
        assert isinstance(decode_json(stdin), dict)
    except CniError as err:
        assert err.code == DECODE_FAILURE


def test_utf8_bom_and_whitespace_around_the_object_are_accepted() -> None:
    assert decode_json(b"\xef\xbb\xbf {\"a\": 1}\n") == {"a": 1}


def test_deeply_nested_json_is_a_decode_error() -> None:
    with pytest.raises(CniError) as info:
        decode_json(b"[" * 100_000)
    assert info.value.code == DECODE_FAILURE


def test_namespace_with_trailing_newline_is_not_a_dns_label() -> None:
    err = rejected(conf(namespace="galactic-system\n"))
    assert err.code == INVALID_CONFIG and "'namespace'" in err.msg


# --- what the stanza hands on ------------------------------------------------------------------


def test_config_args_cni_are_stringified() -> None:
    parsed = parse_netconf(conf(args={"cni": {"K8S_POD_NAME": "p", "IgnoreUnknown": True}}))
    assert parsed.cni_args() == {"K8S_POD_NAME": "p", "IgnoreUnknown": "True"}


@pytest.mark.parametrize("args", [None, {}, {"cni": None}, {"cni": []}, {"other": {"a": 1}}])
def test_config_without_args_cni_has_no_cni_args(args: Any) -> None:
    changes = {} if args is None else {"args": args}
    assert parse_netconf(conf(**changes)).cni_args() == {}


def test_prev_result_is_parsed_from_any_supported_version() -> None:
    prev = {"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}],
            "ips": [{"version": "6", "address": "fd00::5/64", "interface": 0}]}
    parsed = parse_netconf(conf(prevResult=prev)).prev()
    assert parsed is not None and parsed.ips[0].address == "fd00::5/64"
    assert parse_netconf(conf()).prev() is None


def test_malformed_prev_result_is_code_6() -> None:
    parsed = parse_netconf(conf(prevResult={"ips": [{"address": "not-an-ip"}]}))
    with pytest.raises(CniError) as info:
        parsed.prev()
    assert info.value.code == DECODE_FAILURE


@pytest.mark.parametrize("key", ["publish", "tap"])
def test_an_unknown_key_with_a_quote_in_its_name_is_named_in_single_quotes(key: str) -> None:
    err = rejected(conf(**{key: {"it's": 1}}))
    assert err.code == INVALID_CONFIG and err.msg == f"unknown config key '{key}.it\\'s'"


# --- allowPersistentIPs (SPEC §16) --------------------------------------------------------------


def test_allow_persistent_ips_is_off_by_default() -> None:
    assert parse_netconf(conf()).allow_persistent_ips is False


def test_allow_persistent_ips_with_vpc_attach_ipam_is_accepted() -> None:
    parsed = parse_netconf(conf(allowPersistentIPs=True,
                                ipam={"type": "vpc-attach-ipam", "ipv6_subnet": "fd00::/64"}))
    assert parsed.allow_persistent_ips is True


@pytest.mark.parametrize("ipam", [{"type": "host-local"}, {"type": "galactic-ipam"}, ...],
                         ids=["host-local", "galactic-ipam", "no-ipam"])
def test_allow_persistent_ips_with_another_ipam_is_code_7_saying_it_needs_vpc_attach_ipam(
        ipam: Any) -> None:
    with pytest.raises(CniError) as caught:
        parse_netconf(conf(allowPersistentIPs=True, attachment="tap", ipam=ipam))
    assert caught.value.code == INVALID_CONFIG
    assert caught.value.msg == "invalid config key 'allowPersistentIPs'"
    assert "kept by vpc-attach-ipam" in caught.value.details
