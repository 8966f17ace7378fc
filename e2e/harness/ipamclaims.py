"""The IPAMClaim CRD as its Go module ships it, and claims made as kubevirt's ipam-extensions
makes them (SPEC §16).

The CRD is `artifacts/k8s.cni.cncf.io_ipamclaims.yaml` of the Go module
github.com/k8snetworkplumbingwg/ipamclaims, fetched from the Go module proxy by `go mod
download` into Go's module cache, as the CRI API's proto is (`e2e/harness/cri/protos.py`); the
module's checksum is pinned here and compared with the one go checked against the checksum
database. vpc-attach does not ship the CRD (packaging/): whoever runs KubeVirt's persistent IPs
installs it. Every control plane `e2e.harness.cluster` starts has it.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.kube import Kube
from e2e.harness.tenancy import namespace as fresh_namespace
from e2e.harness.tools.gotools import go_binary, go_env

MODULE = "github.com/k8snetworkplumbingwg/ipamclaims"
# The version OVN-Kubernetes requires; the proxy here serves it (not @latest).
VERSION = "v0.5.1-alpha"
MODULE_SUM = "h1:RPXmPp07hm6l2/a3PSInne+6VnZeSapcFeegpDNklCs="  # `go mod download -json`'s Sum
CRD_IN_MODULE = "artifacts/k8s.cni.cncf.io_ipamclaims.yaml"
CRD_NAME = "ipamclaims.k8s.cni.cncf.io"
DOWNLOAD_TIMEOUT_S = 300.0
# What kubevirt/ipam-extensions puts on the claims it makes (pkg/claims, vmi_controller.go).
KUBEVIRT_FINALIZER = "kubevirt.io/persistent-ipam"
KUBEVIRT_VM_LABEL = "kubevirt.io/vm"
_CLAIM_NAME_PART = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CLAIM_NAME_MAX = 253


class ModuleError(RuntimeError):
    """The module could not be fetched, or is not the one pinned here."""


@functools.cache
def module_dir() -> Path:
    """The module's directory in Go's module cache (downloaded if missing; offline after)."""
    with tempfile.TemporaryDirectory(prefix="vpa-ipamclaims-") as scratch:
        command = [go_binary(), "mod", "download", "-json", f"{MODULE}@{VERSION}"]
        try:
            done = subprocess.run(command, cwd=scratch, env=go_env(Path(scratch)),
                                  capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModuleError(f"{' '.join(command)}: {exc}") from None
    try:
        info: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        raise ModuleError(f"{' '.join(command)}: exit status {done.returncode}: "
                          f"{done.stderr.strip()}") from None
    if info.get("Error"):
        raise ModuleError(f"{' '.join(command)}: {info['Error']}")
    if info.get("Sum") != MODULE_SUM:
        raise ModuleError(f"{MODULE}@{VERSION}: checksum {info.get('Sum')}, pinned {MODULE_SUM}")
    return Path(info["Dir"])


def ipamclaim_crd() -> dict[str, Any]:
    """The module's IPAMClaim CustomResourceDefinition, as it ships it."""
    crd: dict[str, Any] = yaml.safe_load((module_dir() / CRD_IN_MODULE).read_text())
    return crd


def kubevirt_claim_name(vm: str, network: str) -> str:
    """`<vm>.<network>` as ipam-extensions' `claims.ComposeKey` makes it: lower case, the
    DNS-label runs joined by dots, at most 253 characters."""
    runs = [match.group(0) for match in _CLAIM_NAME_PART.finditer(f"{vm}.{network}".lower())]
    return ".".join(runs)[:_CLAIM_NAME_MAX]


def kubevirt_claim(namespace: str, vm: str, vm_uid: str, network: str,
                   network_config: str) -> dict[str, Any]:
    """The IPAMClaim ipam-extensions' VMI controller creates for a VM network whose network
    config allows persistent IPs: owned by the VM, its finalizer, the VM label, `spec.network`
    the config's `name` and `spec.interface` empty (its Go struct writes the empty string)."""
    return {
        "apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
        "metadata": {
            "name": kubevirt_claim_name(vm, network), "namespace": namespace,
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                 "name": vm, "uid": vm_uid, "controller": True,
                                 "blockOwnerDeletion": True}],
            "finalizers": [KUBEVIRT_FINALIZER],
            "labels": {KUBEVIRT_VM_LABEL: vm},
        },
        "spec": {"network": network_config, "interface": ""},
    }


def claims_path(namespace: str, name: str = "") -> str:
    """The API path of a namespace's IPAMClaims (or one of them)."""
    path = f"/apis/k8s.cni.cncf.io/v1alpha1/namespaces/{namespace}/ipamclaims"
    return f"{path}/{name}" if name else path


@contextmanager
def claims_namespace(kube: Kube) -> Iterator[str]:
    """A namespace of the test's own; the claims in it lose kubevirt's finalizer first (as
    ipam-extensions' cleanup does once the VM is gone), so the namespace can go."""
    with fresh_namespace(kube) as name:
        yield name
        for claim in kube.list(claims_path(name)):
            kube.request("PATCH", claims_path(name, claim["metadata"]["name"]),
                         {"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")
