"""The node's `networkPolicy` and `multiNetworkPolicy` (SPEC §17): each kind of policy only
where the node's operator says so: MultiNetworkPolicy enforced unless turned off, NetworkPolicy
off unless turned on; never from a network config."""

from __future__ import annotations

import pytest

from netconf.errors import INVALID_CONFIG, CniError
from netconf.host import NodeSettings, node_only_keys


@pytest.mark.parametrize(("environ", "host_file", "enforced"), [
    ({}, {}, False),
    ({"VPC_ATTACH_NETWORK_POLICY": "enforce"}, {}, True),
    ({}, {"networkPolicy": "enforce"}, True),
    ({"VPC_ATTACH_NETWORK_POLICY": "off"}, {"networkPolicy": "enforce"}, False),
])
def test_network_policy_is_the_nodes_and_off_by_default(
        environ: dict[str, str], host_file: dict[str, str], enforced: bool) -> None:
    assert NodeSettings(environ, host_file).policy.network_policy is enforced


def test_a_network_policy_mode_it_does_not_know_is_code_7() -> None:
    with pytest.raises(CniError) as refused:
        _ = NodeSettings({}, {"networkPolicy": "on"}).policy
    assert refused.value.code == INVALID_CONFIG and "networkPolicy" in refused.value.msg


def test_network_policy_is_a_setting_of_the_node_alone() -> None:
    assert node_only_keys()["networkPolicy"] == "VPC_ATTACH_NETWORK_POLICY"


def test_multi_network_policy_is_on_unless_the_nodes_operator_turns_it_off() -> None:
    assert NodeSettings({}, {}).policy.multi_network_policy is True  # SPEC §17
    off = NodeSettings({"VPC_ATTACH_MULTI_NETWORK_POLICY": "off"}, {}).policy
    assert off.multi_network_policy is False and off.network_policy is False
    assert NodeSettings({}, {"multiNetworkPolicy": "off"}).policy.multi_network_policy is False
    assert node_only_keys()["multiNetworkPolicy"] == "VPC_ATTACH_MULTI_NETWORK_POLICY"
