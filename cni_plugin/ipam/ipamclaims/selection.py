"""The Pod's network-selection elements (`k8s.v1.cni.cncf.io/networks`) and the IPAMClaim the
one for this attachment names (pure).

Read as the Network Plumbing WG's client reads them (network-attachment-definition-client's
`ParseNetworkAnnotation`, which Multus, kubevirt's ipam-extensions and OVN-Kubernetes share): a
JSON list when the value holds `[`, `{` or `"`, else the comma-separated short form
`[<namespace>/]<name>[@<interface>]`, which carries no claim reference; an element without a
namespace is in the Pod's. kubevirt's webhook writes the claim's name into the element as
`ipam-claim-reference`; Multus does not pass it on, so the plugin reads the annotation itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from netconf.errors import INVALID_CONFIG, CniError

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
CLAIM_REFERENCE = "ipam-claim-reference"
_JSON_MARKS = re.compile(r'[\[{"]')
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # the short form's every part
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_OBJECT_NAME_MAX = 253


class SelectionError(ValueError):
    """The annotation cannot say which claim this attachment has: malformed, or ambiguous."""


@dataclass(frozen=True, order=True)
class NetworkName:
    """A NetworkAttachmentDefinition by namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NetworkSelection:
    """One element of the annotation, its namespace defaulted to the Pod's."""

    network: NetworkName
    interface: str | None  # the interface it asks for, if it names one
    claim: str | None  # its `ipam-claim-reference`
    position: int  # its place in the annotation, from 0

    def interface_name(self) -> str:
        """The interface Multus gives it: the one asked for, else `net<position + 1>` (the
        cluster's default network is Multus's delegate 0)."""
        return self.interface or f"net{self.position + 1}"


@dataclass(frozen=True)
class ClaimReference:
    """An IPAMClaim by name, in the Pod's namespace (where kubevirt's ipam-extensions makes
    it, beside the VM)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_network_selections(value: str, pod_namespace: str) -> tuple[NetworkSelection, ...]:
    """The elements of an annotation value; SelectionError when malformed. An empty value
    selects nothing."""
    if not value.strip():
        return ()
    if _JSON_MARKS.search(value):
        try:
            elements = json.loads(value)
        except ValueError as exc:
            raise SelectionError(f"not JSON: {exc}") from None
        if not isinstance(elements, list):
            raise SelectionError("the JSON form is a list of network-selection elements")
        return tuple(_json_element(element, position, pod_namespace)
                     for position, element in enumerate(elements))
    return tuple(_short_element(item.strip(), position, pod_namespace)
                 for position, item in enumerate(value.split(",")))


def _json_element(element: Any, position: int, pod_namespace: str) -> NetworkSelection:
    if not isinstance(element, dict):
        raise SelectionError(f"element {position} is not an object")
    name = _string(element, "name", position)
    if not name:
        raise SelectionError(f"element {position} names no network")
    claim = _string(element, CLAIM_REFERENCE, position)
    if claim and not _is_object_name(claim):
        raise SelectionError(f"element {position}: {CLAIM_REFERENCE} {claim!r} is not an "
                             "object name")
    namespace = _string(element, "namespace", position)
    return NetworkSelection(NetworkName(namespace or pod_namespace, name),
                            _string(element, "interface", position) or None, claim or None,
                            position)


def _string(element: Mapping[str, Any], key: str, position: int) -> str:
    """A string field as Go's encoding/json fills it: the key matched regardless of case (the
    last such key wins), null as empty, any other type an error."""
    value = None
    for name, found in element.items():
        if name.casefold() == key:
            value = found
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SelectionError(f"element {position}: {key} is not a string")
    return value


def _short_element(item: str, position: int, pod_namespace: str) -> NetworkSelection:
    namespace, slash, rest = item.partition("/")
    if not slash:
        namespace, rest = "", item
    elif "/" in rest:
        raise SelectionError(f"{item!r}: more than one '/'")
    name, at, interface = rest.partition("@")
    if at and "@" in interface:
        raise SelectionError(f"{item!r}: more than one '@'")
    namespace, name, interface = namespace.strip(), name.strip(), interface.strip()
    for part in (namespace, name, interface):
        if part and not _LABEL.fullmatch(part):
            raise SelectionError(f"{item!r}: {part!r} is not a lower-case DNS label")
    if not name:
        raise SelectionError(f"element {position} names no network")
    return NetworkSelection(NetworkName(namespace or pod_namespace, name), interface or None,
                            None, position)


def _is_object_name(value: str) -> bool:
    return len(value) <= _OBJECT_NAME_MAX and bool(_OBJECT_NAME.fullmatch(value))


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
