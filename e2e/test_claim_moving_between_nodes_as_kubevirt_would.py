"""A VM's IPAMClaim follows it from node to node in a `scope: cluster` pool (SPEC §16; issue 32
item 3), on three simulated nodes each running galactic-router, with a gobgpd collector
peered with all of them. kubevirt does not run here: the test makes the claim and the
virt-launcher Pods on its behalf, as ipam-extensions and its webhook leave them
(`e2e/harness/ipamclaims.py`), and runs ADD and DEL of the VM's tap attachment as the runtime
would.

The VM's first Pod, on node 1, gets the claim's addresses from a block node 1 holds, announced
by node 1's router only. Moved to node 2 (DEL on node 1, ADD of its next Pod there) it keeps
them: node 2 borrows them (one IPAMBlock lend object per address, naming node 2 and node 1's
block), installs their host routes, and its router alone announces them: no sample of the
collector's RIB holds a prefix from two routers. Node 1 refuses the address to a Pod without
the claim (102 naming the claim); `vpc-attach doctor` on each node names the claim and the
lend from its side. Moved on to node 3, node 3 takes the lends over; back on
node 1 the VM needs none (node 1 deletes them); out on node 2 again it borrows again; live
migrated from node 2 to node 3 (the target's Pod and KubeVirt's ready timestamp written on its
behalf), node 3 takes the lends over at the target's ADD and the routes at the timestamp. The
claim deleted, the lend objects go and node 1 hands the address out again. The tests share
one deployment (the module's `move`) and run in file order; each prints the collector's RIB,
the claim's status, the pool's IPAMBlocks and each node's records at its step."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS
from cni_plugin.publish.resources import PODS, ROUTERS
from e2e.harness.agentproc import AgentProcess, OwnAgents
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.fabric import (
    Fabric,
    create_peer,
    is_true,
    running_fabric,
)
from e2e.harness.galactic.rib import EvpnRoute
from e2e.harness.ipamclaims import (
    Launcher,
    Scene,
    allocated,
    claim_status,
    claims_namespace,
    claims_path,
    kubevirt_deletes_claim,
    kubevirt_marks_target_ready,
)
from e2e.harness.kernel import remove_vpc_objects, run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.nodes import NODES, api_port, in_node, node_namespace
from e2e.harness.plugin import VIA_AGENT, Answer, Plugin, base_conf, random_vpc, with_prev
from e2e.harness.publishing import BGP_NS, advertisement, make_node, vrf_instance
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until
from e2e.test_galactic_nodes import describe, owners
from e2e.test_galactic_router import (
    LOCATOR,
    ROUTE_TIMEOUT_S,
    GalacticNode,
    expected_routes,
    router_id,
    wait_announced,
)

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
ATT = "63"
DOCTOR_TIMEOUT_S = 60.0
INTRUDER_ATT = "64"  # a Pod without the claim, on the VM's network: a tap of its own
V4_POOL, V6_POOL = "10.63.0.0/24", "fd00:63::/64"
# As the shipped tap example (examples/tap-vm.conflist) makes the VM's tap.
TAP = {"owner": 107, "group": 107, "multiQueue": True, "vnetHdr": True}
POOL_LABEL = "vpc-attach.datum.net/pool"
LENT_LABEL = "vpc-attach.datum.net/lent"
FREED_WITHIN_S = 30.0  # the agent's watch (at once) or GC frees a deleted claim's addresses
SAMPLE_EVERY_S = 0.05
SAMPLES_AFTER_SETTLING = 20  # the collector keeps holding what it settled on
PATH = "agent" if VIA_AGENT else "in-process"


def tap_vm_network(vpc: str) -> dict[str, Any]:
    """The VM network: a tap as the shipped example makes it, persistent IPs, publishing on,
    and a cluster pool per family in each node's ipamDataRoot (no dataDir: every node's
    config is the same)."""
    return base_conf(vpc, ATT, name=f"vms-{vpc}", allowPersistentIPs=True, attachment="tap",
                     mtu=1400, tap=TAP, capabilities={"ips": True, "mac": True},
                     publish={"bgp": True, "endpointSlice": True},
                     ipam={"type": "vpc-attach-ipam", "scope": "cluster",
                           "ipv4_subnet": V4_POOL, "ipv6_subnet": V6_POOL})


# A node of the deployment ---------------------------------------------------------------------

@dataclass
class Site:
    """A node: galactic-router, the plugin with the node's name, lock dir and ipamDataRoot
    (through an agent of its own in the agent pass), its Node object, and the VM network as
    this node's plugin attaches it."""

    gnode: GalacticNode
    scene: Scene
    uid: str  # its Node object's
    agent: AgentProcess | None  # its own, in the agent pass

    def served(self, verb: str) -> int:
        """How many of verb its agent answered (0 in-process: there is none)."""
        if self.agent is None:
            return 0
        return sum(1 for line in self.agent.verb_lines() if line.get("verb") == verb)

    @property
    def index(self) -> int:
        """Its number (1-based), as the fabric and its router know it."""
        return self.gnode.index

    @property
    def name(self) -> str:
        """Its node name."""
        return self.gnode.node.name

    @property
    def netns(self) -> str:
        """The namespace acting as its host."""
        return self.gnode.node.plugin.prefix[-1]

    def label(self) -> str:
        """`node 1 worker-…`."""
        return f"node {self.index} {self.name}"


def start_site(stack: contextlib.ExitStack, fabric: Fabric, index: int, kube: Kube,
               cluster: Any, cni_bin: Path, own_agents: OwnAgents, directory: Path,
               namespace: str, conf: dict[str, Any]) -> Site:
    """Node ``index`` as test_galactic_router starts one (netns linked to the fabric, BGPRouter,
    BGPPeer to the collector, galactic-router), plus its Node object (IPAMBlocks are owned by
    it) and its own ipamDataRoot; in the agent pass its agent starts with the node's settings,
    so its IPAMClaim watch frees on this node."""
    netns = stack.enter_context(node_namespace(api_port(cluster.server)))
    address = fabric.link(index, netns)
    locks, data_root = directory / f"locks-{index}", directory / f"ipam-{index}"
    locks.mkdir()
    data_root.mkdir()
    plugin = Plugin(cni_bin, locks, prefix=in_node(netns))
    plugin.environ["VPC_ATTACH_IPAM_DATA_ROOT"] = str(data_root)
    node = make_node(kube, cluster, plugin, locator=LOCATOR, node_id=index,
                     router_id=router_id(index))
    created = kube.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": node.name}})
    stack.callback(kube.delete, f"{NODES}/{node.name}")  # its IPAMBlocks and BGP objects go too
    agent = None
    if VIA_AGENT:
        agent_dir = directory / f"agent-{index}"
        agent_dir.mkdir()
        env = {**plugin.environ, "VPC_ATTACH_LOCK_DIR": str(locks),
               "VPC_ATTACH_HOST_CONFIG": str(locks / "absent-host.json")}
        agent = own_agents.enter(stack, agent_dir, prefix=in_node(netns), env=env)
        plugin.agent_socket = str(agent.socket)
    peer = create_peer(kube, BGP_NS, node.router, index)
    stack.callback(kube.delete, peer)
    stack.callback(fabric.start_router(index, netns, node.name, cluster.admin_kubeconfig).stop)
    wait_until(f"BGPRouter {node.router} Ready",
               is_true(lambda: kube.get(ROUTERS.path(BGP_NS, node.router)), "Ready"),
               ROUTE_TIMEOUT_S, alive=fabric.alive)
    wait_until(f"{node.router}'s session with the collector",
               lambda: address in fabric.established(), ROUTE_TIMEOUT_S, alive=fabric.alive)
    return Site(GalacticNode(index, node, address, peer),
                Scene(kube, plugin, node, namespace, conf, data_root),
                str(created["metadata"]["uid"]), agent)


# The RIB, sampled ------------------------------------------------------------------------------

@contextlib.contextmanager
def rib_sampled(fabric: Fabric) -> Iterator[list[list[EvpnRoute]]]:
    """Every RIB the collector held while the block ran, in order (sampled in a thread)."""
    samples = [fabric.rib()]  # taken before the block's first step
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(fabric.rib())
            stop.wait(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, name="rib sampler", daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join(30)


def announcers(rib: list[EvpnRoute], prefixes: set[str],
               names: dict[str, str]) -> tuple[str, ...]:
    """The nodes whose routers announce any of the prefixes in one RIB ('none' if none)."""
    found = {names.get(route.router, route.router) for route in rib if route.prefix in prefixes}
    return tuple(sorted(found)) or ("none",)


def held_twice(rib: list[EvpnRoute], prefixes: set[str]) -> list[str]:
    """The prefixes one RIB holds more than once."""
    held = [route.prefix for route in rib if route.prefix in prefixes]
    return sorted({prefix for prefix in held if held.count(prefix) > 1})


def timeline(samples: list[list[EvpnRoute]], prefixes: set[str],
             names: dict[str, str]) -> list[tuple[tuple[str, ...], int]]:
    """The samples as runs of one state: (who announces the prefixes, how many samples)."""
    runs: list[tuple[tuple[str, ...], int]] = []
    for rib in samples:
        state = announcers(rib, prefixes, names)
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1] + 1)
        else:
            runs.append((state, 1))
    return runs


def shown(runs: list[tuple[tuple[str, ...], int]]) -> str:
    """`node 1 (12 samples) → none (30) → node 2 (45)`."""
    return " → ".join(f"{' + '.join(state)} ({count}{' samples' if n == 0 else ''})"
                      for n, (state, count) in enumerate(runs))


# The deployment --------------------------------------------------------------------------------

@dataclass
class VmPod:
    """The VM's virt-launcher Pod whose tap is attached, on a node."""

    site: Site
    launcher: Launcher
    result: dict[str, Any]


@dataclass
class Move:
    """The nodes, the VM network, the VM's claim and where the VM runs now."""

    kube: Kube
    fabric: Fabric
    vpc: str
    namespace: str
    conf: dict[str, Any]
    sites: list[Site]
    stack: contextlib.ExitStack
    claim: str
    claim_uid: str
    addresses: list[str] = field(default_factory=list)  # the claim's, as its first ADD answered
    vm: VmPod | None = None
    pods: int = 0

    def names(self) -> dict[str, str]:
        """Each router's BGP address → `node N`."""
        return {site.gnode.address: f"node {site.index}" for site in self.sites}

    def attach(self, site: Site, claim: str | None, conf: dict[str, Any] | None = None,
               ) -> tuple[Answer, Launcher]:
        """A new virt-launcher Pod on site (with the claim's reference, if given) and the
        runtime's ADD of its tap."""
        self.pods += 1
        pod = site.scene.pod(claim)
        netns = self.stack.enter_context(temporary_netns("vpa-move"))
        launcher = site.scene.launcher(pod, f"ctr-{self.pods}-{site.index}", netns)
        return launcher.add(conf or self.conf), launcher

    def run_vm(self, site: Site) -> VmPod:
        """The VM's next Pod on site, attached (ADD must succeed)."""
        before = site.served("ADD")
        answer, launcher = self.attach(site, self.claim)
        assert answer.status == 0, f"ADD of the VM's Pod on {site.label()} failed: " \
            f"{answer.stdout} {answer.stderr}"
        assert site.agent is None or site.served("ADD") == before + 1, \
            f"{site.label()}'s own agent did not answer the ADD"
        self.vm = VmPod(site, launcher, answer.body)
        return self.vm

    def detach(self, launcher: Launcher, conf: dict[str, Any], result: dict[str, Any]) -> None:
        """The runtime's DEL of a Pod's tap, then its Pod object deleted."""
        launcher.ok("DEL", with_prev(conf, result))
        self.kube.delete(PODS.path(self.namespace, launcher.pod), grace_period_seconds=0)

    def stop_vm(self) -> None:
        """The VM's Pod goes: DEL of its tap on its node."""
        if self.vm is not None:
            self.detach(self.vm.launcher, self.conf, self.vm.result)
            self.vm = None

    def prefixes(self) -> set[str]:
        """What a node announces for the VM: each of the claim's addresses as its prefix."""
        return {str(ipaddress.ip_interface(address).network) for address in self.addresses}

    def expected(self, site: Site | None) -> list[EvpnRoute]:
        """The collector's exact RIB when site's router alone announces the VM (none: empty)."""
        if site is None:
            return []
        instance = vrf_instance(self.kube, naming.vrf_instance_name(self.vpc, site.name))
        assert instance is not None, f"no VRF instance of {site.label()}"
        return expected_routes(site.gnode, self.vpc, int(instance["spec"]["vrfID"]),
                               self.prefixes())

    def settle(self, step: str, site: Site | None) -> list[EvpnRoute]:
        """Wait until the collector holds the VM's prefixes once, from site's router only
        (nothing when site is None); print the RIB and return it."""
        want = self.expected(site)
        seen: list[list[EvpnRoute]] = [[]]

        def holds() -> bool:
            seen[0] = self.fabric.rib()
            return seen[0] == want

        wait_until(f"the collector's RIB at step {step}", holds, ROUTE_TIMEOUT_S,
                   alive=self.fabric.alive, detail=lambda: f"held {seen[0]}\nwanted {want}")
        self.show(step, seen[0])
        return seen[0]

    def move_vm(self, to: Site, step: str) -> None:
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
            wait_announced(self.kube, self.fabric, to.gnode, self.vpc, ATT, prefixes)
            rib = self.settle(f"{step}b: the VM's next Pod on node {to.index}", to)
            settled = len(samples)
            wait_until(f"{SAMPLES_AFTER_SETTLING} samples of the settled RIB",
                       lambda: len(samples) >= settled + SAMPLES_AFTER_SETTLING,
                       ROUTE_TIMEOUT_S)
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
        assert advertisement(self.kube, naming.advertisement_name(self.vpc, ATT, source.name)) \
            is None
        adv = advertisement(self.kube, naming.advertisement_name(self.vpc, ATT, to.name))
        assert adv is not None and set(adv["spec"]["prefixes"]) == prefixes

    def show(self, step: str, rib: list[EvpnRoute]) -> None:
        """The RIB, the claim's status and the network's IPAMBlocks, one line each."""
        names = {s.gnode.address: s.label() for s in self.sites}
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
                  f"{sorted(site.scene.files().claims())}, lends {lend_records(site)}")

    def node_label(self, name: str) -> str:
        """`node 1 (worker-…)`, or the name of a node not ours."""
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

    def holding_block(self, address: str) -> dict[str, Any]:
        """The IPAMBlock (not a lend object) whose cidr holds address."""
        host = ipaddress.ip_interface(address).ip
        found = [block for block in self.blocks()
                 if (block["metadata"].get("labels") or {}).get(LENT_LABEL) != "true"
                 and host in ipaddress.ip_network(block["spec"]["cidr"])]
        assert len(found) == 1, f"blocks holding {address}: {found}"
        return found[0]

    def host_routes(self, site: Site) -> set[str]:
        """The claim's addresses the VM's tap on site has a route to (the address, or its
        allocation's prefix), in any table."""
        tap = naming.host_link_name(self.vpc, ATT)
        routes = [line.split() for family in ("-4", "-6")
                  for line in run_ip("-n", site.netns, family, "route", "show", "table",
                                     "all").splitlines()]
        return {address for address in self.addresses
                if any(len(words) >= 3 and words[1:3] == ["dev", tap]
                       and words[0] in targets(address) for words in routes)}


def lend_records(site: Site) -> list[str]:
    """The lends a node's pool states record (`blocks/<name>-lent` under its ipamDataRoot)."""
    return sorted(path.name for path in site.scene.data_dir.rglob("blocks/*-lent"))


def targets(address: str) -> set[str]:
    """How `ip route` prints a route to address: the host, or the allocation's prefix."""
    allocation = ipaddress.ip_interface(address)
    return {str(allocation.ip), str(allocation.network)}


@pytest.fixture(scope="module")
def move(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
         galactic: GalacticBuild, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Move]:
    """The collector, three nodes (each its router, node name, lock dir, ipamDataRoot and, in
    the agent pass, agent), a namespace of the test's own, the VM network and the VM's claim,
    made as ipam-extensions makes it. Set up once for the module."""
    directory = tmp_path_factory.mktemp("claim-move")
    vpc = random_vpc()
    conf = tap_vm_network(vpc)
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, [vpc])
        stack.enter_context(bound(kube, vpc))
        namespace = stack.enter_context(claims_namespace(kube))
        fabric = stack.enter_context(running_fabric(galactic, directory, nodes=3))
        sites = [start_site(stack, fabric, index, kube, cluster, cni_bin, own_agents,
                            directory, namespace, conf) for index in (1, 2, 3)]
        claim = sites[0].scene.claim()
        stored = kube.get(claims_path(namespace, claim))
        assert stored is not None
        moving = Move(kube, fabric, vpc, namespace, conf, sites, stack, claim,
                      str(stored["metadata"]["uid"]))
        yield moving
        with contextlib.suppress(AssertionError):  # what a failed test left attached
            moving.stop_vm()


# The steps -------------------------------------------------------------------------------------

def test_the_vms_pod_on_node_1_gets_the_claims_addresses_and_only_node_1_announces_them(
        move: Move) -> None:
    """The claim's first Pod: addresses from blocks node 1 claims, written to the claim's
    status, their host routes on node 1, announced once, by node 1's router."""
    first = move.sites[0]
    vm = move.run_vm(first)
    move.addresses = sorted(ip["address"] for ip in vm.result["ips"])
    assert len(move.addresses) == 2, move.addresses
    status = claim_status(move.kube, move.namespace, move.claim)
    assert sorted(status["ips"]) == move.addresses
    assert allocated(status) == ("True", "SuccessfulAllocation", vm.launcher.pod)
    for address in move.addresses:
        assert move.holding_block(address)["spec"]["node"] == first.name, address
    assert move.lends() == []
    assert move.host_routes(first) == set(move.addresses)
    wait_announced(move.kube, move.fabric, first.gnode, move.vpc, ATT, move.prefixes())
    move.settle("1: the VM's Pod on node 1", first)
    adv = advertisement(move.kube, naming.advertisement_name(move.vpc, ATT, first.name))
    assert adv is not None and set(adv["spec"]["prefixes"]) == move.prefixes()


def test_the_vms_next_pod_on_node_2_borrows_the_addresses_and_only_node_2_announces_them(
        move: Move) -> None:
    """DEL on node 1 withdraws node 1's announcement; the claim's next Pod, on node 2, gets the
    same addresses, lent by node 1's blocks (one lend object each, owned by node 2's Node), with
    their host routes on node 2, and node 2's router alone announces them."""
    first, second, _ = move.sites
    assert move.vm is not None and move.vm.site is first, "step 1 left the VM on node 1"
    move.move_vm(second, "2")
    assert_lent(move, second, first)


def doctor_claims(site: Site) -> dict[str, list[dict[str, str]]]:
    """`vpc-attach doctor --json`'s ipam.claims and ipam.lends.* findings, run inside the node
    with its settings, as an operator runs it there (the other checks of a simulated node are
    not this test's)."""
    plugin = site.scene.plugin
    done = subprocess.run(
        [*plugin.prefix, str(plugin.cni_bin / "vpc-attach"), "doctor", "--json",
         "--ipam-data-dir", str(site.scene.data_dir)],
        env={**os.environ, **plugin.environ}, capture_output=True, text=True,
        timeout=DOCTOR_TIMEOUT_S, check=False)
    assert done.stdout.strip(), done.stderr
    found: dict[str, list[dict[str, str]]] = {}
    for finding in json.loads(done.stdout)["checks"]:
        if finding["check"].startswith(("ipam.claims", "ipam.lends")):
            found.setdefault(finding["check"], []).append(finding)
    return found


def test_doctor_names_the_claim_on_both_nodes_and_the_lend_from_each_side(move: Move) -> None:
    """With the VM on node 2: node 1's doctor shows the claim's addresses kept for its next Pod
    and lent to node 2; node 2's shows them attached and borrowed."""
    first, second, _ = move.sites
    claim = f"{move.namespace}/{move.claim}"
    on_first, on_second = doctor_claims(first), doctor_claims(second)
    print(f"\ndoctor on node 1: {json.dumps(on_first, indent=1)}\n"
          f"doctor on node 2: {json.dumps(on_second, indent=1)}")
    assert [f["status"] for f in on_first["ipam.claims"]] == ["ok"]
    for address in move.addresses:
        ip = str(ipaddress.ip_interface(address).ip)
        assert f"{ip} (kept for the claim's next Pod)" in on_first["ipam.claims"][0]["detail"]
        assert f"{address.split('/')[0]}/" in on_first["ipam.lends.out"][0]["detail"]
        assert f"{ip} (attached to " in on_second["ipam.claims"][0]["detail"]
        assert ip in on_second["ipam.lends.borrowed"][0]["detail"]
    assert f"to node '{second.name}' for IPAMClaim {claim}" in on_first["ipam.lends.out"][0][
        "detail"]
    assert claim in on_second["ipam.claims"][0]["detail"]
    assert [f["status"] for f in on_second["ipam.lends.borrowed"]] == ["ok"], \
        "the lends name node 2: no warning"


def assert_lent(move: Move, borrower: Site, holder: Site) -> None:
    """Each of the claim's addresses has exactly its lend object to borrower, from the block
    holder keeps, and no other lend object exists."""
    lends = {block["metadata"]["name"]: block for block in move.lends()}
    for address in move.addresses:
        holding = move.holding_block(address)
        assert holding["spec"]["node"] == holder.name, "the block stays the holder's"
        name, spec = lend_expected(move, holding, address, borrower)
        assert name in lends, f"no lend object {name} for {address}: {sorted(lends)}"
        lend = lends.pop(name)
        assert lend["spec"] == spec
        labels = lend["metadata"].get("labels") or {}
        assert {POOL_LABEL: labels.get(POOL_LABEL), LENT_LABEL: labels.get(LENT_LABEL)} == \
            {POOL_LABEL: holding["metadata"]["labels"][POOL_LABEL], LENT_LABEL: "true"}
        assert owners(lend) == [{"apiVersion": "v1", "kind": "Node", "name": borrower.name,
                                 "uid": borrower.uid}]
    assert lends == {}, f"lend objects of no address of the claim: {sorted(lends)}"


def lend_uids(move: Move) -> dict[str, str]:
    """The network's lend objects' uids, by name."""
    return {block["metadata"]["name"]: str(block["metadata"]["uid"]) for block in move.lends()}


def lend_expected(move: Move, holder: dict[str, Any], address: str,
                  borrower: Site) -> tuple[str, dict[str, Any]]:
    """The name and spec of the lend object of address (held in holder) to borrower:
    `<pool hash>-v4-<hex of the address>-32-lent` (v6: 32 hex digits and the allocation's
    prefix length)."""
    allocation = ipaddress.ip_interface(address).network
    width = 8 if allocation.version == 4 else 32
    digest = holder["metadata"]["labels"][POOL_LABEL]
    name = f"{digest}-v{allocation.version}-{int(allocation.network_address):0{width}x}-" \
        f"{allocation.prefixlen}-lent"
    spec = {"network": move.conf["name"], "subnet": holder["spec"]["subnet"],
            "allocationPrefixLength": holder["spec"]["allocationPrefixLength"],
            "cidr": str(allocation), "node": borrower.name,
            "lentFrom": holder["metadata"]["name"],
            "claim": f"{move.namespace}/{move.claim}", "claimUID": move.claim_uid}
    return name, spec


def test_a_pod_without_the_claim_on_node_1_asking_for_its_address_gets_102_naming_the_claim(
        move: Move) -> None:
    """Node 1 keeps its record of the claim's address while the VM runs elsewhere: another Pod
    there asking for it is refused, and the collector's RIB does not move meanwhile."""
    first = move.sites[0]
    assert move.addresses, "step 1 gave the claim no addresses"
    v4 = next(str(ipaddress.ip_interface(a).ip) for a in move.addresses if "." in a)
    before = move.fabric.rib()
    intruder = {**move.conf, "vpcattachment": INTRUDER_ATT, "runtimeConfig": {"ips": [v4]}}
    with rib_sampled(move.fabric) as samples:
        answer, _ = move.attach(first, None, intruder)
    assert answer.code == 102, answer.stdout
    assert f"IPAMClaim {move.namespace}/{move.claim} holds it" in answer.body["msg"], \
        answer.body
    print(f"[{PATH}] step 3: a Pod without the claim on node 1 asking for {v4}: code "
          f"{answer.code}: {answer.body['msg']}")
    assert v4 in first.scene.files().claims()
    assert all(rib == before for rib in samples), \
        shown(timeline(samples, move.prefixes(), move.names()))
    move.show("3: a Pod without the claim refused on node 1", before)


def test_the_vm_moving_on_to_node_3_takes_the_lends_over_and_only_node_3_announces_it(
        move: Move) -> None:
    """From one borrower to the next: node 3 replaces node 2's lend objects with its own (new
    objects, still lent from node 1's blocks) and its router alone announces the VM."""
    first, second, third = move.sites
    assert move.vm is not None and move.vm.site is second, "step 2 left the VM on node 2"
    before = lend_uids(move)
    move.move_vm(third, "4")
    assert_lent(move, third, first)
    assert set(lend_uids(move).values()).isdisjoint(before.values()), "not replaced"
    assert move.host_routes(second) == set()


def test_the_vm_moving_back_to_node_1_ends_the_lends_and_only_node_1_announces_it_again(
        move: Move) -> None:
    """Back on the node whose blocks hold its addresses, the VM needs no lend: node 1 recalls
    them (the lend objects are deleted) and its router alone announces the VM again."""
    first, _, third = move.sites
    assert move.vm is not None and move.vm.site is third, "step 4 left the VM on node 3"
    move.move_vm(first, "5")
    assert move.lends() == []
    assert move.host_routes(third) == set()


def test_the_vm_moving_out_to_node_2_again_borrows_the_addresses_again(move: Move) -> None:
    """Node 2's earlier lend, taken over by node 3 and recalled by node 1 since, does not
    stand in the way: node 2 borrows the addresses again and alone announces the VM."""
    first, second, _ = move.sites
    assert move.vm is not None and move.vm.site is first, "step 5 left the VM on node 1"
    move.move_vm(second, "6")
    assert_lent(move, second, first)


def test_a_live_migration_from_node_2_to_node_3_takes_the_lends_and_the_routes_on_the_timestamp(
        move: Move) -> None:
    """Issue 32 items 3 and 4 together, in the cluster pool: KubeVirt starts the migration
    target's Pod on node 3 while the source still runs on node 2 (the test makes the Pod and
    writes the ready timestamp on KubeVirt's behalf). The target's ADD takes the lends over at
    once (the holder's records keep the addresses unique meanwhile) but announces nothing; the
    collector keeps node 2's routes until the timestamp, then holds node 3's only, never
    neither in between; the source's DEL afterwards changes nothing."""
    first, second, third = move.sites
    assert move.vm is not None and move.vm.site is second, "step 6 left the VM on node 2"
    source = move.vm
    answer, launcher = move.attach(third, move.claim)
    assert answer.status == 0, answer.stdout
    assert sorted(ip["address"] for ip in answer.body["ips"]) == move.addresses
    assert_lent(move, third, first)
    move.settle("6m-a: the migration target attached on node 3, not announced", second)
    adv = advertisement(move.kube, naming.advertisement_name(move.vpc, ATT, third.name))
    assert adv is None or not set(adv["spec"].get("prefixes") or []) & move.prefixes()
    with rib_sampled(move.fabric) as samples:
        kubevirt_marks_target_ready(move.kube, move.namespace, launcher.pod,
                                    time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime()))
        marked = time.monotonic()
        if not VIA_AGENT:  # kubelet's poll of the runtime's status, made at once
            third.scene.plugin.ok("STATUS", move.conf)
        rib = move.settle("6m-b: KubeVirt marked the target ready", third)
        cut_over = time.monotonic() - marked
        # The sampler runs on its own thread: let it see the settled RIB too (as move_vm).
        settled = len(samples)
        wait_until(f"{SAMPLES_AFTER_SETTLING} samples of the settled RIB",
                   lambda: len(samples) >= settled + SAMPLES_AFTER_SETTLING, ROUTE_TIMEOUT_S)
    runs = timeline(samples, move.prefixes(), move.names())
    print(f"[{PATH}] step 6m: cut-over {cut_over:.3f} s from the ready timestamp to the RIB "
          f"holding node 3's routes only; samples: {shown(runs)}")
    # Make before break: the target is announced before the source is withdrawn, so the
    # collector may hold both for a moment, but never neither.
    states = [state for state, _ in runs]
    assert states[0] == ("node 2",) and states[-1] == ("node 3",), shown(runs)
    assert ("none",) not in states and all(set(state) <= {"node 2", "node 3"}
                                           for state in states), shown(runs)
    assert all({route.prefix for route in rib} >= move.prefixes() for rib in samples), \
        "a sample in which a prefix was announced by nobody"
    # The migration completed: KubeVirt deletes the source Pod, its DEL runs on node 2.
    move.detach(source.launcher, move.conf, source.result)
    move.vm = VmPod(third, launcher, answer.body)
    assert move.settle("6m-c: the source's Pod deleted", third) == rib
    status = claim_status(move.kube, move.namespace, move.claim)
    assert sorted(status["ips"]) == move.addresses


def test_the_claim_deleted_the_lends_go_and_node_1_hands_the_address_out_again(
        move: Move) -> None:
    """The VM's Pod goes, then kubevirt lets the claim go: the lend objects are deleted and
    every node that held or borrowed the addresses frees its records (the agents' watches; GC
    on nodes without an agent, run here in the in-process pass); a new Pod on node 1 asking
    for the addresses gets them and node 1's router announces them."""
    first, _, third = move.sites
    assert move.vm is not None and move.vm.site is third, "step 6m left the VM on node 3"
    assert move.lends(), "step 6m left no lend to delete"
    move.stop_vm()
    move.settle("7a: the VM's Pod deleted", None)
    started = time.monotonic()
    kubevirt_deletes_claim(move.kube, move.namespace, move.claim)
    if not VIA_AGENT:  # no agent watches: the runtime's GC frees them
        for site in move.sites:
            site.scene.plugin.ok("GC", {**move.conf, "cni.dev/valid-attachments": []})
    hosts = {str(ipaddress.ip_interface(address).ip) for address in move.addresses}

    def claimed() -> dict[str, list[str]]:
        return {site.label(): sorted(hosts & set(site.scene.files().claims()))
                for site in move.sites}

    wait_until("the deleted claim's lend objects and records freed",
               lambda: move.lends() == [] and not any(claimed().values()), FREED_WITHIN_S,
               interval=0.05,
               detail=lambda: f"lends {sorted(lend_uids(move))}, records {claimed()}")
    by = "the agents' watches" if VIA_AGENT else "GC on each node"
    print(f"[{PATH}] step 7: claim deleted → lends gone and records freed on every node in "
          f"{time.monotonic() - started:.2f} s ({by})")
    for address in move.addresses:
        assert move.holding_block(address)["spec"]["node"] == first.name, address
    requested = {**move.conf, "runtimeConfig": {"ips": move.addresses}}
    answer, launcher = move.attach(first, None, requested)
    assert answer.status == 0, answer.stdout
    assert sorted(ip["address"] for ip in answer.body["ips"]) == move.addresses
    move.settle("7b: a new Pod on node 1 given the freed addresses", first)
    move.detach(launcher, requested, answer.body)
    move.settle("7c: that Pod deleted", None)
