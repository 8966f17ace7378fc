"""The Pod's network-selection elements (`k8s.v1.cni.cncf.io/networks`), as the Network Plumbing
WG's client reads them (network-attachment-definition-client's `ParseNetworkAnnotation`, which
Multus, kubevirt's ipam-extensions and OVN-Kubernetes share): a JSON list when the value holds
`[`, `{` or `"`, else the comma-separated short form `[<namespace>/]<name>[@<interface>]`, which
carries no claim reference; an element without a namespace is in the Pod's (pure). Which
network a Pod's interface is on (policy), and which IPAMClaim an element names (KubeVirt's
`kubevirt/selection.py`), are read from these.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
