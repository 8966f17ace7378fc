"""The compiler's inputs read off API objects and the node's own records (pure).

Which network an attachment was made from is the Pod's business: the element of its
`k8s.v1.cni.cncf.io/networks` annotation that gives the attachment's interface names the
NetworkAttachmentDefinition (the matching SPEC §16 uses); an interface no element gives is the
node's conflist attachment. Peer addresses come from what vpc-attach itself publishes (the
Pods' EndpointSlices: Pod, attachment, interface and address, owned by the Pod) and, for this
node's attachments, from its own records; never from Multus' `network-status`, which a
cluster without Multus lacks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from cni_plugin.policy.compile import Address, Endpoint, NetworkRef, PodFacts, World
from cni_plugin.policy.model import PROTOCOLS, Policy
from cni_plugin.policy.networks import network_of, pod_key
from cni_plugin.publish.resources import (
    ATTACHMENT_LABEL,
    IFNAME_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
)


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """A Pod's labels and named container ports (sidecar init containers' too)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ports: dict[tuple[str, str], int] = {}
    containers = [*(spec.get("containers") or []),
                  *(c for c in spec.get("initContainers") or []
                    if isinstance(c, Mapping) and c.get("restartPolicy") == "Always")]
    for container in containers:
        for port in (container.get("ports") or []) if isinstance(container, Mapping) else []:
            if not isinstance(port, Mapping):
                continue
            name, number = port.get("name"), port.get("containerPort")
            protocol = port.get("protocol") or "TCP"
            if isinstance(name, str) and name and isinstance(number, int) and \
                    protocol in PROTOCOLS:
                ports.setdefault((name, protocol), number)
    labels = meta.get("labels") or {}
    return PodFacts(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                    {str(k): str(v) for k, v in labels.items()}, ports)


def slice_endpoint(endpoint_slice: Mapping[str, Any],
                   pods: Mapping[tuple[str, str], Mapping[str, Any]]) -> Endpoint | None:
    """The attachment an EndpointSlice of vpc-attach's describes, if its Pod is known and
    still the one it was published for (same uid)."""
    meta = endpoint_slice.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return None
    vpc = str(labels.get(ATTACHMENT_LABEL) or "").partition("-")[0]
    ifname = str(annotations.get(IFNAME_ANNOTATION) or "")
    found = [e for e in endpoint_slice.get("endpoints") or [] if isinstance(e, Mapping)]
    if not vpc or not ifname or not found:
        return None
    target = found[0].get("targetRef") or {}
    namespace = str(target.get("namespace") or meta.get("namespace") or "")
    pod = pods.get((namespace, str(target.get("name") or "")))
    if pod is None or pod_key(pod).uid != str(target.get("uid") or ""):
        return None
    addresses = _addresses(a for e in found for a in e.get("addresses") or [])
    return Endpoint(namespace, pod_key(pod).name, network_of(pod, ifname), vpc, addresses)


def _addresses(values: Iterable[Any]) -> tuple[Address, ...]:
    found = []
    for value in values:
        try:
            found.append(ipaddress.ip_address(str(value).split("/")[0]))
        except ValueError:
            continue
    return tuple(found)


def build_world(policies: Iterable[Policy], pods: Iterable[Mapping[str, Any]],
                namespaces: Iterable[Mapping[str, Any]],
                slices: Iterable[Mapping[str, Any]], local: Iterable[Endpoint],
                network_policy: bool) -> World:
    """The compiler's world: peers from the EndpointSlices of known Pods and from this
    node's own attachments (the addresses of one attachment merged)."""
    by_key = {(pod_key(p).namespace, pod_key(p).name): p for p in pods}
    labels = {str((n.get("metadata") or {}).get("name") or ""):
              {str(k): str(v) for k, v in ((n.get("metadata") or {}).get("labels") or {}).items()}
              for n in namespaces}
    merged: dict[tuple[str, str, NetworkRef, str], set[Address]] = {}
    found = [e for e in (slice_endpoint(s, by_key) for s in slices) if e is not None]
    for endpoint in (*found, *local):
        key = (endpoint.namespace, endpoint.pod, endpoint.network, endpoint.vpc)
        merged.setdefault(key, set()).update(endpoint.addresses)
    endpoints = [Endpoint(namespace, pod, network, vpc,
                          tuple(sorted(addresses, key=lambda a: (a.version, int(a)))))
                 for (namespace, pod, network, vpc), addresses in sorted(
                     merged.items(), key=lambda item: (item[0][0], item[0][1], str(item[0][2]),
                                                       item[0][3]))]
    return World(tuple(policies), {key: pod_facts(pod) for key, pod in by_key.items()},
                 labels, endpoints, network_policy)
