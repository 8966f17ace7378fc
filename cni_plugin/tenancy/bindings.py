"""VPCBindings and the admission decision (SPEC §14), pure: no I/O.

A binding admits (vpc, attachment, namespace, kind) when it names the VPC, lists the attachment
(or "*"), selects the namespace's labels and allows the kind. Bindings add up like RBAC rules:
one admitting binding is enough, and no binding means no.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from netconf.base62 import decode_base62

ALL_ATTACHMENTS = "*"
USES = ("veth", "tap", "existing")
SET_OPERATORS = ("In", "NotIn")
OPERATORS = (*SET_OPERATORS, "Exists", "DoesNotExist")


class MalformedBinding(ValueError):
    """A binding (or its selector) the schema should have refused: it admits nothing."""


@dataclass(frozen=True)
class Requirement:
    """One matchExpressions entry."""

    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether labels satisfy it, as Kubernetes' label selectors define."""
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        found = self.key in labels and labels[self.key] in self.values
        return found if self.operator == "In" else not found


@dataclass(frozen=True)
class Selector:
    """A LabelSelector: every matchLabels pair and every requirement must hold."""

    match_labels: Mapping[str, str]
    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, data: Any) -> Selector:
        """A LabelSelector object ({} selects everything); MalformedBinding otherwise."""
        if not isinstance(data, Mapping):
            raise MalformedBinding("namespaceSelector is not an object")
        labels = data.get("matchLabels") or {}
        expressions = data.get("matchExpressions") or []
        if not isinstance(labels, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise MalformedBinding("matchLabels is not a map of strings")
        if not isinstance(expressions, list):
            raise MalformedBinding("matchExpressions is not a list")
        return cls(dict(labels), tuple(_requirement(item) for item in expressions))

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a namespace with these labels is selected."""
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and \
            all(req.matches(labels) for req in self.requirements)


def _requirement(item: Any) -> Requirement:
    if not isinstance(item, Mapping) or not isinstance(item.get("key"), str):
        raise MalformedBinding("a matchExpressions entry has no key")
    operator, values = item.get("operator"), item.get("values") or []
    if operator not in OPERATORS:
        raise MalformedBinding(f"unknown operator {operator!r}")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values) or \
            (operator in SET_OPERATORS) != bool(values):
        raise MalformedBinding(f"operator {operator} with values {values!r}")
    return Requirement(item["key"], operator, frozenset(values))


@dataclass(frozen=True)
class Binding:
    """A VPCBinding's spec, read."""

    name: str
    vpc: int
    attachments: frozenset[int] | None  # None: every attachment ("*")
    selector: Selector
    uses: frozenset[str]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Binding:
        """Read a VPCBinding object; MalformedBinding if its spec is not what the CRD allows."""
        name = str((obj.get("metadata") or {}).get("name", "?"))
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise MalformedBinding(f"{name}: no spec")
        try:
            attachments = spec.get("attachments")
            uses = spec.get("allowedUses")
            if not isinstance(attachments, list) or not attachments or \
                    not isinstance(uses, list) or not set(uses) <= set(USES):
                raise MalformedBinding("attachments or allowedUses malformed")
            every = ALL_ATTACHMENTS in attachments
            return cls(name, _id(spec.get("vpc")),
                       None if every else frozenset(_id(a) for a in attachments),
                       Selector.parse(spec.get("namespaceSelector")), frozenset(uses))
        except MalformedBinding as exc:
            raise MalformedBinding(f"{name}: {exc}") from None

    def refusal(self, vpc: int, attachment: int, labels: Mapping[str, str] | None,
                kind: str) -> str | None:
        """Why this binding does not admit the request, or None when it does."""
        if self.vpc != vpc:
            return "another VPC"
        if self.attachments is not None and attachment not in self.attachments:
            return "attachment not listed"
        if labels is None or not self.selector.matches(labels):
            return "namespace not selected"
        if kind not in self.uses:
            return f"allows {', '.join(sorted(self.uses))}, not {kind}"
        return None


def _id(value: Any) -> int:
    if not isinstance(value, str):
        raise MalformedBinding(f"identifier {value!r} is not a string")
    try:
        return decode_base62(value)
    except ValueError as exc:
        raise MalformedBinding(str(exc)) from None


def _names_vpc(obj: Mapping[str, Any], vpc: int) -> bool:
    spec = obj.get("spec")
    try:
        return isinstance(spec, Mapping) and _id(spec.get("vpc")) == vpc
    except MalformedBinding:
        return False


@dataclass(frozen=True)
class Decision:
    """The outcome: admitted by `by` (a binding name), or not, with what was considered."""

    by: str | None
    considered: tuple[str, ...]  # "name: why not", for the VPC's bindings

    @property
    def admitted(self) -> bool:
        """Whether some binding admits."""
        return self.by is not None

    def details(self, vpc: str, total: int) -> str:
        """The bindings considered, for the error's details and the Event."""
        if not self.considered:
            return f"no VPCBinding names VPC {vpc} ({total} VPCBinding(s) in the cluster)"
        return "VPCBindings of VPC " + vpc + ": " + "; ".join(self.considered)


def decide(objects: Sequence[Mapping[str, Any]], vpc: str, attachment: str,
           labels: Mapping[str, str] | None, kind: str) -> Decision:
    """Whether any binding admits (vpc, attachment, a namespace with labels, kind); labels is
    None when the namespace is unknown (nothing selects it)."""
    vpc_id, attachment_id = decode_base62(vpc), decode_base62(attachment)
    considered = []
    for obj in sorted(objects, key=lambda o: str((o.get("metadata") or {}).get("name"))):
        try:
            binding = Binding.from_object(obj)
        except MalformedBinding as exc:
            if _names_vpc(obj, vpc_id):
                considered.append(f"{exc} (ignored)")
            continue
        why = binding.refusal(vpc_id, attachment_id, labels, kind)
        if why is None:
            return Decision(binding.name, ())
        if why != "another VPC":
            considered.append(f"{binding.name}: {why}")
    return Decision(None, tuple(considered))
