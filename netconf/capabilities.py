"""The `ips` and `mac` capabilities of CNI's CONVENTIONS.md: the addresses and the MAC a runtime
asks for (SPEC §16). Each comes from the first of `runtimeConfig`, `args.cni` and CNI_ARGS
(`IP`, `MAC`) that has it, as the reference `static` and `bridge` plugins read them; a later
form is ignored when an earlier one is present. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netconf.config import lookup_ci
from netconf.errors import INVALID_CONFIG, CniError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Six octets, ':' or '-' between them (both forms Go's net.ParseMAC reads for Ethernet).
MAC_TEXT = re.compile(r"^[0-9a-fA-F]{2}([:-])[0-9a-fA-F]{2}(\1[0-9a-fA-F]{2}){4}$")
IPS_SOURCES = ("runtimeConfig.ips", "args.cni.ips", "CNI_ARGS 'IP'")
MAC_SOURCES = ("runtimeConfig.mac", "args.cni.mac", "CNI_ARGS 'MAC'")


@dataclass(frozen=True)
class RequestedAddress:
    """One requested address: the IP, and the entry as it was written (for messages)."""

    ip: IPAddress
    text: str


@dataclass(frozen=True)
class RequestedIps:
    """The addresses a runtime asked for and where they came from (one of IPS_SOURCES)."""

    addresses: tuple[RequestedAddress, ...]
    source: str


def requested_ips(config: Mapping[str, Any], cni_args: Mapping[str, str]) -> RequestedIps | None:
    """The requested addresses of the first form present (an empty list or value counts as
    absent), each "<ip>[/<prefix>]" with the prefix checked and then ignored, as host-local
    does; duplicates dropped. Malformed: code 7 naming the form."""
    forms: tuple[Any, ...] = (_runtime_value(config, "ips"), _args_value(config, "ips"),
                              cni_args.get("IP") or None)
    for source, value in zip(IPS_SOURCES, forms, strict=True):
        if value is None or value == []:
            continue
        if source == IPS_SOURCES[2]:  # CNI_ARGS: comma-separated, like the static plugin's
            value = [item.strip() for item in str(value).split(",")]
        if not isinstance(value, list):
            raise invalid_request(source, f"{value!r} is not a list of addresses")
        found: dict[IPAddress, RequestedAddress] = {}
        for entry in value:
            address = parse_requested_address(source, entry)
            found.setdefault(address.ip, address)
        return RequestedIps(tuple(found.values()), source)
    return None


def parse_requested_address(source: str, entry: Any) -> RequestedAddress:
    """One "<ip>[/<prefix>]" entry (code 7 naming source unless it is one)."""
    if not isinstance(entry, str) or not entry:
        raise invalid_request(source, f"{entry!r} is not an address")
    if "%" in entry:  # a zone index names a link, never an address of a pool
        raise invalid_request(source, f"{entry!r} carries a zone index")
    try:
        ip = ipaddress.ip_interface(entry).ip if "/" in entry else ipaddress.ip_address(entry)
    except ValueError:
        raise invalid_request(source, f"{entry!r} is not an address (<ip>[/<prefix>])") from None
    return RequestedAddress(ip, entry)


def requested_mac(config: Mapping[str, Any], cni_args: Mapping[str, str]) -> str | None:
    """The requested MAC of the first form present, as aa:bb:cc:dd:ee:ff; code 7 naming the
    form unless it is six octets. (A group or all-zero MAC is the kernel's to refuse: code 100
    once the links exist, and ADD rolls back; e2e/test_veth_lifecycle.py proves that rollback
    with one.)"""
    forms = (_runtime_value(config, "mac"), _args_value(config, "mac"),
             cni_args.get("MAC") or None)
    for source, value in zip(MAC_SOURCES, forms, strict=True):
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not MAC_TEXT.match(value):
            raise invalid_request(source, f"{value!r} is not a MAC address",
                                  "expected a MAC address like 0a:58:0a:00:00:05")
        return value.replace("-", ":").lower()
    return None


def _runtime_value(config: Mapping[str, Any], key: str) -> Any:
    runtime = lookup_ci(config, "runtimeConfig")
    return lookup_ci(runtime, key) if isinstance(runtime, Mapping) else None


def _args_value(config: Mapping[str, Any], key: str) -> Any:
    args = lookup_ci(config, "args")
    cni = lookup_ci(args, "cni") if isinstance(args, Mapping) else None
    return lookup_ci(cni, key) if isinstance(cni, Mapping) else None


def invalid_request(source: str, why: str, details: str = "") -> CniError:
    """Code 7 naming where a request came from: a config key, the CNI_ARGS key, or the
    IPAMClaim whose addresses are requested."""
    where = source if source.startswith(("CNI_ARGS", "IPAMClaim")) else f"config key '{source}'"
    return CniError(INVALID_CONFIG, f"invalid {where}: {why}", details)
