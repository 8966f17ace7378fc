"""galactic's datapath settings come from the node only: the environment over the host file,
validated, and refused in a network config (SPEC §14, §15)."""

from __future__ import annotations

import pytest

from netconf.errors import INVALID_CONFIG, CniError
from netconf.host import resolve_galactic_settings, stanza_host_values
from netconf.node_groups import DEFAULT_GALACTIC_PIN_DIR, GalacticSettings


def test_defaults_without_any_setting() -> None:
    assert resolve_galactic_settings({}, {}) == GalacticSettings(DEFAULT_GALACTIC_PIN_DIR, (),
                                                                 None, (), offloads=False)


def test_the_environment_wins_over_the_host_file() -> None:
    host_file = {"galacticPinDir": "/file/pins", "underlayInterfaces": ["eth9"],
                 "underlayMTU": 9000, "nat66ShardSIDs": ["2001:db8::9"],
                 "galacticOffloads": True}
    environ = {"VPC_ATTACH_GALACTIC_PIN_DIR": "/env/pins",
               "VPC_ATTACH_UNDERLAY_INTERFACES": "eth0, eth1",
               "VPC_ATTACH_UNDERLAY_MTU": "1500",
               "VPC_ATTACH_NAT66_SHARD_SIDS": "2001:db8::1,, 2001:db8::2",
               "VPC_ATTACH_GALACTIC_OFFLOADS": "off"}
    assert resolve_galactic_settings(environ, host_file) == GalacticSettings(
        "/env/pins", ("eth0", "eth1"), 1500, ("2001:db8::1", "2001:db8::2"), offloads=False)
    assert resolve_galactic_settings({}, host_file) == GalacticSettings(
        "/file/pins", ("eth9",), 9000, ("2001:db8::9",), offloads=True)


@pytest.mark.parametrize(("value", "on"), [("on", True), ("off", False), (" ON", True),
                                           (True, True), (False, False)])
def test_galactic_offloads_is_on_or_off(value: object, on: bool) -> None:
    assert resolve_galactic_settings({}, {"galacticOffloads": value}).offloads is on


@pytest.mark.parametrize(("key", "value", "named"), [
    ("galacticPinDir", "relative/pins", "galacticPinDir"),
    ("underlayInterfaces", ["eth0", "a/b"], "underlayInterfaces"),
    ("underlayInterfaces", ["x" * 16], "underlayInterfaces"),
    ("underlayMTU", 1319, "underlayMTU"),
    ("underlayMTU", "9k", "underlayMTU"),
    ("nat66ShardSIDs", ["10.0.0.1"], "nat66ShardSIDs"),
    ("nat66ShardSIDs", ["::"], "nat66ShardSIDs"),
    ("galacticOffloads", "maybe", "galacticOffloads"),
    ("galacticOffloads", 1, "galacticOffloads"),
])
def test_malformed_values_are_code_7_naming_the_key(key: str, value: object, named: str) -> None:
    with pytest.raises(CniError) as refused:
        resolve_galactic_settings({}, {key: value})
    assert refused.value.code == INVALID_CONFIG and named in refused.value.msg


@pytest.mark.parametrize("key", ["galacticPinDir", "underlayInterfaces", "underlayMTU",
                                 "nat66ShardSIDs", "galacticOffloads"])
def test_a_network_config_may_not_set_them_even_where_the_node_allows_host_settings(
        key: str) -> None:
    with pytest.raises(CniError) as refused:
        stanza_host_values({key: "x"}, {"VPC_ATTACH_STANZA_HOST_SETTINGS": "allow"}, {})
    assert refused.value.code == INVALID_CONFIG and repr(key) in refused.value.msg
