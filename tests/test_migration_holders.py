"""Which Pods hold an IPAMClaim at once and which is a live migration's source (SPEC §16,
issue 32 item 4), without a cluster: Pods as the API server lists them, read as OVN-Kubernetes'
`DiscoverLiveMigrationStatus` reads them (completed Pods hold nothing), with the claim's
`ownerPod` deciding between two Pods made in the same second. The same through the plugin on
two nodes: e2e/test_live_migration_with_pods_and_timestamp_written_as_kubevirt_would.py."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.kube.networks import NETWORKS_ANNOTATION
from cni_plugin.kubevirt.holders import Holder, holders, living, migration_source, names_claim

CLAIM = "vm-a.blue"


def launcher(name: str, claim: str | None = CLAIM, *, created: str = "2026-12-06T10:00:00Z",
             phase: str = "Running", deleting: bool = False, node: str = "node-1",
             annotation: str | None = None) -> dict[str, Any]:
    element: dict[str, Any] = {"name": "blue-nad"}
    if claim is not None:
        element["ipam-claim-reference"] = claim
    meta: dict[str, Any] = {
        "name": name, "namespace": "vms", "uid": f"uid-{name}", "creationTimestamp": created,
        "annotations": {NETWORKS_ANNOTATION: annotation if annotation is not None
                        else json.dumps([element])}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T10:05:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_a_pod_names_the_claim_in_any_of_its_elements() -> None:
    both = json.dumps([{"name": "red"}, {"name": "blue", "ipam-claim-reference": CLAIM}])
    assert names_claim(launcher("a", annotation=both), CLAIM)
    assert not names_claim(launcher("a", claim="vm-b.blue"), CLAIM)
    assert not names_claim(launcher("a", claim=None), CLAIM)


def test_a_malformed_annotation_names_no_claim() -> None:
    assert not names_claim(launcher("a", annotation="[not json"), CLAIM)


def test_completed_and_deleting_pods_are_not_living() -> None:
    assert living(launcher("a", phase="Pending"))
    assert living(launcher("a"))
    assert not living(launcher("a", phase="Succeeded"))
    assert not living(launcher("a", phase="Failed"))
    assert not living(launcher("a", deleting=True))


def test_holders_are_the_other_living_pods_of_the_claim_oldest_first() -> None:
    pods = [launcher("target", created="2026-12-06T10:02:00Z", node="node-2"),
            launcher("self"), launcher("source", created="2026-12-06T09:00:00Z"),
            launcher("done", phase="Succeeded"), launcher("other", claim="vm-b.blue")]
    found = holders(pods, CLAIM, but="uid-self")
    assert [h.name for h in found] == ["source", "target"]
    assert str(found[1]) == "vms/target on node node-2"


def test_the_claims_owner_is_the_source_of_a_pod_made_in_the_same_second() -> None:
    source = holders([launcher("source")], CLAIM, but="")
    assert migration_source(source, launcher("target"), owner_pod="source") == source[0]


def test_an_older_pod_is_the_source_before_the_claim_names_an_owner() -> None:
    source = holders([launcher("source", created="2026-12-06T09:59:59Z")], CLAIM, but="")
    assert migration_source(source, launcher("target"), owner_pod=None) == source[0]


def test_a_newer_pod_that_does_not_own_the_claim_is_no_source() -> None:
    """The source's own ADD while its target's Pod exists already: it announces at once."""
    newer = holders([launcher("target", created="2026-12-06T10:00:01Z")], CLAIM, but="")
    assert migration_source(newer, launcher("source"), owner_pod=None) is None
    same_second = holders([launcher("target")], CLAIM, but="")
    assert migration_source(same_second, launcher("source"), owner_pod=None) is None


def test_the_source_attached_again_while_its_target_waits_announces_at_once() -> None:
    """A newer Pod is never the source, even when it owns the claim (the target's ADD wrote
    ownerPod): the source's sandbox made again announces the VM where it runs."""
    newer = holders([launcher("target", created="2026-12-06T10:03:00Z")], CLAIM, but="")
    assert migration_source(newer, launcher("source"), owner_pod="target") is None


def test_no_other_holder_means_no_migration() -> None:
    assert migration_source([], launcher("vm"), owner_pod="vm") is None


@given(st.lists(st.tuples(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
                          st.booleans(), st.booleans()), max_size=6))
def test_holders_are_exactly_the_living_pods_naming_the_claim(
        shapes: list[tuple[str, bool, bool]]) -> None:
    pods = [launcher(f"p{n}", CLAIM if named else "other.blue", phase=phase, deleting=deleting)
            for n, (phase, deleting, named) in enumerate(shapes)]
    expected = {f"p{n}" for n, (phase, deleting, named) in enumerate(shapes)
                if named and not deleting and phase in ("Pending", "Running")}
    found = holders(pods, CLAIM, but="")
    assert {h.name for h in found} == expected
    assert found == sorted(found)
    assert all(isinstance(h, Holder) for h in found)
