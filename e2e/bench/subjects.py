"""What is measured: a plugin executable with its stanza and the environment a runtime gives it.

Every subject attaches IPv4 only (198.18.0.0/15, the range RFC 2544 reserves for benchmarks),
one /24 per subject: with an IPv6 address the reference `ptp` waits ~2 s for duplicate
address detection on every ADD, which would measure DAD rather than the plugin.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CNI_VERSION = "1.1.0"
GO, IN_PROCESS, AGENT = "Go", "in-process", "agent"
# The persistent-IP rows' Pods: the claim's later Pod (its addresses adopted), a new claim's
# first Pod (allocated), a Pod whose network-selection element names no claim.
ADOPT, FIRST, NO_CLAIM = "adopt", "first", "none"
KERNEL_ONLY = {"bgp": False, "endpointSlice": False}
PUBLISH_IPV4 = {"bgp": True, "endpointSlice": True, "endpointSliceFamilies": ["IPv4"]}


@dataclass
class Subject:
    """One plugin configuration, run through one path."""

    key: str  # lowercase, a valid prefix of Pod names
    label: str
    path: str  # GO, IN_PROCESS or AGENT
    executable: Path
    stanza: Callable[[str], dict[str, Any]]  # attachment id -> network config
    environ: dict[str, str] = field(default_factory=dict)
    vpc: str | None = None
    publishes: bool = False
    cluster: str | None = None  # which control plane its Pods live in
    skipped: str | None = None  # why it is not measured in this run
    ifname: str = "eth0"
    claims: str | None = None  # ADOPT, FIRST or NO_CLAIM: a persistent-IP row's Pods
    claim_ips: list[str] | None = None  # ADOPT: what every ADD must get (the claim's)

    @property
    def has_pods(self) -> bool:
        """Whether its invocations name Pod objects of its control plane (K8S_POD_UID)."""
        return self.cluster is not None and (self.publishes or self.claims is not None)

    def env(self, command: str, container_id: str, netns: str, cni_args: str) -> dict[str, str]:
        """The environment of one invocation, as a runtime builds it."""
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
                "CNI_IFNAME": self.ifname, "CNI_PATH": str(self.executable.parent),
                "CNI_ARGS": cni_args, **self.environ}


def subnet(index: int) -> str:
    """The IPv4 /24 of the index-th subject."""
    return f"198.18.{index}.0/24"


def host_local(data_dir: Path, index: int) -> dict[str, Any]:
    """host-local IPAM over the subject's /24."""
    return {"type": "host-local", "dataDir": str(data_dir),
            "ranges": [[{"subnet": subnet(index)}]]}


def ptp_stanza(data_dir: Path, index: int) -> Callable[[str], dict[str, Any]]:
    """The Go reference: ptp + host-local with a default route, no masquerading."""
    ipam = {**host_local(data_dir, index), "routes": [{"dst": "0.0.0.0/0"}]}
    return lambda _att: {"cniVersion": CNI_VERSION, "name": "bench-ptp", "type": "ptp",
                         "ipMasq": False, "ipam": ipam}


def vpc_attach_stanza(vpc: str, ipam: dict[str, Any], publish: dict[str, Any],
                      persistent_ips: bool = False) -> Callable[[str], dict[str, Any]]:
    """vpc-attach, veth, `isolation: table`, with the given IPAM and publishing (and
    `allowPersistentIPs`, SPEC §16, when persistent_ips)."""
    extra = {"allowPersistentIPs": True} if persistent_ips else {}
    return lambda att: {"cniVersion": CNI_VERSION, "name": network_name(vpc),
                        "type": "vpc-attach", "vpc": vpc, "vpcattachment": att,
                        "isolation": "table", "publish": publish, "ipam": ipam, **extra}


def network_name(vpc: str) -> str:
    """The network config's `name` (an IPAMClaim's `spec.network` names it)."""
    return f"bench-{vpc}"


def vpc_attach_ipam(data_dir: Path, index: int, cluster_scope: bool = False) -> dict[str, Any]:
    """Our IPAM plugin with an IPv4 pool over the subject's /24 (shared by nodes through
    IPAMBlocks with cluster_scope)."""
    scope = {"scope": "cluster"} if cluster_scope else {}
    return {"type": "vpc-attach-ipam", "dataDir": str(data_dir), "ipv4_subnet": subnet(index),
            **scope}


def version_stanza() -> dict[str, Any]:
    """What a runtime sends with VERSION (ignored by the plugin)."""
    return {"cniVersion": CNI_VERSION}
