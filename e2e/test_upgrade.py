"""Rolling vpc-attach's DaemonSet from the previous release to this one and back, on a real
node, under running workloads (SPEC §18, issue 40).

The previous release is the commit `packaging/upgrade-from` names; its image is built from the
repository's own history (`e2e.harness.previous`: a worktree of that commit, its own standalone
build and image assembler, cached by commit) and deployed with that commit's `packaging/`. One
node serves the module (`Node.up` with the previous release); its conflist lets each Pod pick
its VPC attachment (`vpcFromPod`), so two VPCs share one pool: the same subnets in two VPC
tables. KubeVirt and Multus do not run here: the VM is a stand-in — a virt-launcher-like Pod
started by kubelet, its IPAMClaim made as kubevirt's ipam-extensions makes it, its tap network
attached by the node's own `/opt/cni/bin/vpc-attach` called as Multus calls it.

The phases run in order, each a module fixture the tests assert on:
1. `first_roll`: the previous release's attachments (veth Pods in VPCs A and B, the VM's tap
   with its claim, an attachment the runtime later forgets), long-lived TCP connections and
   probes between Pods of each VPC, a snapshot (`e2e.node.state`), the DaemonSet rolled to
   this release while Pods keep being created, the snapshot again, doctor, the agent protocol
   between the releases;
2. `old_removed`: this release's CHECK, DEL (kubelet deleting the Pods) and GC of what the
   previous one made, down to the node as it was before any Pod;
3. `rollback`: the same with attachments this release made, rolled back to the previous
   release, which then checks, deletes and collects them;
4. the last test: rolled forward again while the agent is SIGKILLed in the middle of an ADD.

The scene (the node, what each release makes, the roll, the comparisons) is
`e2e/node/upgrade.py`.

Everything is read through clients independent of vpc-attach (`ip -j`, `nft -j`, the files,
the official Kubernetes client, the node's CRI), besides the plugin's own log lines for what
only they tell (each ADD's outcome and duration).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness.image import current_release
from e2e.harness.previous import PreviousReleaseError, previous_release
from e2e.harness.report import report
from e2e.node.state import nft_without_handles
from e2e.node.upgrade import (
    FLOW_KINDS,
    Phase,
    Upgrade,
    agent_killed_mid_add,
    upgrade_node,
    world_removed,
    world_rolled,
)
from netconf.formats import FORMAT_VERSION

pytestmark = [pytest.mark.root, pytest.mark.cluster]

GAP_LIMIT_S = 1.0  # the longest a workload may go without an answer across a roll
PROTOCOL_KEPT = {"other release's executable via the agent": 0,
                 "agent's answer to protocol vpa9": "vpa?",
                 "in-process behind a refusing agent": {"this release's": 0,
                                                        "the other release's": 0},
                 "requests the refusing agent got": ["vpa1", "vpa1"]}


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory: pytest.TempPathFactory,
            pytestconfig: pytest.Config) -> Iterator[Upgrade]:
    """The node, on the previous release (one for the whole module); down at the end."""
    try:
        previous = previous_release()
    except PreviousReleaseError as exc:
        pytest.fail(str(exc))  # never a skip: the upgrade cannot be proven without it
    base = tmp_path_factory.mktemp("upgrade")
    left: dict[str, Any] = {}

    def figures(found: dict[str, Any]) -> None:
        left.update(found)
        report(pytestconfig, "upgrade figures", base / "upgrade-figures.json", found)

    with upgrade_node(base, previous, current_release(), figures) as scene:
        yield scene
    assert left["left_on_host"] == [], "links of the test left on the host"


@pytest.fixture(scope="module")
def first_roll(upgrade: Upgrade) -> Phase:
    return world_rolled(upgrade, "old", upgrade.current, 1, "roll")


@pytest.fixture(scope="module")
def old_removed(upgrade: Upgrade, first_roll: Phase) -> dict[str, Any]:
    return world_removed(upgrade, first_roll, "old attachments removed by the new release")


@pytest.fixture(scope="module")
def rollback(upgrade: Upgrade, old_removed: dict[str, Any]) -> Phase:
    return world_rolled(upgrade, "new", upgrade.previous, 200, "rollback")


@pytest.fixture(scope="module")
def new_removed(upgrade: Upgrade, rollback: Phase) -> dict[str, Any]:
    return world_removed(upgrade, rollback, "new attachments removed by the previous release",
                         by_previous=True)


# -- the roll ----------------------------------------------------------------------------------


def test_connections_across_the_roll_never_break_nor_pause_over_a_second(
        first_roll: Phase) -> None:
    traffic = first_roll.traffic
    assert all(flow.rounds > 0 for flow in traffic.flows), traffic.flows  # they did run
    assert traffic.broken() == []
    assert {kind: traffic.longest_gap_s(kind) <= GAP_LIMIT_S for kind in FLOW_KINDS} == \
        dict.fromkeys(FLOW_KINDS, True), traffic.flows


def test_existing_attachments_are_byte_for_byte_the_same_after_the_roll(
        first_roll: Phase) -> None:
    found = first_roll.done.comparison
    assert first_roll.done.before.keys_of(*first_roll.world.needles())  # compared something
    assert found.missing == [] and found.changed == {} and found.volatile_only == [], \
        found.report()


def test_every_add_during_the_roll_succeeds_but_the_previous_releases_without_credentials(
        first_roll: Phase) -> None:
    """The one exception, named: the previous release's installer copied its Pod's own token
    for the host, which the API server refuses from the moment that Pod is gone; its
    in-process ADDs in that window fail with code 11 (the kubelet retries them: every Pod
    runs). This release writes a Node-bound token instead: the rollback shows none."""
    done = first_roll.done
    assert len(done.stream) >= 2 and done.adds, "no Pod was created during the roll"
    window = done.refused_credentials_in_the_window()
    assert [line for line in done.failed_adds() if line not in window] == []
    retried = {line["pod"].split("/", 1)[1] for line in window}
    assert set(done.sandbox_failures) == retried  # each refused once, then started

def test_this_releases_agent_serves_the_previous_executable_and_a_refusal_runs_in_process(
        first_roll: Phase) -> None:
    """The wire protocol (`vpa1`) is the same in both releases: after the roll the previous
    release's executable (still staged) is served by this release's agent; the agent refuses
    another version, and behind an agent that refuses, each executable runs the verb itself."""
    assert first_roll.done.protocol == PROTOCOL_KEPT


def test_doctor_is_clean_after_the_roll(first_roll: Phase) -> None:
    done = first_roll.done
    assert done.doctor_before["ok"] is True, done.doctor_before  # the positive control
    assert done.doctor["ok"] is True and done.doctor["exit_status"] == 0, done.doctor
    assert done.doctor_changes() == {}


def test_the_new_release_checks_deletes_and_collects_the_old_attachments_to_nothing(
        old_removed: dict[str, Any]) -> None:
    assert set(old_removed["checks"].values()) == {0}, old_removed["checks"]
    assert old_removed["gc"] == {"node network": 0, "vm network": 0}
    assert orphan_collected(old_removed), old_removed["gc found"]  # GC had work, and did it
    left = old_removed["left"]
    assert (left["mentioning"], left["beyond baseline"]) == ([], [])
    assert left["nft rules as in the baseline"]


# -- the rollback --------------------------------------------------------------------------------


# The previous release rewrites `inet vpc_attach` at every start in two transactions and drops
# Pods' packets between them (its `source_dropped` counter shows 2-4): a new connection's SYN
# lost there is sent again after TCP's initial 1 s timeout. This release rewrites only when the
# rules differ (the roll to it holds the 1 s bound on every flow); the rollback to 041aa67 is
# allowed that one retransmission on new connections, and nothing else.
SYN_RETRANSMISSION_S = 1.0
ROLLBACK_GAP_LIMIT_S = {kind: GAP_LIMIT_S for kind in FLOW_KINDS} | \
    {"tcp probe": GAP_LIMIT_S + SYN_RETRANSMISSION_S}


def test_connections_across_the_rollback_never_break_and_pause_only_where_the_old_release_drops(
        rollback: Phase) -> None:
    traffic = rollback.traffic
    assert all(flow.rounds > 0 for flow in traffic.flows), traffic.flows
    assert traffic.broken() == []
    assert {kind: traffic.longest_gap_s(kind) <= ROLLBACK_GAP_LIMIT_S[kind]
            for kind in FLOW_KINDS} == dict.fromkeys(FLOW_KINDS, True), traffic.flows


def test_attachments_of_the_new_release_survive_the_rollback_byte_for_byte(
        rollback: Phase) -> None:
    """One exception, named: the previous release rewrites `inet vpc_attach` whenever its
    installer or agent starts, so the table holds the same rules under new handles (and its
    counters start from 0); this release rewrites it only when its rules differ."""
    done = rollback.done
    found = done.comparison
    rewritten = [key for key in [*found.missing, *found.changed] if key.startswith("nft ")]
    assert [key for key in found.missing if key not in rewritten] == [], found.report()
    assert [key for key in found.changed if key not in rewritten] == [], found.report()
    assert found.volatile_only == [], found.report()
    assert nft_without_handles(done.before) == nft_without_handles(done.after)


def test_the_previous_releases_agent_serves_this_executable_after_the_rollback(
        rollback: Phase) -> None:
    assert rollback.done.protocol == PROTOCOL_KEPT


def test_every_add_during_the_rollback_succeeds(rollback: Phase) -> None:
    done = rollback.done
    assert len(done.stream) >= 2 and done.adds
    assert done.failed_adds() == []  # the host kept this release's Node-bound token
    assert done.sandbox_failures == {}
    assert done.doctor["ok"] is True, done.doctor


def test_the_previous_release_checks_deletes_and_collects_the_new_attachments_to_nothing(
        new_removed: dict[str, Any]) -> None:
    assert set(new_removed["checks"].values()) == {0}, new_removed["checks"]
    assert new_removed["gc"] == {"node network": 0, "vm network": 0}
    assert orphan_collected(new_removed), new_removed["gc found"]
    left = new_removed["left"]
    assert (left["mentioning"], left["beyond baseline"]) == ([], [])
    assert left["nft rules as in the baseline"]


def orphan_collected(removed: dict[str, Any]) -> bool:
    """Whether GC (by the other release) said it deleted the link of the attachment whose
    sandbox the runtime forgot: the one thing DEL leaves GC to find."""
    return any(removed["orphan"] in found and found.startswith("GC: deleting")
               for found in removed["gc found"])


def credentials_refused(line: dict[str, Any]) -> bool:
    """A verb's summary line saying the API server refused the plugin's credentials."""
    return line["code"] == 11 and "rejected the plugin's credentials" in line["error"]


# -- the agent killed in the middle of an ADD during the roll --------------------------------------


def test_an_agent_killed_in_the_middle_of_an_add_during_the_roll_leaks_nothing(
        upgrade: Upgrade, new_removed: dict[str, Any]) -> None:
    """One exception, named: the kubelet's DEL of the killed sandbox may fall in the previous
    release's credentials window (see the ADDs of the first roll) and be refused with code 11;
    what that sandbox left then waits for the kubelet's next DEL or GC, and must be gone once
    the Pod is deleted and GC (of both networks) has run."""
    found = agent_killed_mid_add(upgrade)
    assert found["retried_sandbox"] != found["killed_sandbox"]
    failed = found["failed DELs of the killed sandbox"]
    assert [line for line in failed if not credentials_refused(line)] == [], failed
    assert failed or found["left by the killed sandbox"] == [], found["left by the killed sandbox"]
    left = found["left after"]
    assert (left["mentioning"], left["beyond baseline"]) == ([], [])
    assert left["nft rules as in the baseline"]
    # The VM's policy record the previous release's DEL left (it predates policy): this
    # release's GC of the VM network removed it.
    assert found["stale policy records collected by GC"], found
    # Written by this release before the rollback, kept across 041aa67 (which predates policy
    # and reads no policy file), read by this release's GC through its format check (SPEC §18).
    assert set(found["formatVersion of the stale policy records"].values()) == \
        {FORMAT_VERSION}, found
