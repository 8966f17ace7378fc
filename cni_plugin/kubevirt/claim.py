"""An IPAMClaim as vpc-attach reads it, and the status an allocation leaves on it (pure).

The object is the Go module github.com/k8snetworkplumbingwg/ipamclaims' (v0.5.1-alpha):
`spec.network` (the network config's `name`), `spec.interface`, and a status of `ips` (CIDR
strings), `ownerPod.name` and `conditions`. The status is written as OVN-Kubernetes writes it
(`persistentips.UpdateIPAMClaimStatus`): condition `IPsAllocated`, True with reason
`SuccessfulAllocation`, or False with `SubnetExhausted`, `IPAddressConflict` or
`InternalError` and empty `ips`; addresses a claim holds are never overwritten.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

GROUP = "k8s.cni.cncf.io"
VERSION = "v1alpha1"
KIND = "IPAMClaim"
IPS_ALLOCATED = "IPsAllocated"
SUCCESSFUL_ALLOCATION = "SuccessfulAllocation"
SUCCESS_MESSAGE = "IP addresses successfully allocated"  # OVN-Kubernetes' words
FailureReason = Literal["SubnetExhausted", "IPAddressConflict", "InternalError"]
MESSAGE_MAX = 32768  # the CRD's limit on a condition's message


class MalformedClaim(ValueError):
    """The object is not an IPAMClaim vpc-attach can use; the message names the field."""


class IPsAlreadySet(ValueError):
    """The claim holds other addresses than the ones offered: they are never overwritten."""

    def __init__(self, held: Sequence[str], offered: Sequence[str]) -> None:
        super().__init__(f"it holds {', '.join(held)}, not {', '.join(offered)}")
        self.held = tuple(held)
        self.offered = tuple(offered)


@dataclass(frozen=True)
class Condition:
    """One of `status.conditions` (a metav1.Condition)."""

    type: str
    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int = 0


@dataclass(frozen=True)
class IPAMClaim:
    """The fields of a claim vpc-attach reads, and the object they came from."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int
    network: str  # spec.network: the network config's `name` it is for
    interface: str  # spec.interface; kubevirt's ipam-extensions leaves it empty
    ips: tuple[str, ...]  # status.ips, as CIDR strings
    owner_pod: str | None  # status.ownerPod.name
    conditions: tuple[Condition, ...]
    deleting: bool  # metadata.deletionTimestamp is set
    obj: dict[str, Any] = field(compare=False, repr=False)  # as read; never edited

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> IPAMClaim:
        """The claim in an API object; MalformedClaim naming the field that is wrong."""
        meta = _mapping(obj.get("metadata"), "metadata")
        spec = _mapping(obj.get("spec"), "spec")
        status = _mapping(obj.get("status"), "status")
        owner = _mapping(status.get("ownerPod"), "status.ownerPod")
        ips = _strings(status.get("ips"), "status.ips")
        for value in ips:
            try:
                ipaddress.ip_interface(value)
            except ValueError:
                raise MalformedClaim(f"status.ips: {value!r} is not an address with a "
                                     "prefix length") from None
        conditions = tuple(_condition(item, index) for index, item
                           in enumerate(_list(status.get("conditions"), "status.conditions")))
        return cls(namespace=_text(meta, "namespace"), name=_text(meta, "name"),
                   uid=_text(meta, "uid"), resource_version=_text(meta, "resourceVersion"),
                   generation=int(meta.get("generation") or 0),
                   network=_text(spec, "network"), interface=_text(spec, "interface"),
                   ips=ips, owner_pod=_text(owner, "name") or None, conditions=conditions,
                   deleting=bool(meta.get("deletionTimestamp")), obj=copy.deepcopy(dict(obj)))

    def condition(self, kind: str = IPS_ALLOCATED) -> Condition | None:
        """The condition of that type, if the claim has one."""
        return next((c for c in self.conditions if c.type == kind), None)


@dataclass(frozen=True)
class Allocated:
    """Addresses an ADD got for the claim, as CIDR strings (normalised; order kept)."""

    ips: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.ips:
            raise ValueError("an allocation has at least one address")
        object.__setattr__(self, "ips", tuple(_normalised(self.ips)))


@dataclass(frozen=True)
class AllocationFailed:
    """Why an ADD got no addresses for the claim."""

    reason: FailureReason
    message: str


Allocation = Allocated | AllocationFailed


def same_addresses(left: Iterable[str], right: Iterable[str]) -> bool:
    """Whether two lists of CIDR strings hold the same addresses, in any order or spelling."""
    return set(map(ipaddress.ip_interface, left)) == set(map(ipaddress.ip_interface, right))


def status_after(claim: IPAMClaim, allocation: Allocation, *, pod: str,
                 now: str) -> dict[str, Any]:
    """The claim's status once this allocation is recorded; every other field kept.

    Allocated: the claim's addresses are these (IPsAlreadySet when it holds others),
    `ownerPod` is this Pod and `IPsAllocated` is True. Failed: `ips` empty, `ownerPod` and
    `IPsAllocated` False with the reason, only while the claim holds no addresses; once it
    does, a failed ADD leaves it as it is (OVN-Kubernetes writes nothing then either). `now`
    (RFC 3339) is the transition time, used only when the condition's status changes."""
    status: dict[str, Any] = copy.deepcopy(dict(claim.obj.get("status") or {}))
    if isinstance(allocation, Allocated):
        if claim.ips and not same_addresses(claim.ips, allocation.ips):
            raise IPsAlreadySet(claim.ips, allocation.ips)
        status["ips"] = list(claim.ips or allocation.ips)
        outcome = Condition(IPS_ALLOCATED, "True", SUCCESSFUL_ALLOCATION, SUCCESS_MESSAGE, now,
                            claim.generation)
    else:
        if claim.ips:
            return status
        status["ips"] = []
        outcome = Condition(IPS_ALLOCATED, "False", allocation.reason,
                            allocation.message[:MESSAGE_MAX], now, claim.generation)
    status["ownerPod"] = {"name": pod}
    status["conditions"] = with_condition(status.get("conditions") or [], outcome)
    return status


def with_condition(conditions: Sequence[Mapping[str, Any]],
                   condition: Condition) -> list[dict[str, Any]]:
    """The conditions with this one set as apimachinery's `meta.SetStatusCondition` sets it:
    added if absent; else reason, message and observedGeneration replaced, and the transition
    time only when the status changes. Conditions of other types are kept as they are."""
    updated = [dict(c) for c in conditions]
    found = next((c for c in updated if c.get("type") == condition.type), None)
    if found is None:
        found = {"type": condition.type, "status": condition.status,
                 "lastTransitionTime": condition.last_transition_time}
        updated.append(found)
    elif found.get("status") != condition.status:
        found["status"] = condition.status
        found["lastTransitionTime"] = condition.last_transition_time
    found["reason"] = condition.reason
    found["message"] = condition.message
    if condition.observed_generation:
        found["observedGeneration"] = condition.observed_generation
    else:
        found.pop("observedGeneration", None)
    return updated


def _normalised(ips: Iterable[str]) -> list[str]:
    found: list[str] = []
    for value in ips:
        text = str(ipaddress.ip_interface(value))  # ValueError names the value
        if text in found:
            raise ValueError(f"{value} is given twice")
        found.append(text)
    return found


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedClaim(f"{where} is not an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedClaim(f"{where} is not a list")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    items = _list(value, where)
    if not all(isinstance(item, str) for item in items):
        raise MalformedClaim(f"{where} holds something other than strings")
    return tuple(items)


def _text(mapping: Mapping[str, Any], key: str) -> str:
    value = mapping.get(key)
    if value is not None and not isinstance(value, str):
        raise MalformedClaim(f"{key} is not a string")
    return value or ""


def _condition(item: Any, index: int) -> Condition:
    item = _mapping(item, f"status.conditions[{index}]")
    return Condition(type=_text(item, "type"), status=_text(item, "status"),
                     reason=_text(item, "reason"), message=_text(item, "message"),
                     last_transition_time=_text(item, "lastTransitionTime"),
                     observed_generation=int(item.get("observedGeneration") or 0))
