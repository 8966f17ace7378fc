"""The status an allocation leaves on an IPAMClaim (SPEC §16), without a cluster: as
OVN-Kubernetes writes it, condition `IPsAllocated` set as apimachinery sets conditions, and a
claim's addresses never overwritten. The same through the real API server and CRD:
e2e/test_ipamclaims.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.kubevirt.claim import (
    IPS_ALLOCATED,
    MESSAGE_MAX,
    Allocated,
    AllocationFailed,
    Condition,
    IPAMClaim,
    IPsAlreadySet,
    MalformedClaim,
    same_addresses,
    status_after,
    with_condition,
)

T0, T1 = "2026-12-05T10:00:00Z", "2026-12-05T10:05:00Z"


# The claim and its status --------------------------------------------------------------------

def claim(ips: list[str] | None = None, conditions: list[dict[str, Any]] | None = None,
          **status: Any) -> IPAMClaim:
    obj: dict[str, Any] = {
        "apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
        "metadata": {"namespace": "vms", "name": "vm-a.blue", "uid": "u-1",
                     "resourceVersion": "41", "generation": 1},
        "spec": {"network": "vpc60", "interface": ""}}
    if ips is not None or conditions is not None or status:
        obj["status"] = {"ips": ips or [], **status}
        if conditions is not None:
            obj["status"]["conditions"] = conditions
    return IPAMClaim.from_object(obj)


def after(source: IPAMClaim, allocation: Allocated | AllocationFailed,
          now: str = T0, pod_name: str = "virt-launcher-vm-a-x7k2p") -> IPAMClaim:
    obj = {**source.obj, "status": status_after(source, allocation, pod=pod_name, now=now)}
    return IPAMClaim.from_object(obj)


def test_a_first_allocation_records_the_addresses_the_pod_and_ips_allocated_true() -> None:
    written = after(claim(), Allocated(("10.60.0.5/24", "fd00:60::5/64")))
    assert written.ips == ("10.60.0.5/24", "fd00:60::5/64")
    assert written.owner_pod == "virt-launcher-vm-a-x7k2p"
    condition = written.condition()
    assert condition is not None
    assert (condition.type, condition.status, condition.reason, condition.message,
            condition.last_transition_time, condition.observed_generation) == (
        IPS_ALLOCATED, "True", "SuccessfulAllocation", "IP addresses successfully allocated",
        T0, 1)


def test_a_later_pod_with_the_same_addresses_keeps_them_as_written_and_becomes_the_owner() -> None:
    held = after(claim(), Allocated(("fd00:60::5/64", "10.60.0.5/24")))
    again = after(held, Allocated(("10.60.0.5/24", "fd00:60:0::0005/64")), now=T1,
                  pod_name="virt-launcher-vm-a-9q8wz")
    assert again.ips == ("fd00:60::5/64", "10.60.0.5/24")
    assert again.owner_pod == "virt-launcher-vm-a-9q8wz"
    assert again.condition() == held.condition(), "no transition: still True since T0"


def test_other_addresses_are_never_written_over_a_claims() -> None:
    held = claim(["10.60.0.5/24"])
    with pytest.raises(IPsAlreadySet) as caught:
        status_after(held, Allocated(("10.60.0.9/24",)), pod="p", now=T0)
    assert (caught.value.held, caught.value.offered) == (("10.60.0.5/24",), ("10.60.0.9/24",))


@pytest.mark.parametrize("reason", ["SubnetExhausted", "IPAddressConflict", "InternalError"])
def test_a_failed_first_allocation_records_ips_allocated_false_with_its_reason(
        reason: Any) -> None:
    written = after(claim(), AllocationFailed(reason, "pool vpc60: no free address"))
    condition = written.condition()
    assert written.ips == () and written.obj["status"]["ips"] == []
    assert written.owner_pod == "virt-launcher-vm-a-x7k2p"
    assert condition is not None
    assert (condition.status, condition.reason, condition.message) == (
        "False", reason, "pool vpc60: no free address")


def test_a_failure_leaves_a_claim_that_holds_addresses_as_it_is() -> None:
    held = after(claim(), Allocated(("10.60.0.5/24",)))
    assert status_after(held, AllocationFailed("IPAddressConflict", "taken"), pod="other",
                        now=T1) == held.obj["status"]


def test_success_after_failure_moves_the_transition_time() -> None:
    failed = after(claim(), AllocationFailed("SubnetExhausted", "full"))
    allocated = after(failed, Allocated(("10.60.0.5/24",)), now=T1)
    condition = allocated.condition()
    assert condition is not None
    assert (condition.status, condition.last_transition_time) == ("True", T1)


def test_a_long_failure_message_is_cut_to_what_the_crd_accepts() -> None:
    written = after(claim(), AllocationFailed("InternalError", "x" * (MESSAGE_MAX + 10)))
    condition = written.condition()
    assert condition is not None and len(condition.message) == MESSAGE_MAX


def test_other_conditions_and_status_fields_are_kept() -> None:
    other = {"type": "Ready", "status": "True", "reason": "R", "message": "",
             "lastTransitionTime": T0, "extra": 1}
    source = claim(conditions=[other], futureField="kept")
    status = status_after(source, Allocated(("10.60.0.5/24",)), pod="p", now=T1)
    assert status["conditions"][0] == other and status["futureField"] == "kept"


def test_recording_the_same_allocation_twice_changes_nothing_the_second_time() -> None:
    once = after(claim(), Allocated(("10.60.0.5/24",)))
    assert status_after(once, Allocated(("10.60.0.5/24",)), pod="virt-launcher-vm-a-x7k2p",
                        now=T1) == once.obj["status"]


def test_set_condition_adds_then_replaces_as_apimachinery_does() -> None:
    first = with_condition([], Condition("IPsAllocated", "False", "SubnetExhausted", "m", T0, 0))
    assert first == [{"type": "IPsAllocated", "status": "False", "lastTransitionTime": T0,
                      "reason": "SubnetExhausted", "message": "m"}]
    same = with_condition(first, Condition("IPsAllocated", "False", "InternalError", "n", T1, 3))
    assert same == [{"type": "IPsAllocated", "status": "False", "lastTransitionTime": T0,
                     "reason": "InternalError", "message": "n", "observedGeneration": 3}]


ADDRESSES = st.lists(st.sampled_from(["10.60.0.5/24", "10.60.0.6/24", "fd00:60::5/64"]),
                     min_size=1, max_size=2, unique=True)
ALLOCATIONS = st.one_of(
    ADDRESSES.map(lambda ips: Allocated(tuple(ips))),
    st.sampled_from(["SubnetExhausted", "IPAddressConflict", "InternalError"]).map(
        lambda reason: AllocationFailed(reason, "failed")))  # type: ignore[arg-type]


@given(st.lists(ALLOCATIONS, max_size=6))
def test_once_a_claim_holds_addresses_no_later_allocation_changes_them(
        allocations: list[Allocated | AllocationFailed]) -> None:
    current = claim()
    first: tuple[str, ...] = ()
    for allocation in allocations:
        try:
            current = after(current, allocation)
        except IPsAlreadySet:
            assert first and not same_addresses(first, allocation.ips)  # type: ignore[union-attr]
            continue
        first = first or current.ips
        assert current.ips == first


def test_addresses_are_normalised_and_given_once() -> None:
    assert Allocated(("fd00:60:0::0005/64",)).ips == ("fd00:60::5/64",)
    with pytest.raises(ValueError, match="twice"):
        Allocated(("10.60.0.5/24", "10.60.0.5/24"))
    with pytest.raises(ValueError):
        Allocated(())
    with pytest.raises(ValueError):
        Allocated(("10.60.0.500/24",))


def test_a_claim_whose_status_holds_no_address_is_malformed() -> None:
    with pytest.raises(MalformedClaim, match=re.escape("status.ips: 'ten' is not an address")):
        claim(["ten"])
