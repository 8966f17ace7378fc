"""A VM whose IPAMClaim follows it across galactic sites in a `scope: cluster` pool (SPEC §16):
three sites (each its Node object, ipamDataRoot and, in the agent pass, an agent started with
the node's host settings), a namespace of the test's own, the VM network (a tap as the shipped
example makes it, persistent IPs, publishing on) and the VM's claim made as ipam-extensions
makes it. `Move.move_vm` moves the VM's Pod from site to site with the collector's RIB sampled
all along; `Move.show` prints the RIB, the claim, the pool's IPAMBlocks and each site's records
at a step."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_plugin.core import naming
from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS
from cni_plugin.kube.kinds import PODS
from e2e.harness.agentproc import OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.collector import (
    describe,
    held_twice,
    rib_sampled,
    shown,
    timeline,
    wait_for_rib,
)
from e2e.harness.galactic.fabric import Fabric, running_fabric
from e2e.harness.galactic.rib import EvpnRoute
from e2e.harness.galactic.sites import ROUTE_TIMEOUT_S, GalacticSite, start_site, wait_announced
from e2e.harness.ipamclaims import allocated, claim_status, claims_path
from e2e.harness.kernel import remove_vpc_objects, run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.scene import Launcher, Scene
from e2e.harness.kubevirt.standins import claims_namespace
from e2e.harness.plugin import VIA_AGENT, Answer, base_conf, random_vpc, with_prev
from e2e.harness.publishing import advertisement, vrf_instance
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

PATH = "agent" if VIA_AGENT else "in-process"
V4_POOL, V6_POOL = "10.63.0.0/24", "fd00:63::/64"
# As the shipped tap example (examples/tap-vm.conflist) makes the VM's tap.
TAP = {"owner": 107, "group": 107, "multiQueue": True, "vnetHdr": True}
POOL_LABEL = "vpc-attach.datum.net/pool"
LENT_LABEL = "vpc-attach.datum.net/lent"
SAMPLES_AFTER_SETTLING = 20  # the collector keeps holding what it settled on


def tap_vm_network(vpc: str, att: str) -> dict[str, Any]:
    """The VM network: a tap as the shipped example makes it, persistent IPs, publishing on,
    and a cluster pool per family in each node's ipamDataRoot (no dataDir: every node's
    config is the same)."""
    return base_conf(vpc, att, name=f"vms-{vpc}", allowPersistentIPs=True, attachment="tap",
                     mtu=1400, tap=TAP, capabilities={"ips": True, "mac": True},
                     publish={"bgp": True, "endpointSlice": True},
                     ipam={"type": "vpc-attach-ipam", "scope": "cluster",
                           "ipv4_subnet": V4_POOL, "ipv6_subnet": V6_POOL})


@dataclass
class RunningVm:
    """Where the VM runs: its virt-launcher Pod whose tap is attached, on a site."""

    site: GalacticSite
    launcher: Launcher
    result: dict[str, Any]


@dataclass
class Move:
    """The sites, the VM network, the VM's claim and where the VM runs now."""

    kube: Kube
    fabric: Fabric
    vpc: str
    namespace: str
    conf: dict[str, Any]
    sites: list[GalacticSite]
    stack: contextlib.ExitStack
    claim: str = ""
    claim_uid: str = ""
    addresses: list[str] = field(default_factory=list)  # the claim's, as its first ADD answered
    vm: RunningVm | None = None
    pods: int = 0

    @property
    def att(self) -> str:
        """The VM network's attachment."""
        return str(self.conf["vpcattachment"])

    def scene(self, site: GalacticSite) -> Scene:
        """The VM network as site's plugin attaches it."""
        assert site.data_root is not None
        return Scene(self.kube, site.plugin, site.node, self.namespace, self.conf,
                     site.data_root)

    def names(self) -> dict[str, str]:
        """Each router's BGP address → `node N`."""
        return {site.address: f"node {site.index}" for site in self.sites}

    def attach(self, site: GalacticSite, claim: str | None,
               conf: dict[str, Any] | None = None) -> tuple[Answer, Launcher]:
        """A new virt-launcher Pod on site (with the claim's reference, if given) and the
        runtime's ADD of its tap."""
        self.pods += 1
        scene = self.scene(site)
        netns = self.stack.enter_context(temporary_netns("vpa-move"))
        launcher = scene.launcher(scene.pod(claim), f"ctr-{self.pods}-{site.index}", netns)
        return launcher.add(conf or self.conf), launcher

    def run_vm(self, site: GalacticSite) -> RunningVm:
        """The VM's next Pod on site, attached (ADD must succeed, answered by the site's own
        agent in the agent pass)."""
        before = site.served("ADD")
        answer, launcher = self.attach(site, self.claim)
        assert answer.status == 0, f"ADD of the VM's Pod on {site.label()} failed: " \
            f"{answer.stdout} {answer.stderr}"
        assert site.agent is None or site.served("ADD") == before + 1, \
            f"{site.label()}'s own agent did not answer the ADD"
        self.vm = RunningVm(site, launcher, answer.body)
        return self.vm

    def detach(self, launcher: Launcher, conf: dict[str, Any], result: dict[str, Any]) -> None:
        """The runtime's DEL of a Pod's tap, then its Pod object deleted."""
        launcher.ok("DEL", with_prev(conf, result))
        self.kube.delete(PODS.path(self.namespace, launcher.pod), grace_period_seconds=0)

    def stop_vm(self) -> None:
        """The VM's Pod goes: DEL of its tap on its node."""
        if self.vm is not None:
            vm, self.vm = self.vm, None
            self.detach(vm.launcher, self.conf, vm.result)

    def prefixes(self) -> set[str]:
        """What a node announces for the VM: each of the claim's addresses as its prefix."""
        return {str(ipaddress.ip_interface(address).network) for address in self.addresses}

    def expected(self, site: GalacticSite | None) -> list[EvpnRoute]:
        """The collector's exact RIB when site's router alone announces the VM (none: empty)."""
        if site is None:
            return []
        instance = vrf_instance(self.kube, naming.vrf_instance_name(self.vpc, site.name))
        assert instance is not None, f"no VRF instance of {site.label()}"
        return site.expected_routes(self.vpc, int(instance["spec"]["vrfID"]), self.prefixes())

    def settle(self, step: str, site: GalacticSite | None) -> list[EvpnRoute]:
        """Wait until the collector holds the VM's prefixes once, from site's router only
        (nothing when site is None); print the RIB and return it."""
        rib = wait_for_rib(self.fabric, step, self.expected(site))
        self.show(step, rib)
        return rib

    def move_vm(self, to: GalacticSite, step: str) -> None:
        """The VM's Pod deleted where it runs (DEL) and its next Pod attached on ``to``, with
        the claim's addresses; the collector's RIB sampled all along, printed as a timeline,
        and held by the old node, then nobody, then ``to``: never both, no prefix twice, and
        unchanged for SAMPLES_AFTER_SETTLING samples once settled."""
        assert self.vm is not None, "the VM runs nowhere"
        source = self.vm.site
        prefixes, names = self.prefixes(), self.names()
        with rib_sampled(self.fabric) as samples:
            self.stop_vm()
            self.settle(f"{step}a: the VM's Pod on node {source.index} deleted", None)
            assert self.host_routes(source) == set()
            vm = self.run_vm(to)
            assert sorted(ip["address"] for ip in vm.result["ips"]) == self.addresses
            wait_announced(self.kube, self.fabric, to, self.vpc, self.att, prefixes)
            rib = self.settle(f"{step}b: the VM's next Pod on node {to.index}", to)
            settled = wait_more_samples(samples)
        runs = timeline(samples, prefixes, names)
        print(f"[{PATH}] collector RIB at step {step} while the VM moved from node "
              f"{source.index} to node {to.index}, {len(samples)} samples: {shown(runs)}")
        assert all(len(state) == 1 for state, _ in runs), f"both routers at once: {shown(runs)}"
        assert not [held_twice(rib, prefixes) for rib in samples if held_twice(rib, prefixes)]
        assert [state[0] for state, _ in runs] == \
            [f"node {source.index}", "none", f"node {to.index}"], shown(runs)
        assert all(later == rib for later in samples[settled:]), "the settled RIB moved"
        status = claim_status(self.kube, self.namespace, self.claim)
        assert sorted(status["ips"]) == self.addresses
        assert allocated(status) == ("True", "SuccessfulAllocation", vm.launcher.pod)
        assert self.host_routes(to) == set(self.addresses)
        assert advertisement(self.kube, naming.advertisement_name(self.vpc, self.att,
                                                                  source.name)) is None
        adv = advertisement(self.kube, naming.advertisement_name(self.vpc, self.att, to.name))
        assert adv is not None and set(adv["spec"]["prefixes"]) == prefixes

    def show(self, step: str, rib: list[EvpnRoute]) -> None:
        """The RIB, the claim's status and the network's IPAMBlocks, one line each."""
        names = {s.address: s.label() for s in self.sites}
        print(f"\n[{PATH}] collector RIB step {step}: {len(rib)} routes")
        for route in rib:
            print(f"[{PATH}] collector RIB step {step}: {describe(route, names)}")
        found = self.kube.get(claims_path(self.namespace, self.claim))
        status = (found or {}).get("status") or {}
        print(f"[{PATH}] IPAMClaim step {step}: {self.namespace}/{self.claim}: "
              + (f"ips {status.get('ips')} ownerPod {(status.get('ownerPod') or {}).get('name')}"
                 if found is not None else "deleted"))
        for block in self.blocks():
            spec, labels = block["spec"], block["metadata"].get("labels") or {}
            lent = f" lentFrom {spec.get('lentFrom')} claim {spec.get('claim')}" \
                if labels.get(LENT_LABEL) == "true" else ""
            print(f"[{PATH}] IPAMBlock step {step}: {block['metadata']['name']} "
                  f"{spec['cidr']} node {self.node_label(spec['node'])}{lent}")
        for site in self.sites:
            print(f"[{PATH}] node records step {step}: node {site.index}: the claim's "
                  f"{sorted(self.scene(site).files().claims())}, lends {lend_records(site)}")

    def node_label(self, name: str) -> str:
        """`1 (worker-…)`, or the name of a node not ours."""
        site = next((s for s in self.sites if s.name == name), None)
        return f"{site.index} ({name})" if site is not None else name

    def blocks(self) -> list[dict[str, Any]]:
        """The VM network's IPAMBlocks, whichever node holds them, lend objects included."""
        found = self.kube.list(IPAM_BLOCKS.path(), fields=f"spec.network={self.conf['name']}")
        return sorted(found, key=lambda block: str(block["metadata"]["name"]))

    def lends(self) -> list[dict[str, Any]]:
        """The network's lend objects."""
        return [block for block in self.blocks()
                if (block["metadata"].get("labels") or {}).get(LENT_LABEL) == "true"]

    def lend_uids(self) -> dict[str, str]:
        """The network's lend objects' uids, by name."""
        return {block["metadata"]["name"]: str(block["metadata"]["uid"])
                for block in self.lends()}

    def lend_expected(self, holder: dict[str, Any], address: str,
                      borrower: GalacticSite) -> tuple[str, dict[str, Any]]:
        """The name and spec of the lend object of address (held in holder) to borrower:
        `<pool hash>-v4-<hex of the address>-32-lent` (v6: 32 hex digits and the allocation's
        prefix length)."""
        allocation = ipaddress.ip_interface(address).network
        width = 8 if allocation.version == 4 else 32
        digest = holder["metadata"]["labels"][POOL_LABEL]
        name = f"{digest}-v{allocation.version}-{int(allocation.network_address):0{width}x}-" \
            f"{allocation.prefixlen}-lent"
        spec = {"network": self.conf["name"], "subnet": holder["spec"]["subnet"],
                "allocationPrefixLength": holder["spec"]["allocationPrefixLength"],
                "cidr": str(allocation), "node": borrower.name,
                "lentFrom": holder["metadata"]["name"],
                "claim": f"{self.namespace}/{self.claim}", "claimUID": self.claim_uid}
        return name, spec

    def holding_block(self, address: str) -> dict[str, Any]:
        """The IPAMBlock (not a lend object) whose cidr holds address."""
        host = ipaddress.ip_interface(address).ip
        found = [block for block in self.blocks()
                 if (block["metadata"].get("labels") or {}).get(LENT_LABEL) != "true"
                 and host in ipaddress.ip_network(block["spec"]["cidr"])]
        assert len(found) == 1, f"blocks holding {address}: {found}"
        return found[0]

    def host_routes(self, site: GalacticSite) -> set[str]:
        """The claim's addresses the VM's tap on site has a route to (the address, or its
        allocation's prefix), in any table."""
        tap = naming.host_link_name(self.vpc, self.att)
        routes = [line.split() for family in ("-4", "-6")
                  for line in run_ip("-n", site.netns, family, "route", "show", "table",
                                     "all").splitlines()]
        return {address for address in self.addresses
                if any(len(words) >= 3 and words[1:3] == ["dev", tap]
                       and words[0] in _targets(address) for words in routes)}


def wait_more_samples(samples: list[list[EvpnRoute]]) -> int:
    """The sampler runs on its own thread: let it take SAMPLES_AFTER_SETTLING more samples
    of a settled RIB; the index of the first of them."""
    settled = len(samples)
    wait_until(f"{SAMPLES_AFTER_SETTLING} samples of the settled RIB",
               lambda: len(samples) >= settled + SAMPLES_AFTER_SETTLING, ROUTE_TIMEOUT_S)
    return settled


def lend_records(site: GalacticSite) -> list[str]:
    """The lends a node's pool states record (`blocks/<name>-lent` under its ipamDataRoot)."""
    assert site.data_root is not None
    return sorted(path.name for path in site.data_root.rglob("blocks/*-lent"))


def _targets(address: str) -> set[str]:
    """How `ip route` prints a route to address: the host, or the allocation's prefix."""
    allocation = ipaddress.ip_interface(address)
    return {str(allocation.ip), str(allocation.network)}


@contextlib.contextmanager
def moving_vm(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
              galactic: GalacticBuild, directory: Path, att: str) -> Iterator[Move]:
    """The collector, three sites, a namespace of the test's own, the VM network and the VM's
    claim. Afterwards the VM's Pod, if a test left one attached, is deleted (its DEL must
    succeed), then everything else."""
    vpc = random_vpc()
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, [vpc])
        stack.enter_context(bound(kube, vpc))
        namespace = stack.enter_context(claims_namespace(kube))
        fabric = stack.enter_context(running_fabric(galactic, directory, nodes=3))
        sites = [start_site(stack, fabric, index, kube, cluster, cni_bin, own_agents, directory,
                            register_node=True, ipam_data_root=True,
                            agent_with_host_settings=True) for index in (1, 2, 3)]
        moving = Move(kube, fabric, vpc, namespace, tap_vm_network(vpc, att), sites, stack)
        moving.claim = moving.scene(sites[0]).claim()
        stored = kube.get(claims_path(namespace, moving.claim))
        assert stored is not None
        moving.claim_uid = str(stored["metadata"]["uid"])
        yield moving
        moving.stop_vm()
