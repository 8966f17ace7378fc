"""What the BGP lifecycles share: spec fields, VRF IDs, and the container annotations an
advertisement records (read by the advertisement's merge and withdrawal, and by an instance's
question of who uses it)."""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterable
from typing import Any

from cni_plugin.publish.resources import (
    CONTAINER_KEYS,
    NETNS_KEY,
    NODE_KEY,
    SUBNET_V4_KEY,
    SUBNET_V6_KEY,
)

log = logging.getLogger(__name__)
VRF_ID_MIN, VRF_ID_MAX = 1, 4095
MAX_ATTEMPTS = 10


def vrf_id(obj: dict[str, Any]) -> int:
    """The spec.vrfID of an instance or advertisement (0 when unset)."""
    return int((obj.get("spec") or {}).get("vrfID") or 0)


def unchanged_since(spec: dict[str, Any], written: dict[str, Any]) -> bool:
    """Whether the fields an ADD wrote still hold what it wrote (nobody changed them since)."""
    return all(spec.get(key) == value for key, value in written.items())


def restore_fields(spec: dict[str, Any], before: dict[str, Any]) -> None:
    """Put back the fields as they were before an ADD wrote them (None: absent)."""
    for key, value in before.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value


def prefixes_of(annotations: dict[str, str]) -> list[str]:
    """The advertised set: union of every container's subnets, deduplicated and sorted."""
    found: set[str] = set()
    for key, value in annotations.items():
        try:
            if key.startswith(SUBNET_V6_KEY):
                found.add(str(ipaddress.IPv6Network(value, strict=False)))
            elif key.startswith(SUBNET_V4_KEY):
                found.add(str(ipaddress.IPv4Network(f"{value}/32")))
        except ValueError:
            log.warning("ignoring malformed annotation %s=%r", key, value)
    return sorted(found, key=lambda p: (ipaddress.ip_network(p).version,
                                        ipaddress.ip_network(p)))


def stale_containers(annotations: dict[str, str], node: str, keep: str) -> set[str]:
    """Containers this node recorded whose netns no longer exists here."""
    stale = set()
    for key, value in annotations.items():
        if key.startswith(NODE_KEY) and value == node:
            cid = key[len(NODE_KEY):]
            netns = annotations.get(NETNS_KEY + cid, "")
            if cid != keep and netns and not os.path.exists(netns):
                stale.add(cid)
    return stale


def recorded_containers(annotations: dict[str, str], node: str) -> set[str]:
    """Containers this node recorded."""
    return {key[len(NODE_KEY):] for key, value in annotations.items()
            if key.startswith(NODE_KEY) and value == node}


def live_containers(annotations: dict[str, str], node: str) -> set[str]:
    """Containers this node recorded whose netns is still there."""
    return recorded_containers(annotations, node) - stale_containers(annotations, node, keep="")


def drop_containers(annotations: dict[str, str], cids: Iterable[str]) -> None:
    """Remove every annotation of these containers."""
    for cid in cids:
        for key in CONTAINER_KEYS:
            annotations.pop(key + cid, None)
