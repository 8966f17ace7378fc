"""A VM's IPAMClaim follows it from node to node in a `scope: cluster` pool (SPEC §16; issue 32
item 3), on three simulated nodes each running galactic-router, with a gobgpd collector
peered with all of them. kubevirt does not run here: the test makes the claim and the
virt-launcher Pods on its behalf, as ipam-extensions and its webhook leave them
(`e2e.harness.kubevirt`), and runs ADD and DEL of the VM's tap attachment as the runtime
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
one deployment (the module's `move`: `e2e.harness.kubevirt.moves`) and run in file order;
each prints the collector's RIB, the claim's status, the pool's IPAMBlocks and each node's
records at its step."""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from e2e.harness.agentproc import OwnAgents
from e2e.harness.doctor import doctor_on
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.collector import rib_sampled, shown, timeline
from e2e.harness.galactic.deployment import owners
from e2e.harness.galactic.sites import GalacticSite, wait_announced
from e2e.harness.ipamclaims import allocated, claim_status
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.moves import (
    LENT_LABEL,
    PATH,
    POOL_LABEL,
    Move,
    RunningVm,
    moving_vm,
    wait_more_samples,
)
from e2e.harness.kubevirt.standins import kubevirt_deletes_claim, kubevirt_marks_target_ready
from e2e.harness.plugin import VIA_AGENT
from e2e.harness.publishing import advertisement
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
ATT = "63"
INTRUDER_ATT = "64"  # a Pod without the claim, on the VM's network: a tap of its own
FREED_WITHIN_S = 30.0  # the agent's watch (at once) or GC frees a deleted claim's addresses


@pytest.fixture(scope="module")
def move(kube: Kube, cluster: Any, cni_bin: Path, own_agents: OwnAgents,
         galactic: GalacticBuild, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Move]:
    """Three galactic sites (each its router, Node, lock dir, ipamDataRoot and, in the agent
    pass, agent), the VM network and the VM's claim; set up once for the module."""
    with moving_vm(kube, cluster, cni_bin, own_agents, galactic,
                   tmp_path_factory.mktemp("claim-move"), ATT) as moving:
        yield moving


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
    wait_announced(move.kube, move.fabric, first, move.vpc, ATT, move.prefixes())
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
    assert v4 in move.scene(first).files().claims()
    assert all(rib == before for rib in samples), \
        shown(timeline(samples, move.prefixes(), move.names()))
    move.show("3: a Pod without the claim refused on node 1", before)


def test_the_vm_moving_on_to_node_3_takes_the_lends_over_and_only_node_3_announces_it(
        move: Move) -> None:
    """From one borrower to the next: node 3 replaces node 2's lend objects with its own (new
    objects, still lent from node 1's blocks) and its router alone announces the VM."""
    first, second, third = move.sites
    assert move.vm is not None and move.vm.site is second, "step 2 left the VM on node 2"
    before = move.lend_uids()
    move.move_vm(third, "4")
    assert_lent(move, third, first)
    assert set(move.lend_uids().values()).isdisjoint(before.values()), "not replaced"
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
        kubevirt_marks_target_ready(move.kube, move.namespace, launcher.pod)
        marked = time.monotonic()
        if not VIA_AGENT:  # kubelet's poll of the runtime's status, made at once
            third.plugin.ok("STATUS", move.conf)
        rib = move.settle("6m-b: KubeVirt marked the target ready", third)
        cut_over = time.monotonic() - marked
        wait_more_samples(samples)  # let the sampler see the settled RIB too (as move_vm)
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
    move.vm = RunningVm(third, launcher, answer.body)
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
            site.plugin.ok("GC", {**move.conf, "cni.dev/valid-attachments": []})
    hosts = {str(ipaddress.ip_interface(address).ip) for address in move.addresses}

    def claimed() -> dict[str, list[str]]:
        return {site.label(): sorted(hosts & set(move.scene(site).files().claims()))
                for site in move.sites}

    wait_until("the deleted claim's lend objects and records freed",
               lambda: move.lends() == [] and not any(claimed().values()), FREED_WITHIN_S,
               interval=0.05,
               detail=lambda: f"lends {sorted(move.lend_uids())}, records {claimed()}")
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


# What the steps check -------------------------------------------------------------------------

def doctor_claims(site: GalacticSite) -> dict[str, list[dict[str, str]]]:
    """`vpc-attach doctor --json`'s ipam.claims and ipam.lends.* findings, run inside the node
    with its settings, as an operator runs it there (the other checks of a simulated node are
    not this test's)."""
    assert site.data_root is not None
    report = doctor_on(site.plugin, "--ipam-data-dir", str(site.data_root))
    report.findings("ipam.claims")  # it must have reported
    return report.starting("ipam.claims", "ipam.lends")


def assert_lent(move: Move, borrower: GalacticSite, holder: GalacticSite) -> None:
    """Each of the claim's addresses has exactly its lend object to borrower, from the block
    holder keeps, and no other lend object exists."""
    lends = {block["metadata"]["name"]: block for block in move.lends()}
    for address in move.addresses:
        holding = move.holding_block(address)
        assert holding["spec"]["node"] == holder.name, "the block stays the holder's"
        name, spec = move.lend_expected(holding, address, borrower)
        assert name in lends, f"no lend object {name} for {address}: {sorted(lends)}"
        lend = lends.pop(name)
        assert lend["spec"] == spec
        labels = lend["metadata"].get("labels") or {}
        assert {POOL_LABEL: labels.get(POOL_LABEL), LENT_LABEL: labels.get(LENT_LABEL)} == \
            {POOL_LABEL: holding["metadata"]["labels"][POOL_LABEL], LENT_LABEL: "true"}
        assert owners(lend) == [{"apiVersion": "v1", "kind": "Node", "name": borrower.name,
                                 "uid": borrower.uid}]
    assert lends == {}, f"lend objects of no address of the claim: {sorted(lends)}"
