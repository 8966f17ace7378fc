"""Which network an attachment was made from (light: ADD reads it for every Pod, before it
knows whether any policy could apply).

The element of the Pod's `k8s.v1.cni.cncf.io/networks` annotation that gives the attachment's
interface names the NetworkAttachmentDefinition (the matching SPEC §16 uses); an interface no
element gives is the node's conflist attachment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni_plugin.kube.networks import (
    NETWORKS_ANNOTATION,
    NetworkName,
    SelectionError,
    parse_network_selections,
)

# The network an attachment was made from: a NetworkAttachmentDefinition, or None for the
# node's conflist (the Pod's primary network).
NetworkRef = NetworkName | None
PRIMARY: NetworkRef = None
# An annotation that cannot be read: the attachment's network is unknown, no policy is for it.
UNKNOWN_NETWORK = NetworkName("", "")


def network_of(pod: Mapping[str, Any] | None, ifname: str) -> NetworkRef:
    """The NetworkAttachmentDefinition the attachment on `ifname` was made from, PRIMARY for
    the conflist's, UNKNOWN_NETWORK when the annotation cannot be read."""
    if pod is None:
        return UNKNOWN_NETWORK
    meta = pod.get("metadata") or {}
    value = str((meta.get("annotations") or {}).get(NETWORKS_ANNOTATION) or "")
    try:
        selections = parse_network_selections(value, str(meta.get("namespace") or ""))
    except SelectionError:
        return UNKNOWN_NETWORK
    giving = {s.network for s in selections if s.interface_name() == ifname}
    if len(giving) > 1:
        return UNKNOWN_NETWORK
    return next(iter(giving)) if giving else PRIMARY


@dataclass(frozen=True)
class PodKey:
    """A Pod by namespace, name and uid."""

    namespace: str
    name: str
    uid: str


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    """The Pod's namespace, name and uid."""
    meta = pod.get("metadata") or {}
    return PodKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                  str(meta.get("uid") or ""))
