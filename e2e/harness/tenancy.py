"""VPCBindings for tests (SPEC §14), written with the admin client and removed exactly."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cni_plugin.kube.kinds import BINDINGS, NAMESPACES
from e2e.harness.kube import Kube
from e2e.harness.wait import wait_until

ALL_USES = ("veth", "tap", "existing")


def binding_body(name: str, vpc: str, attachments: list[str] | None = None,
                 selector: dict[str, Any] | None = None,
                 uses: tuple[str, ...] = ALL_USES) -> dict[str, Any]:
    """A VPCBinding object (every attachment and namespace unless narrowed)."""
    return {"apiVersion": "vpc-attach.datum.net/v1alpha1", "kind": "VPCBinding",
            "metadata": {"name": name},
            "spec": {"vpc": vpc, "attachments": attachments or ["*"],
                     "namespaceSelector": {} if selector is None else selector,
                     "allowedUses": list(uses)}}


def create_binding(kube: Kube, vpc: str, name: str | None = None, **spec: Any) -> str:
    """Create a VPCBinding; its name."""
    name = name or f"e2e-{vpc.lower()}-{secrets.token_hex(3)}"
    kube.create(BINDINGS.path(), binding_body(name, vpc, **spec))
    return name


def delete_binding(kube: Kube, name: str) -> None:
    """Delete a VPCBinding and wait until it is gone."""
    kube.delete(BINDINGS.path(name=name))
    wait_until(f"VPCBinding {name} deleted", lambda: kube.get(BINDINGS.path(name=name)) is None)


@contextmanager
def bound(kube: Kube, vpc: str, **spec: Any) -> Iterator[str]:
    """A VPCBinding for the block: by default every namespace may use every attachment of vpc
    in every way (what the tests that are not about tenancy need)."""
    name = create_binding(kube, vpc, **spec)
    try:
        yield name
    finally:
        delete_binding(kube, name)


@contextmanager
def namespace(kube: Kube, labels: dict[str, str] | None = None) -> Iterator[str]:
    """A fresh namespace with labels for the block (deleted after it, not waited for)."""
    name = f"tenant-{secrets.token_hex(3)}"
    kube.create(NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": name, "labels": labels or {}}})
    wait_until(f"the default ServiceAccount of {name}", lambda: kube.get(
        f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None, 60)
    try:
        yield name
    finally:
        kube.delete(NAMESPACES.path(name=name))
