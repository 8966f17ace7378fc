"""The groups of the node's own settings (SPEC §14, §15, §17), each a frozen dataclass of
`node_setting` fields: the datapath's host protection, galactic's pins and the underlay, policy
inside a VPC. A new setting is one field in its group; a new group, a dataclass here and a
`cached_property` on `netconf.host.NodeSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass

from netconf.node_parsers import (
    AllowedSources,
    PortRange,
    absolute_path,
    allowed_sources,
    comma_list,
    ipv6_sids,
    link_names,
    network_policy_mode,
    on_or_off,
    port_ranges,
    underlay_mtu,
)
from netconf.node_setting import node_setting, node_settings_group

DEFAULT_GALACTIC_PIN_DIR = "/sys/fs/bpf/galactic"


@node_settings_group
@dataclass(frozen=True)
class DatapathSettings:
    """What the node's host protection lets through beyond the defaults."""

    host_access: tuple[PortRange, ...] = node_setting(
        "hostAccess", "VPC_ATTACH_HOST_ACCESS", port_ranges, (), env_form=comma_list)
    allowed_sources: tuple[AllowedSources, ...] = node_setting(
        "allowedSourcePrefixes", None, allowed_sources, ())


@node_settings_group
@dataclass(frozen=True)
class GalacticSettings:
    """Where galactic's datapath is pinned, and the underlay its packets cross (SPEC §15)."""

    pin_dir: str = node_setting("galacticPinDir", "VPC_ATTACH_GALACTIC_PIN_DIR", absolute_path,
                                DEFAULT_GALACTIC_PIN_DIR)
    # empty: the IPv6 default route's devices
    underlay_interfaces: tuple[str, ...] = node_setting(
        "underlayInterfaces", "VPC_ATTACH_UNDERLAY_INTERFACES", link_names, ())
    # None: the smallest MTU of the underlay interfaces
    underlay_mtu: int | None = node_setting("underlayMTU", "VPC_ATTACH_UNDERLAY_MTU",
                                            underlay_mtu, None)
    # a VRF's default egress goes to the first reachable
    nat66_shard_sids: tuple[str, ...] = node_setting(
        "nat66ShardSIDs", "VPC_ATTACH_NAT66_SHARD_SIDS", ipv6_sids, ())
    # off: a registered veth's Pod side segments before usid_egress (galactic's at the
    # compatible commit drops a GSO packet it encapsulates); on: galactic encapsulates them
    offloads: bool = node_setting("galacticOffloads", "VPC_ATTACH_GALACTIC_OFFLOADS", on_or_off,
                                  False)


@node_settings_group
@dataclass(frozen=True)
class PolicySettings:
    """Policy inside a VPC (SPEC §17): MultiNetworkPolicy on attachments made from
    NetworkAttachmentDefinitions, NetworkPolicy on the node's conflist (primary network)
    attachments, each where the node's operator says so."""

    network_policy: bool = node_setting("networkPolicy", "VPC_ATTACH_NETWORK_POLICY",
                                        network_policy_mode, False)
    # On, as SPEC §17 has it; `off` is the node operator's alone (never a network config's):
    # doctor then warns on every node, so a tenant's policies are never silently ignored.
    multi_network_policy: bool = node_setting(
        "multiNetworkPolicy", "VPC_ATTACH_MULTI_NETWORK_POLICY", network_policy_mode, True)
