"""What the benchmark (e2e/bench) plans before it measures: which control planes `--only` needs,
the persistent-IP rows' claims and configs, and that the other rows' configs stay as they were.
Nothing here runs a plugin or starts a control plane."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from e2e.bench import claims, plan, subjects
from e2e.bench.__main__ import _keys
from e2e.bench.run import LARGE, SMALL
from e2e.bench.subjects import ADOPT, AGENT, FIRST, NO_CLAIM, Subject


def subject(claims_kind: str | None, key: str = "pip-claim-agent") -> Subject:
    return Subject(key, "label", AGENT, Path("/nonexistent/vpc-attach"),
                   lambda _att: {}, cluster=SMALL, ifname="net1", claims=claims_kind)


def test_without_only_both_control_planes_start() -> None:
    assert plan.clusters_needed(frozenset()) == {SMALL, LARGE}


def test_kernel_only_rows_need_no_control_plane() -> None:
    assert plan.clusters_needed(frozenset({"kernel-hl-agent", "kernel-ipam-inproc"})) == set()


@pytest.mark.parametrize(("key", "needed"), [
    ("pip-claim-agent", {SMALL}), ("pip-none-inproc", {SMALL}), ("kernel-ipamcl-agent", {SMALL}),
    ("full-agent", {SMALL}), ("full-many-inproc", {LARGE}),
])
def test_only_starts_the_control_plane_its_rows_use(key: str, needed: set[str]) -> None:
    assert plan.clusters_needed(frozenset({key})) == needed


def test_only_refuses_a_key_no_row_has() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="pip-nothing"):
        _keys("pip-claim-agent,pip-nothing")


def test_only_accepts_every_planned_key() -> None:
    assert _keys(",".join(plan.KEYS)) == frozenset(plan.KEYS)


def test_every_pod_of_an_adopting_row_names_the_same_claim() -> None:
    adopting = subject(ADOPT)
    names = {claims.claim_of(adopting, run_id) for run_id in ("seed", "w0", "r0", "r49")}
    assert names == {"pip-claim-agent.blue"}


def test_every_pod_of_a_first_allocation_row_names_a_claim_of_its_own() -> None:
    first = subject(FIRST, key="pip-first-inproc")
    names = [claims.claim_of(first, run_id) for run_id in ("w0", "w1", "r0", "r1")]
    assert len(set(names)) == 4
    assert names[2] == "pip-first-inproc-r0.blue"


def test_a_pod_of_a_row_without_claims_names_none() -> None:
    assert claims.claim_of(subject(NO_CLAIM), "r0") is None


def test_persistent_ip_rows_invoke_the_interface_multus_names_net1() -> None:
    env = subject(ADOPT).env("ADD", "ctr", "/var/run/netns/x", "IgnoreUnknown=1")
    assert env["CNI_IFNAME"] == "net1"


def test_only_persistent_ip_configs_allow_persistent_ips() -> None:
    ipam = subjects.vpc_attach_ipam(Path("/nonexistent"), 3)
    plain = subjects.vpc_attach_stanza("vpc1", ipam, subjects.KERNEL_ONLY)("1")
    persistent = subjects.vpc_attach_stanza("vpc1", ipam, subjects.KERNEL_ONLY,
                                            persistent_ips=True)("1")
    assert "allowPersistentIPs" not in plain
    assert persistent == {**plain, "allowPersistentIPs": True}
    assert persistent["name"] == subjects.network_name("vpc1")  # the claims' spec.network
