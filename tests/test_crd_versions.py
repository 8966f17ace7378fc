"""The CRDs vpc-attach owns keep serving every version the previous release served, and what
that release could write still validates (SPEC §18): compared with the CRDs of the commit
`packaging/upgrade-from` names, read from the repository's history (a clone without that
commit fails here, saying so; it never skips)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
UPGRADE_FROM = REPO / "packaging" / "upgrade-from"
OWNED_GROUP = "vpc-attach.datum.net"  # VPCBinding, IPAMBlock: the BGP kinds are galactic's
CRDS = "packaging/crds"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, check=False)


def _previous_crds() -> dict[str, dict[str, Any]]:
    """The previous release's shipped CRDs by name."""
    commit = UPGRADE_FROM.read_text().strip()
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.fail(f"the repository's history lacks commit {commit}, the previous release "
                    f"packaging/upgrade-from names: fetch it (`git fetch --unshallow` in a "
                    f"shallow clone)")
    listed = _git("ls-tree", "--name-only", f"{commit}:{CRDS}").stdout.split()
    return {crd["metadata"]["name"]: crd for crd in
            (yaml.safe_load(_git("show", f"{commit}:{CRDS}/{name}").stdout) for name in listed)}


def _current_crds() -> dict[str, dict[str, Any]]:
    return {crd["metadata"]["name"]: crd for crd in
            (yaml.safe_load(path.read_text()) for path in sorted((REPO / CRDS).glob("*.yaml")))}


PREVIOUS = _previous_crds() if UPGRADE_FROM.exists() else {}
OWNED = sorted(name for name, crd in PREVIOUS.items() if crd["spec"]["group"] == OWNED_GROUP)


def _versions(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {version["name"]: version for version in crd["spec"]["versions"]}


def test_the_previous_release_owned_crds_to_compare() -> None:
    assert OWNED == ["ipamblocks.vpc-attach.datum.net", "vpcbindings.vpc-attach.datum.net"]


@pytest.mark.parametrize("name", sorted(PREVIOUS))
def test_every_shipped_crd_still_serves_each_version_it_served(name: str) -> None:
    current = _current_crds()
    assert name in current, f"{name} is no longer shipped in {CRDS}/"
    served_before = {v for v, body in _versions(PREVIOUS[name]).items() if body["served"]}
    served_now = {v for v, body in _versions(current[name]).items() if body["served"]}
    assert served_before <= served_now
    stored_before = next(v for v, b in _versions(PREVIOUS[name]).items() if b["storage"])
    assert stored_before in served_now, "objects stored in the old version must stay readable"


@pytest.mark.parametrize("name", OWNED)
def test_what_the_previous_release_could_write_still_validates(name: str) -> None:
    """Per version: every field the old schema had is still there with the same type, and
    nothing optional before is required now (additive changes only)."""
    current = _current_crds()[name]
    for version, before in _versions(PREVIOUS[name]).items():
        after = _versions(current)[version]
        old_schema = before["schema"]["openAPIV3Schema"]
        new_schema = after["schema"]["openAPIV3Schema"]
        assert list(_narrowed(old_schema, new_schema, version)) == []


def _narrowed(old: dict[str, Any], new: dict[str, Any], where: str) -> Iterator[str]:
    """Where `new` accepts less than `old` (by type, fields and required fields)."""
    if old.get("type") != new.get("type"):
        yield f"{where}: type {old.get('type')} -> {new.get('type')}"
        return
    for field in sorted(set(new.get("required", [])) - set(old.get("required", []))):
        yield f"{where}.{field}: required now"
    for field, old_field in (old.get("properties") or {}).items():
        new_field = (new.get("properties") or {}).get(field)
        if new_field is None:
            if not new.get("x-kubernetes-preserve-unknown-fields"):
                yield f"{where}.{field}: gone (pruned from stored objects)"
            continue
        yield from _narrowed(old_field, new_field, f"{where}.{field}")
    if "items" in old and "items" in new:
        yield from _narrowed(old["items"], new["items"], f"{where}[]")


def test_a_narrowed_schema_is_caught() -> None:
    """Positive control: the comparison names a field that became required and one that
    changed type."""
    old = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "vpc": {"type": "string"}, "uses": {"type": "array", "items": {"type": "string"}}}}}}
    new = {"type": "object", "properties": {"spec": {"type": "object", "required": ["vpc"],
           "properties": {"vpc": {"type": "string"},
                          "uses": {"type": "array", "items": {"type": "integer"}}}}}}
    assert list(_narrowed(old, new, "v1")) == ["v1.spec.vpc: required now",
                                              "v1.spec.uses[]: type string -> integer"]
