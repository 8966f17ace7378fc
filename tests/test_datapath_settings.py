"""Datapath host settings (hostAccess, allowedSourcePrefixes) and the ruleset they render."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.kernel import hostfilter, isolation, rtnl
from netconf.errors import INVALID_CONFIG, CniError
from netconf.host import resolve_datapath_settings
from netconf.node_groups import DatapathSettings
from netconf.node_parsers import PortRange, parse_port_range

ports = st.integers(min_value=1, max_value=65535)


@given(st.sampled_from(["tcp", "udp", "sctp"]), ports, ports)
def test_port_ranges_round_trip(protocol: str, first: int, second: int) -> None:
    low, high = sorted((first, second))
    parsed = parse_port_range(str(PortRange(protocol, low, high)))
    assert parsed == PortRange(protocol, low, high)


@given(st.text(max_size=20))
def test_anything_else_is_code_7_naming_the_entry(text: str) -> None:
    try:
        parsed = parse_port_range(text)
    except CniError as exc:
        assert exc.code == INVALID_CONFIG and "hostAccess" in exc.msg
    else:
        assert 1 <= parsed.first <= parsed.last <= 65535


@pytest.mark.parametrize("text", ["icmp/1", "udp/0", "tcp/70000", "udp/9-3", "udp", "/53"])
def test_bad_entries_are_refused(text: str) -> None:
    with pytest.raises(CniError) as caught:
        parse_port_range(text)
    assert caught.value.code == INVALID_CONFIG


def test_environment_wins_over_the_host_file_and_prefixes_come_from_the_file_only() -> None:
    host_file = {"hostAccess": ["tcp/22"], "allowedSourcePrefixes": [
        {"vpc": "21", "vpcattachment": "3", "prefixes": ["10.9.0.0/16", "fd09::/48"]},
        {"vpc": "22", "prefixes": ["192.0.2.0/24"]}]}
    settings = resolve_datapath_settings({"VPC_ATTACH_HOST_ACCESS": "udp/53, tcp/8000-8080"},
                                         host_file)
    assert settings.host_access == (PortRange("udp", 53, 53), PortRange("tcp", 8000, 8080))
    assert [(a.vpc, a.vpcattachment, [str(p) for p in a.prefixes])
            for a in settings.allowed_sources] == [
        ("21", "3", ["10.9.0.0/16", "fd09::/48"]), ("22", None, ["192.0.2.0/24"])]
    assert resolve_datapath_settings({}, host_file).host_access == (PortRange("tcp", 22, 22),)
    assert resolve_datapath_settings({}, {}) == DatapathSettings()


@pytest.mark.parametrize("entry", [
    {"vpc": "21"}, {"vpc": "!", "prefixes": []}, {"vpc": "21", "prefixes": ["10.0.0.0/33"]},
    {"vpc": "21", "vpcattachment": 3, "prefixes": []}, "10.0.0.0/8"])
def test_malformed_allowed_sources_are_code_7(entry: object) -> None:
    with pytest.raises(CniError) as caught:
        resolve_datapath_settings({}, {"allowedSourcePrefixes": [entry]})
    assert caught.value.code == INVALID_CONFIG


def test_ruleset_opens_only_what_the_settings_say() -> None:
    plain = hostfilter.ruleset(DatapathSettings())
    assert "th dport" not in plain and "saddr 10." not in plain
    assert plain.startswith("table inet vpc_attach {}\ndelete table inet vpc_attach\n")
    opened = hostfilter.ruleset(resolve_datapath_settings({}, {
        "hostAccess": ["udp/53", "tcp/8000-8080"],
        "allowedSourcePrefixes": [{"vpc": "21", "vpcattachment": "3", "prefixes": ["10.9.0.0/16"]},
                                  {"vpc": "22", "prefixes": ["fd09::/48"]}]}))
    assert "meta l4proto udp th dport 53 goto host_access" in opened
    assert "meta l4proto tcp th dport 8000-8080 goto host_access" in opened
    assert 'iifname "G000000021003H" ip saddr 10.9.0.0/16 return' in opened
    assert 'iifname "G000000022*" ip6 saddr fd09::/48 return' in opened
    # the source check comes after every exception, the drops last in their chains
    assert opened.index("saddr 10.9.0.0/16") < opened.index("fib saddr")
    assert opened.index("dport 53") < opened.index('counter name "host_dropped" drop')


def test_only_answers_on_host_access_connections_get_the_vpc_mark() -> None:
    text = hostfilter.ruleset(DatapathSettings())
    access = text[text.index("chain host_access {"):]
    access = access[:access.index("}")]
    # vrf mode (mark 0) leaves the conntrack mark alone; table mode saves the VPC's bits
    assert access.index("meta mark & 0x0fff0000 == 0 return") \
        < access.index("ct mark set meta mark & 0x0fff0000")
    output = text[text.index("chain output {"):]
    assert "type route hook output" in output
    assert "ct direction reply ct mark & 0x0fff0000 != 0 meta mark set ct mark & 0x0fff0000" \
        in output


def test_mark_rules_round_trip_through_the_rule_codec() -> None:
    table = 7
    body = rtnl.rule_request(2, None, table, isolation.RULE_PRIORITY, isolation.vpc_mark(table),
                             isolation.MARK_MASK)
    decoded = rtnl.decode_rule(body)
    assert (decoded.fwmark, decoded.fwmask, decoded.table, decoded.iifname) == (
        7 << 16, 0x0FFF0000, 7, None)
