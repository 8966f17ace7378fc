"""CNI results across versions (SPEC §3): from_wire / to_wire, conversion down and back up."""

from __future__ import annotations

import copy
import ipaddress
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core.request import Request
from cni_plugin.dispatch import run
from netconf.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, CniError
from netconf.result import Interface, IPConfig, Result, Route
from netconf.versions import LEGACY_RESULT_VERSIONS, SUPPORTED_VERSIONS, at_least, version_key

NEW_VERSIONS = tuple(v for v in SUPPORTED_VERSIONS if v not in LEGACY_RESULT_VERSIONS)
NEW_INTERFACE_KEYS = ("mtu", "socketPath", "pciID")

# 1.1.0-shaped wire data (what a plugin of the newest version prints).
ipv4 = st.builds(lambda a, p: f"{ipaddress.IPv4Address(a)}/{p}",
                 st.integers(0, 2**32 - 1), st.integers(0, 32))
ipv6 = st.builds(lambda a, p: f"{ipaddress.IPv6Address(a)}/{p}",
                 st.integers(0, 2**128 - 1), st.integers(0, 128))
extra_names = st.text(alphabet="abcdefghij", min_size=1, max_size=6).map(lambda s: f"x-{s}")
extra_values = st.recursive(
    st.booleans() | st.integers(-10, 10) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=2),
    max_leaves=4)
extras = st.dictionaries(extra_names, extra_values, max_size=2)


@st.composite
def wire_interfaces(draw: st.DrawFn) -> dict[str, Any]:
    iface: dict[str, Any] = {"name": draw(st.text(min_size=1, max_size=15))}
    if draw(st.booleans()):
        iface["mac"] = draw(st.sampled_from(["0a:58:0a:00:00:05", "aa:bb:cc:dd:ee:ff"]))
    if draw(st.booleans()):
        iface["sandbox"] = draw(st.sampled_from(["/var/run/netns/a", "/proc/1/ns/net"]))
    if draw(st.booleans()):
        iface["mtu"] = draw(st.integers(68, 65535))
    if draw(st.booleans()):
        iface["socketPath"] = "/run/vhost.sock"
    if draw(st.booleans()):
        iface["pciID"] = "0000:00:1f.6"
    iface.update(draw(extras))
    return iface


@st.composite
def wire_ips(draw: st.DrawFn) -> dict[str, Any]:
    ip: dict[str, Any] = {"address": draw(ipv4 | ipv6)}
    if draw(st.booleans()):
        ip["gateway"] = str(ipaddress.ip_interface(ip["address"]).ip)
    if draw(st.booleans()):
        ip["interface"] = draw(st.integers(0, 3))
    ip.update(draw(extras))
    return ip


@st.composite
def wire_routes(draw: st.DrawFn) -> dict[str, Any]:
    route: dict[str, Any] = {"dst": draw(st.sampled_from(["0.0.0.0/0", "::/0", "10.0.0.0/8"]))}
    if draw(st.booleans()):
        route["gw"] = draw(st.sampled_from(["10.0.0.1", "fe80::1"]))
    for key in ("mtu", "advmss", "priority", "table"):
        if draw(st.booleans()):
            route[key] = draw(st.integers(1, 9000))
    if draw(st.booleans()):
        route["scope"] = draw(st.sampled_from([0, 253]))
    route.update(draw(extras))
    return route


@st.composite
def wire_results(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "interfaces": draw(st.lists(wire_interfaces(), max_size=3)),
        "ips": draw(st.lists(wire_ips(), max_size=3)),
        "routes": draw(st.lists(wire_routes(), max_size=3)),
    }
    if draw(st.booleans()):
        data["dns"] = {"nameservers": ["fd00::53"], "search": ["svc.cluster.local"]}
    data.update(draw(extras))
    return data


def same_wire(data: dict[str, Any]) -> dict[str, Any]:
    """data with empty MACs dropped: libcni omits them, we write "" (both mean "none")."""
    out = copy.deepcopy(data)
    for iface in out.get("interfaces", []):
        if iface.get("mac") == "":
            del iface["mac"]
    return out


def strip_new_keys(data: dict[str, Any]) -> dict[str, Any]:
    """What a 1.1.0 result keeps when converted to a legacy version and back."""
    out = copy.deepcopy(data)
    for iface in out["interfaces"]:
        for key in NEW_INTERFACE_KEYS:
            iface.pop(key, None)
    for route in out["routes"]:
        for key in ("mtu", "advmss", "priority", "table", "scope"):
            route.pop(key, None)
    return out


SAMPLE_110 = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "G000000010010H", "mac": "aa:bb:cc:dd:ee:01", "mtu": 1400},
        {"name": "eth0", "mac": "0a:58:0a:00:00:05", "mtu": 1400, "sandbox": "/var/run/netns/p",
         "socketPath": "/run/x.sock", "pciID": "0000:00:1f.6"},
    ],
    "ips": [{"address": "fd00:77::5/64", "gateway": "fe80::1", "interface": 1},
            {"address": "10.1.2.3/32", "gateway": "169.254.1.1", "interface": 1}],
    "routes": [{"dst": "::/0", "gw": "fe80::1"}, {"dst": "0.0.0.0/0", "gw": "169.254.1.1",
                                                   "mtu": 1400}],
    "dns": {"nameservers": ["fd00::53"]},
}


# --- examples ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", sorted(LEGACY_RESULT_VERSIONS))
def test_legacy_versions_get_ip_versions_and_lose_interface_mtu_socket_and_pci(
        version: str) -> None:
    wire = Result.from_wire(SAMPLE_110).to_wire(version)
    assert wire["cniVersion"] == version
    assert [ip["version"] for ip in wire["ips"]] == ["6", "4"]
    for iface in wire["interfaces"]:
        assert not set(NEW_INTERFACE_KEYS) & set(iface)
    assert wire["interfaces"][1] == {"name": "eth0", "mac": "0a:58:0a:00:00:05",
                                     "sandbox": "/var/run/netns/p"}
    assert wire["routes"][1] == {"dst": "0.0.0.0/0", "gw": "169.254.1.1"}


@pytest.mark.parametrize("version", NEW_VERSIONS)
def test_new_versions_keep_interface_mtu_socket_and_pci_and_have_no_ip_version(
        version: str) -> None:
    wire = Result.from_wire(SAMPLE_110).to_wire(version)
    assert wire == {**SAMPLE_110, "cniVersion": version}
    assert all("version" not in ip for ip in wire["ips"])


def test_legacy_result_is_read_into_the_newest_shape() -> None:
    legacy = {"cniVersion": "0.3.1",
              "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/p"}],
              "ips": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1",
                       "interface": 0}],
              "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}
    result = Result.from_wire(legacy)
    assert result.ips == [IPConfig(address="10.0.0.2/24", gateway="10.0.0.1", interface=0)]
    assert result.interfaces == [Interface(name="eth0", sandbox="/var/run/netns/p")]
    assert result.routes == [Route(dst="0.0.0.0/0")]
    assert same_wire(result.to_wire("1.1.0")) == {
        "cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/p"}],
        "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0"}]}


def test_empty_sandbox_and_empty_dns_are_omitted() -> None:
    wire = same_wire(Result(interfaces=[Interface(name="tap0")]).to_wire("1.1.0"))
    assert wire == {"cniVersion": "1.1.0", "interfaces": [{"name": "tap0"}],
                    "ips": [], "routes": []}


def test_ip_family_is_derived_from_the_address() -> None:
    assert IPConfig(address="fd00::1/64").family == 6
    assert IPConfig(address="192.0.2.1/24").family == 4


@pytest.mark.parametrize("version", ["0.2.0", "0.1.0", "1.2.0", "", "v1.1.0"])
def test_converting_to_an_unsupported_version_is_code_1(version: str) -> None:
    with pytest.raises(CniError) as info:
        Result().to_wire(version)
    assert info.value.code == INCOMPATIBLE_VERSION


@pytest.mark.parametrize("data", [
    [], "x", None, 1,
    {"ips": [{"address": "not-an-ip"}]},
    {"ips": [{"gateway": "10.0.0.1"}]},
    {"interfaces": [{"mac": "aa:bb:cc:dd:ee:ff"}]},
    {"interfaces": "eth0"},
    {"routes": [{"gw": "10.0.0.1"}]},
    {"ips": [{"address": "10.0.0.1/33"}]},
])
def test_malformed_result_is_code_6(data: Any) -> None:
    with pytest.raises(CniError) as info:
        Result.from_wire(data)
    assert info.value.code == DECODE_FAILURE


# --- properties --------------------------------------------------------------------------------


@given(wire_results(), st.sampled_from(SUPPORTED_VERSIONS))
def test_output_cni_version_is_exactly_the_requested_one(data: dict[str, Any],
                                                         version: str) -> None:
    wire = Result.from_wire(data).to_wire(version)
    assert wire["cniVersion"] == version
    json.dumps(wire)  # always serialisable


@given(wire_results(), st.sampled_from(NEW_VERSIONS))
def test_new_versions_round_trip_without_loss(data: dict[str, Any], version: str) -> None:
    wire = Result.from_wire(data).to_wire(version)
    assert same_wire(wire) == {**data, "cniVersion": version}
    assert Result.from_wire(wire) == Result.from_wire(data)


@given(wire_results(), st.sampled_from(sorted(LEGACY_RESULT_VERSIONS)))
def test_legacy_conversion_adds_versions_and_drops_only_the_new_keys(
        data: dict[str, Any], version: str) -> None:
    wire = Result.from_wire(data).to_wire(version)
    for ip, original in zip(wire["ips"], data["ips"], strict=True):
        assert ip["version"] == str(ipaddress.ip_interface(original["address"]).version)
        assert {k: v for k, v in ip.items() if k != "version"} == original
    for iface in wire["interfaces"]:
        assert not set(NEW_INTERFACE_KEYS) & set(iface)
    back_up = Result.from_wire(wire).to_wire("1.1.0")
    assert same_wire(back_up) == strip_new_keys(data)


@given(wire_results(), st.lists(st.sampled_from(SUPPORTED_VERSIONS), min_size=1, max_size=5))
def test_any_chain_of_conversions_equals_one_conversion_through_the_oldest_shape(
        data: dict[str, Any], versions: list[str]) -> None:
    result = Result.from_wire(data)
    for version in versions:
        result = Result.from_wire(result.to_wire(version))
    lossy = any(v in LEGACY_RESULT_VERSIONS for v in versions)
    expected = strip_new_keys(data) if lossy else data
    assert same_wire(result.to_wire("1.1.0")) == {**expected, "cniVersion": "1.1.0"}


@given(wire_results(), st.sampled_from(SUPPORTED_VERSIONS))
def test_unknown_fields_of_every_level_are_preserved(data: dict[str, Any],
                                                     version: str) -> None:
    wire = Result.from_wire(data).to_wire(version)
    for key, value in data.items():
        if key.startswith("x-"):
            assert wire[key] == value
    for level in ("interfaces", "ips", "routes"):
        for out, original in zip(wire[level], data[level], strict=True):
            for key, value in original.items():
                if key.startswith("x-"):
                    assert out[key] == value


@given(wire_results(), st.sampled_from(SUPPORTED_VERSIONS))
def test_conversion_is_deterministic_and_does_not_alter_the_result(
        data: dict[str, Any], version: str) -> None:
    result = Result.from_wire(data)
    before = result.model_dump()
    assert result.to_wire(version) == result.to_wire(version)
    assert result.model_dump() == before


def test_reading_a_result_leaves_its_input_unchanged() -> None:
    legacy = {"cniVersion": "0.4.0", "ips": [{"version": "6", "address": "fd00::1/64"}]}
    snapshot = copy.deepcopy(legacy)
    Result.from_wire(legacy)
    assert legacy == snapshot


def test_unknown_field_with_null_value_is_preserved() -> None:
    wire = Result.from_wire({"cniVersion": "1.1.0", "x-null": None}).to_wire("1.1.0")
    assert "x-null" in wire and wire["x-null"] is None


# --- answers on the wire (dispatch) ----------------------------------------------------------


def _failing_add(stdin: bytes, tmp: str) -> dict[str, Any]:
    environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/nonexistent",
               "CNI_IFNAME": "eth0", "CNI_PATH": tmp,
               "VPC_ATTACH_HOST_CONFIG": f"{tmp}/absent.json"}
    outcome = run(Request(environ, stdin))
    status, payload = outcome.status, outcome.payload
    assert status != 0 and payload is not None
    return payload


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_error_answer_is_in_the_config_version(version: str, tmp_path: Any) -> None:
    stdin = json.dumps({"cniVersion": version, "name": "n", "type": "vpc-attach",
                        "vpc": "!", "vpcattachment": "1"}).encode()
    assert _failing_add(stdin, str(tmp_path))["cniVersion"] == version


@pytest.mark.parametrize("stdin", [b"", b"{", b'{"cniVersion": "0.2.0"}', b"[]"])
def test_error_answer_without_a_usable_version_is_in_the_newest(stdin: bytes,
                                                                tmp_path: Any) -> None:
    assert _failing_add(stdin, str(tmp_path))["cniVersion"] == "1.1.0"


def test_answer_version_honours_a_capitalised_cni_version_key(tmp_path: Any) -> None:
    stdin = json.dumps({"CNIVersion": "0.4.0", "name": "n", "type": "vpc-attach",
                        "vpc": "!", "vpcattachment": "1"}).encode()
    assert _failing_add(stdin, str(tmp_path))["cniVersion"] == "0.4.0"


def test_version_answer_lists_every_supported_version_and_ignores_stdin() -> None:
    outcome = run(Request({"CNI_COMMAND": "VERSION"}, b"garbage"))
    status, payload = outcome.status, outcome.payload
    assert status == 0
    assert payload == {"cniVersion": "1.1.0", "supportedVersions": list(SUPPORTED_VERSIONS)}


@given(st.sampled_from(SUPPORTED_VERSIONS), st.sampled_from(SUPPORTED_VERSIONS))
def test_version_ordering_matches_the_spec_history(a: str, b: str) -> None:
    assert at_least(a, b) == (SUPPORTED_VERSIONS.index(a) >= SUPPORTED_VERSIONS.index(b))
    assert (version_key(a) < version_key(b)) == (SUPPORTED_VERSIONS.index(a)
                                                 < SUPPORTED_VERSIONS.index(b))


def test_hand_written_version_answer_is_the_json_of_the_verb() -> None:
    from cni_plugin.verbs.version import version, version_json
    assert json.loads(version_json()) == version()
