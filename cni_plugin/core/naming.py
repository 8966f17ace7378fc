"""Deterministic names and encodings (pure functions, no I/O).

Everything another component must be able to recompute lives here: kernel interface names,
Kubernetes object names, route targets and SRv6 SIDs (SPEC §5, §6).
"""

from __future__ import annotations

import hashlib
import ipaddress

from netconf.base62 import decode_base62, encode_base62

VPC_WIDTH = 9
ATTACHMENT_WIDTH = 3
ANNOTATION_CID_LENGTH = 41
MAX_OBJECT_NAME = 253  # a DNS subdomain name


def pad_base62(text: str, width: int) -> str:
    """The canonical base62 string left-padded with '0' to width (too long is an error)."""
    canonical = encode_base62(decode_base62(text))
    if len(canonical) > width:
        raise ValueError(f"base62 {text!r} does not fit in {width} characters")
    return canonical.rjust(width, "0")


def vrf_name(vpc: str) -> str:
    """Per-VPC VRF device: G{vpc:9}V."""
    return f"G{pad_base62(vpc, VPC_WIDTH)}V"


def host_link_name(vpc: str, attachment: str) -> str:
    """Host side of an attachment (veth host end or tap): G{vpc:9}{att:3}H."""
    return f"G{pad_base62(vpc, VPC_WIDTH)}{pad_base62(attachment, ATTACHMENT_WIDTH)}H"


def parse_host_link_name(name: str) -> tuple[str, str] | None:
    """(vpc, attachment) as canonical base62 from a host link name, or None if not one."""
    width = 1 + VPC_WIDTH + ATTACHMENT_WIDTH + 1
    if len(name) != width or name[0] != "G" or name[-1] != "H":
        return None
    try:
        vpc = encode_base62(decode_base62(name[1:1 + VPC_WIDTH]))
        attachment = encode_base62(decode_base62(name[1 + VPC_WIDTH:-1]))
    except ValueError:
        return None
    return vpc, attachment


def is_host_link_of(name: str, vpc: str) -> bool:
    """Whether name is the host side of an attachment of this VPC (G{vpc:9}{att:3}H)."""
    prefix = f"G{pad_base62(vpc, VPC_WIDTH)}"
    return len(name) == len(prefix) + ATTACHMENT_WIDTH + 1 and name.startswith(prefix) \
        and name.endswith("H")


def vpc_of_host_link(name: str) -> str | None:
    """The VPC (canonical base62) of a host link name G{vpc:9}{att:3}H, None for other names."""
    if len(name) != 1 + VPC_WIDTH + ATTACHMENT_WIDTH + 1 or name[0] != "G" or name[-1] != "H":
        return None
    try:
        return encode_base62(decode_base62(name[1:1 + VPC_WIDTH]))
    except ValueError:
        return None


def guest_link_name(vpc: str, attachment: str) -> str:
    """Container end of the veth before it is moved and renamed: G{vpc:9}{att:3}G."""
    return f"G{pad_base62(vpc, VPC_WIDTH)}{pad_base62(attachment, ATTACHMENT_WIDTH)}G"


def hex_id(base62: str) -> str:
    """Lowercase hex of a base62 value, as used in object names (10 -> 3e)."""
    return format(decode_base62(base62), "x")


def vrf_instance_name(vpc: str, node: str) -> str:
    """BGPVRFInstance name: {hex(vpc)}-{node}."""
    return f"{hex_id(vpc)}-{node}"


def advertisement_name(vpc: str, attachment: str, node: str) -> str:
    """This node's BGPAdvertisement of an attachment: {hex(vpc)}-{hex(att)}-{node}, the node
    shortened with a hash when the name would exceed 253 characters."""
    prefix = f"{shared_advertisement_name(vpc, attachment)}-"
    if len(prefix) + len(node) <= MAX_OBJECT_NAME:
        return prefix + node
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{prefix}{node[:MAX_OBJECT_NAME - len(prefix) - 11]}-{digest}"


def shared_advertisement_name(vpc: str, attachment: str) -> str:
    """The attachment's BGPAdvertisement as earlier versions wrote it for every node:
    {hex(vpc)}-{hex(att)} (converted to per-node ones, SPEC §6)."""
    return f"{hex_id(vpc)}-{hex_id(attachment)}"


def tenant_id(vpc: str, attachment: str) -> str:
    """Tenant label value: the raw base62 strings joined by '-'."""
    return f"{vpc}-{attachment}"


def route_target(local_asn: int, vpc: str) -> str:
    """Route target {localASN}:{low 32 bits of vpc}."""
    return f"{local_asn}:{decode_base62(vpc) & 0xFFFFFFFF}"


def annotation_cid(container_id: str) -> str:
    """The container ID as it appears in annotation keys (first 41 characters)."""
    return container_id[:ANNOTATION_CID_LENGTH]


def srv6_sid(locator: str, node_id: int, vrf_id: int) -> str:
    """End.DT46 SID: /48 locator, 16-bit node ID, 0xE nibble, 12-bit VRF ID, zeros."""
    network = ipaddress.IPv6Network(locator, strict=False)
    if network.prefixlen != 48:
        raise ValueError(f"SRv6 locator {locator!r} is not a /48")
    if not 0 <= node_id <= 0xFFFF:
        raise ValueError(f"node ID {node_id} out of range")
    if not 0 <= vrf_id <= 0xFFF:
        raise ValueError(f"VRF ID {vrf_id} out of range")
    value = int(network.network_address)
    value |= node_id << 64
    value |= ((0xE << 12) | vrf_id) << 48
    return str(ipaddress.IPv6Address(value))
