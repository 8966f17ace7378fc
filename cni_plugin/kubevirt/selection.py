"""The IPAMClaim the Pod's network-selection element for this attachment names (pure).

The elements are read by `kube/networks.py`, as the Network Plumbing WG's client reads them.
kubevirt's webhook writes the claim's name into the element as `ipam-claim-reference`; Multus
does not pass it on, so the plugin reads the annotation itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cni_plugin.kube.networks import (
    NETWORKS_ANNOTATION,
    NetworkName,
    NetworkSelection,
    SelectionError,
    parse_network_selections,
)
from netconf.errors import INVALID_CONFIG, CniError


@dataclass(frozen=True)
class ClaimReference:
    """An IPAMClaim by name, in the Pod's namespace (where kubevirt's ipam-extensions makes
    it, beside the VM)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_name_for(selections: Sequence[NetworkSelection], network: NetworkName | None,
                   interface: str) -> str | None:
    """The claim named by the element for this attachment (network, interface); None when no
    element selects it or the one that does names no claim.

    Elements of this network whose interface (asked for, or Multus's default name) is this
    one decide; when none is, those that ask for no interface do, as in OVN-Kubernetes, which
    matches on the network alone. network None (the plugin, which is not told its
    NetworkAttachmentDefinition): the interface alone decides, and the claim's `spec.network`
    is checked instead. They must agree on the claim: SelectionError otherwise."""
    mine = [s for s in selections if network is None or s.network == network]
    candidates = [s for s in mine if s.interface_name() == interface] \
        or [s for s in mine if s.interface is None and network is not None]
    claims = sorted({s.claim or "" for s in candidates})
    if len(claims) > 1:
        named = ", ".join(repr(c) if c else "none" for c in claims)
        which = f"select {network}" if network is not None else "ask"
        raise SelectionError(f"{len(candidates)} elements {which} for interface "
                             f"{interface} and name different IPAMClaims ({named})")
    if not claims:
        return None
    return claims[0] or None


def find_claim_reference(pod: Mapping[str, Any], *, network: NetworkName | None,
                         interface: str) -> ClaimReference | None:
    """The IPAMClaim the Pod's network-selection element for this attachment names, in the
    Pod's namespace; None without one (network None: matched by interface alone). A malformed
    or ambiguous annotation is code 7 naming the Pod."""
    meta = pod.get("metadata") or {}
    namespace, pod_name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    value = (meta.get("annotations") or {}).get(NETWORKS_ANNOTATION) or ""
    try:
        claim = claim_name_for(parse_network_selections(str(value), namespace), network,
                               interface)
    except SelectionError as exc:
        raise CniError(INVALID_CONFIG, f"Pod {namespace}/{pod_name}: annotation "
                       f"{NETWORKS_ANNOTATION}: {exc}", str(value)) from None
    return ClaimReference(namespace, claim) if claim else None
