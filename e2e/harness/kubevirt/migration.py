"""Live migrations between two galactic sites (SPEC §16): a gobgpd collector peered with both
sites' routers, a VPC and a namespace for the VMs' claims and virt-launcher Pods, each site
its own `scope: node` pool of vpc-attach-ipam (the claim's addresses are then requested exactly
on the target) and its own ipamDataRoot. KubeVirt does not run here: the claims, the Pods and
the ready timestamp are written on its behalf (`e2e.harness.kubevirt.standins`)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni_plugin.core import naming
from cni_plugin.kubevirt.migration import RECORDS_DIR
from cni_plugin.publish.endpointslice import slice_name
from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import Fabric, running_fabric
from e2e.harness.galactic.sites import ROUTE_TIMEOUT_S, GalacticSite, start_site
from e2e.harness.kernel import remove_vpc_objects, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.standins import (
    IFNAME,
    claims_namespace,
    kubevirt_creates_claim,
    kubevirt_starts_launcher,
)
from e2e.harness.plugin import Answer, base_conf, random_vpc, with_prev
from e2e.harness.publishing import advertisement, endpoint_slice
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

FAMILIES = ("IPv6", "IPv4")
# As the shipped tap example (examples/tap-vm.conflist) makes the VM's tap.
TAP = {"owner": 107, "group": 107, "multiQueue": True, "vnetHdr": True}


@dataclass
class Migration:
    """The collector, two sites, a VPC and a namespace for the VMs' claims and Pods."""

    kube: Kube
    fabric: Fabric
    sites: list[GalacticSite]
    vpc: str
    namespace: str

    def conf(self, site: GalacticSite, att: str) -> dict[str, Any]:
        """The VM network on ``site``: the VM's tap as the shipped example makes it,
        allowPersistentIPs, publishing BGP and both slices, a node-scope pool in the site's
        own data directory."""
        assert site.data_root is not None
        ipam = {"type": "vpc-attach-ipam", "dataDir": str(site.data_root / "pool"),
                "ipv6_subnet": "fd00:65::/64", "ipv4_subnet": "10.65.0.0/24"}
        return base_conf(self.vpc, att, name=f"vms-{self.vpc}", allowPersistentIPs=True,
                         attachment="tap", mtu=1400, tap=TAP, ipam=ipam,
                         publish={"bgp": True, "endpointSlice": True,
                                  "endpointSliceFamilies": list(FAMILIES)})

    def new_vm(self) -> tuple[str, str]:
        """A fresh VM's name and the claim ipam-extensions creates for its network."""
        vm = f"vm-{secrets.token_hex(3)}"
        made = kubevirt_creates_claim(self.kube, self.namespace, f"vms-{self.vpc}", vm)
        return vm, str(made["metadata"]["name"])

    def routes(self, prefixes: set[str]) -> list[tuple[str, str]]:
        """The collector's (prefix, router) paths of these prefixes, sorted."""
        return sorted((r.prefix, r.router) for r in self.fabric.rib() if r.prefix in prefixes)

    def held_by(self, site: GalacticSite, prefixes: set[str]) -> list[tuple[str, str]]:
        """Each prefix once, from site's router."""
        return sorted((prefix, site.address) for prefix in prefixes)

    def wait_held_by(self, site: GalacticSite, prefixes: set[str],
                     interval: float = 0.1) -> None:
        """Until the collector holds the prefixes once each, from ``site``'s router only."""
        wait_until(f"the collector to hold {sorted(prefixes)} from {site.label()} only",
                   lambda: self.routes(prefixes) == self.held_by(site, prefixes),
                   ROUTE_TIMEOUT_S, interval=interval, alive=self.fabric.alive,
                   detail=lambda: str(self.routes(prefixes)))

    def advertised(self, site: GalacticSite, att: str) -> set[str]:
        """What site's advertisement of the attachment advertises (none when it has none)."""
        found = advertisement(self.kube, naming.advertisement_name(self.vpc, att, site.name))
        return set((found or {}).get("spec", {}).get("prefixes") or [])

    def announced_from(self, source: VmPod) -> set[str]:
        """The VM's prefixes once the source's ADD is announced: the collector holds them
        once, from the source's site."""
        prefixes = self.advertised(source.site, source.att)
        assert len(prefixes) == 2, prefixes  # the claim's IPv6 and IPv4 address
        self.wait_held_by(source.site, prefixes)
        return prefixes


@contextlib.contextmanager
def migration(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
              galactic: GalacticBuild, directory: Path) -> Iterator[Migration]:
    """Two sites (each its own ipamDataRoot: its notes of the claims it holds are its own)
    and a namespace for the claims; everything goes afterwards."""
    vpc = random_vpc()
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, [vpc])
        stack.enter_context(bound(kube, vpc))
        fabric = stack.enter_context(running_fabric(galactic, directory, nodes=2))
        sites = [start_site(stack, fabric, index, kube, cluster, cni_bin, own_agents, directory,
                            ipam_data_root=True) for index in (1, 2)]
        namespace = stack.enter_context(claims_namespace(kube))
        yield Migration(kube, fabric, sites, vpc, namespace)


@dataclass
class VmPod:
    """A virt-launcher Pod of the VM on a site, and its container's ADD and DEL."""

    migration: Migration
    site: GalacticSite
    att: str
    name: str
    uid: str
    netns: str
    result: dict[str, Any] | None = None

    @property
    def container(self) -> str:
        """Its sandbox's container ID."""
        return f"ctr-{self.name}"

    def conf(self) -> dict[str, Any]:
        """The VM network as its site attaches it."""
        return self.migration.conf(self.site, self.att)

    def call(self, verb: str, conf: dict[str, Any]) -> Answer:
        """One verb of its element (net1), whatever it answers."""
        return self.site.plugin.call(
            verb, conf, container_id=self.container, netns=self.netns, ifname=IFNAME,
            CNI_ARGS=self.site.node.cni_args(self.name, self.uid, self.migration.namespace))

    def add(self) -> Answer:
        """The runtime's ADD; its result kept when it succeeded."""
        answer = self.call("ADD", self.conf())
        if answer.status == 0:
            self.result = answer.body
        return answer

    def delete(self) -> None:
        """The runtime's DEL (with the ADD's result when there was one); must succeed."""
        conf = self.conf()
        answer = self.call("DEL", with_prev(conf, self.result) if self.result else conf)
        assert answer.status == 0, answer.stdout
        self.result = None

    def slices(self) -> list[dict[str, Any] | None]:
        """Its EndpointSlices, IPv6 then IPv4 (None: absent)."""
        return [endpoint_slice(self.migration.kube,
                               slice_name(self.name, self.migration.vpc, self.att, family),
                               self.migration.namespace) for family in FAMILIES]

    def slices_ready(self) -> list[bool]:
        """Whether each of its slices says its endpoint is ready."""
        return [bool(s["endpoints"][0]["conditions"]["ready"]) for s in self.slices() if s]


@contextlib.contextmanager
def vm_pod(migration: Migration, site: GalacticSite, att: str, claim: str,
           vm: str) -> Iterator[VmPod]:
    """A virt-launcher Pod of ``vm`` on ``site`` with a netns for its sandbox; DEL (if it was
    added and not deleted yet) and the Pod's deletion afterwards."""
    name, uid = kubevirt_starts_launcher(migration.kube, migration.namespace, site.name, claim,
                                         vm)
    with temporary_netns("vpa-mig") as netns:
        pod = VmPod(migration, site, att, name, uid, netns)
        try:
            yield pod
        finally:
            if pod.result is not None:
                pod.delete()
            migration.kube.delete(f"/api/v1/namespaces/{migration.namespace}/pods/{name}")


def pending_records(site: GalacticSite) -> list[str]:
    """The migration targets recorded on site, waiting for the ready timestamp."""
    directory = site.plugin.lock_dir / RECORDS_DIR
    return sorted(p.name for p in directory.glob("*.json")) if directory.exists() else []
