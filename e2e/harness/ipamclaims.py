"""The IPAMClaim CRD as its Go module ships it, and claims read back (SPEC §16). Claims and
virt-launcher Pods made as KubeVirt makes them: `e2e.harness.kubevirt`.

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
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.kube import Kube
from e2e.harness.tools.gotools import go_binary, go_env

MODULE = "github.com/k8snetworkplumbingwg/ipamclaims"
# The version OVN-Kubernetes requires; the proxy here serves it (not @latest).
VERSION = "v0.5.1-alpha"
MODULE_SUM = "h1:RPXmPp07hm6l2/a3PSInne+6VnZeSapcFeegpDNklCs="  # `go mod download -json`'s Sum
CRD_IN_MODULE = "artifacts/k8s.cni.cncf.io_ipamclaims.yaml"
CRD_NAME = "ipamclaims.k8s.cni.cncf.io"
DOWNLOAD_TIMEOUT_S = 300.0


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


def claims_path(namespace: str, name: str = "") -> str:
    """The API path of a namespace's IPAMClaims (or one of them)."""
    path = f"/apis/k8s.cni.cncf.io/v1alpha1/namespaces/{namespace}/ipamclaims"
    return f"{path}/{name}" if name else path


def claim_status(kube: Kube, namespace: str, claim: str) -> dict[str, Any]:
    """The claim's status (empty before a first allocation); the claim must exist."""
    found = kube.get(claims_path(namespace, claim))
    assert found is not None, f"no IPAMClaim {namespace}/{claim}"
    status: dict[str, Any] = found.get("status") or {}
    return status


def allocated(status: dict[str, Any]) -> tuple[str, str, str]:
    """The IPsAllocated condition's status and reason, and the ownerPod's name."""
    condition = next(c for c in status["conditions"] if c["type"] == "IPsAllocated")
    return condition["status"], condition["reason"], status["ownerPod"]["name"]
