"""Parsers of the node's own settings: (the value as set, its `NodeSetting`) -> the typed value,
or code 7 naming where it is set. The value is never None or "": the environment's text or the
host file's JSON value (SPEC §14, §15, §17).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from netconf.base62 import ATTACHMENT_LIMIT, VPC_LIMIT, decode_base62
from netconf.errors import INVALID_CONFIG, CniError
from netconf.node_setting import NodeSetting

NETWORK_POLICY_MODES = ("enforce", "off")  # SPEC §17: NetworkPolicy on conflist attachments
# The smallest underlay that still carries an encapsulated IPv6 packet of the minimum MTU.
MIN_UNDERLAY_MTU = 1280 + 40


def whole_number(value: Any, key: str, low: int, high: int) -> int:
    """An integer setting (a JSON number or, from the environment, its digits) in [low, high]."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())
    if number is None or not low <= number <= high:
        raise CniError(INVALID_CONFIG, f"invalid {key} {value!r}",
                       f"expected a whole number in [{low}, {high}]")
    return number


def absolute_path(value: Any, source: NodeSetting[str]) -> str:
    """A directory or file given by its absolute path."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                       f"expected an absolute path (environment {source.env})")
    return value


def link_names(value: Any, source: NodeSetting[tuple[str, ...]]) -> tuple[str, ...]:
    """Interface names: a list, or comma-separated."""
    names = value
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    if not isinstance(names, list) or not all(_link_name(n) for n in names):
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {names!r}",
                       f"expected interface names (a list, or comma-separated in {source.env})")
    return tuple(names)


def underlay_mtu(value: Any, source: NodeSetting[int | None]) -> int | None:
    """An MTU that still carries an encapsulated IPv6 packet of the minimum MTU."""
    return whole_number(value, source.key, MIN_UNDERLAY_MTU, 65535)


def on_or_off(value: Any, source: NodeSetting[bool]) -> bool:
    """`on` (True) or `off` (False); the host file may hold a JSON boolean too."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("on", "off"):
        return value.strip().lower() == "on"
    raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                   f"expected 'on' or 'off' (environment {source.env})")


def ipv6_sids(value: Any, source: NodeSetting[tuple[str, ...]]) -> tuple[str, ...]:
    """IPv6 SIDs: a list, or comma-separated (blanks skipped)."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        if not isinstance(items, list):
            raise ValueError("not a list")
        sids = [ipaddress.IPv6Address(str(item).strip()) for item in items if str(item).strip()]
        if any(sid.is_unspecified for sid in sids):
            raise ValueError("the unspecified address is no SID")
    except ValueError as exc:
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                       f"{exc}; expected IPv6 SIDs (a list, or comma-separated in "
                       f"{source.env})") from None
    return tuple(str(sid) for sid in sids)


def _link_name(name: Any) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 15 and name not in (".", "..") and \
        not any(c in name for c in "/: \t\n")


# Datapath settings (SPEC §14): the node's operator alone opens host ports or widens the source
# check, so these come from the environment and the host file only, never from a stanza.
HOST_ACCESS_PROTOCOLS = ("tcp", "udp", "sctp")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PortRange:
    """One `hostAccess` entry: protocol/port or protocol/first-last."""

    protocol: str
    first: int
    last: int

    def __str__(self) -> str:
        ports = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{self.protocol}/{ports}"


@dataclass(frozen=True)
class AllowedSources:
    """One `allowedSourcePrefixes` entry: extra source prefixes of a VPC's attachment (or of
    all its attachments when vpcattachment is None)."""

    vpc: str
    vpcattachment: str | None
    prefixes: tuple[IPNetwork, ...]


def parse_port_range(text: Any) -> PortRange:
    """`udp/53` or `tcp/8000-8080` (code 7 otherwise)."""
    protocol, _, ports = str(text).strip().lower().partition("/")
    first_text, _, last_text = ports.partition("-")
    last_text = last_text or first_text
    if protocol in HOST_ACCESS_PROTOCOLS and first_text.isdigit() and last_text.isdigit():
        first, last = int(first_text), int(last_text)
        if 1 <= first <= last <= 65535:
            return PortRange(protocol, first, last)
    raise CniError(INVALID_CONFIG, f"invalid hostAccess entry {text!r}",
                   "expected protocol/port or protocol/first-last, protocol one of "
                   f"{', '.join(HOST_ACCESS_PROTOCOLS)}, ports 1-65535")


def port_ranges(value: Any, source: NodeSetting[tuple[PortRange, ...]]) -> tuple[PortRange, ...]:
    """`hostAccess`: a list of `parse_port_range` entries (comma-separated in the
    environment)."""
    if not isinstance(value, list):
        raise CniError(INVALID_CONFIG, f"host setting {source.key!r} must be a list",
                       'e.g. ["udp/53", "tcp/53"]')
    return tuple(parse_port_range(item) for item in value)


def comma_list(text: str) -> list[str]:
    """An environment variable's comma-separated items (blanks skipped)."""
    return [item for item in text.split(",") if item.strip()]


def allowed_sources(value: Any, source: NodeSetting[tuple[AllowedSources, ...]]
                    ) -> tuple[AllowedSources, ...]:
    """`allowedSourcePrefixes`: a list of {vpc, vpcattachment (optional), prefixes}."""
    if not isinstance(value, list):
        raise CniError(INVALID_CONFIG, f"host setting {source.key!r} must be a list")
    return tuple(_allowed_sources(item) for item in value)


def _allowed_sources(item: Any) -> AllowedSources:
    hint = 'expected {"vpc": "…", "vpcattachment": "…" (optional), "prefixes": ["…/…"]}'
    if not isinstance(item, dict) or not isinstance(item.get("prefixes"), list):
        raise CniError(INVALID_CONFIG, f"invalid allowedSourcePrefixes entry {item!r}", hint)
    vpc, attachment = item.get("vpc"), item.get("vpcattachment")
    try:
        if not isinstance(vpc, str) or decode_base62(vpc) >= VPC_LIMIT:
            raise ValueError("vpc")
        if attachment is not None and (not isinstance(attachment, str)
                                       or decode_base62(attachment) >= ATTACHMENT_LIMIT):
            raise ValueError("vpcattachment")
        prefixes = tuple(ipaddress.ip_network(p, strict=False) for p in item["prefixes"])
    except (ValueError, TypeError) as exc:
        raise CniError(INVALID_CONFIG, f"invalid allowedSourcePrefixes entry {item!r}",
                       f"{exc}; {hint}") from None
    return AllowedSources(vpc, attachment, prefixes)


def network_policy_mode(value: Any, source: NodeSetting[bool]) -> bool:
    """`networkPolicy`: enforce (True) or off (False)."""
    if value not in NETWORK_POLICY_MODES:
        raise CniError(INVALID_CONFIG, f"invalid {source.key} {value!r}",
                       f"expected one of {', '.join(NETWORK_POLICY_MODES)} (environment "
                       f"{source.env})")
    return bool(value == "enforce")
