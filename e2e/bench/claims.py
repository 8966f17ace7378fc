"""The persistent-IP rows (SPEC §16, `allowPersistentIPs`): their IPAMClaims, made as kubevirt's
ipam-extensions makes them, and their virt-launcher Pods, as kubevirt's webhook leaves them, in
the small control plane; the adopted claims' first allocation before the rounds; the claims'
deletion at the end.

Each invocation of these rows is a Pod of its own (a VM's later Pod has a new name: the claim's
`status.ownerPod` is written again). ADOPT: every Pod names the subject's one claim, which got
its addresses from an unmeasured ADD before the rounds. FIRST: every Pod names a claim of its
own that holds nothing yet. NO_CLAIM: the Pod's element names no claim.
"""

from __future__ import annotations

import time

from e2e.bench import population, rounds
from e2e.bench.population import BENCH_NAMESPACE
from e2e.bench.run import Run, log
from e2e.bench.subjects import ADOPT, FIRST, Subject, network_name
from e2e.harness.ipamclaims import claims_path
from e2e.harness.kubevirt.standins import KUBEVIRT_FINALIZER, kubevirt_claim_name

NETWORK = "blue"  # the VM's network: the second part of kubevirt's claim names
SEED = "seed"  # the run id of the adopted claim's first Pod


def claim_of(subject: Subject, run_id: str) -> str | None:
    """The IPAMClaim the subject's Pod of this run id names (None: no claim)."""
    if subject.claims == ADOPT:
        return kubevirt_claim_name(subject.key, NETWORK)
    if subject.claims == FIRST:
        return kubevirt_claim_name(f"{subject.key}-{run_id}", NETWORK)
    return None


def create_claims_and_pods(run: Run, made: list[Subject],
                           run_ids: list[str]) -> dict[str, list[str]]:
    """Every persistent-IP row's claims and a Pod per invocation (and the adopted claims'
    first Pod) in its control plane; the Pods' names per control plane."""
    created: dict[str, list[str]] = {}
    for subject in made:
        if subject.claims is None or subject.skipped or subject.cluster not in run.clusters:
            continue
        ids = [SEED, *run_ids] if subject.claims == ADOPT else run_ids
        pods = {f"{subject.key}-{run_id}": claim_of(subject, run_id) for run_id in ids}
        labels = {f"{subject.key}-{run_id}": _vm_of(subject, run_id) for run_id in ids
                  if claim_of(subject, run_id) is not None}
        vms = {} if subject.vpc is None else \
            {vm: network_name(subject.vpc) for vm in _vms(subject, run_ids)}
        began = time.monotonic()
        with run.clusters[subject.cluster].admin() as admin:
            population.vm_claims(admin, vms, NETWORK)
            uids = population.launcher_pods(admin, run.node, pods, labels)
        run.pods.setdefault(subject.cluster, {}).update(uids)
        created.setdefault(subject.cluster, []).extend(uids)
        log(f"{subject.key}: {len(vms)} IPAMClaim(s), {len(uids)} virt-launcher Pods "
            f"({time.monotonic() - began:.0f} s)")
    return created


def _vm_of(subject: Subject, run_id: str) -> str:
    """The VM whose virt-launcher Pod the subject's Pod of this run id is."""
    return subject.key if subject.claims == ADOPT else f"{subject.key}-{run_id}"


def _vms(subject: Subject, run_ids: list[str]) -> list[str]:
    if subject.claims == ADOPT:
        return [subject.key]
    if subject.claims == FIRST:
        return [f"{subject.key}-{run_id}" for run_id in run_ids]
    return []


def allocate_adopted_claims(run: Run, made: list[Subject]) -> None:
    """The first ADD (then DEL) of each ADOPT subject's claim, unmeasured: its rows measure the
    claim's later Pods, which must get exactly these addresses. A subject whose first ADD
    fails, or whose claim does not record its addresses, is skipped with the reason."""
    for subject in made:
        if subject.claims != ADOPT or subject.skipped:
            continue
        subject.skipped = _allocate(run, subject)
        if subject.skipped:
            log(f"{subject.key}: {subject.skipped}")
            for verb in ("ADD", "DEL"):
                run.rows[f"{subject.key}/{verb}"].skipped = subject.skipped


def _allocate(run: Run, subject: Subject) -> str | None:
    netns = run.janitor.netns()
    container_id = f"bench-{run.token}-{subject.key}-{SEED}"
    pod = f"{subject.key}-{SEED}"
    try:
        _, result, problem = rounds.add(run, subject, netns, container_id, pod, "1")
        if result is None:
            return f"the IPAMClaim's first ADD failed: {problem}"
        _, del_problem = rounds.delete(run, subject, netns, container_id, pod, "1", result)
        rounds.after_agent_dels(subject)
    finally:
        run.janitor.remove(netns)
    if del_problem is not None:
        return f"the IPAMClaim's first DEL failed: {del_problem}"
    claim = claim_of(subject, SEED)
    assert subject.cluster is not None and claim is not None
    with run.clusters[subject.cluster].admin() as admin:
        stored = admin.get(claims_path(BENCH_NAMESPACE, claim)) or {}
    recorded = sorted((stored.get("status") or {}).get("ips") or [])
    if recorded != rounds.addresses(result):
        return f"IPAMClaim {claim} records {recorded}, its first ADD got " \
               f"{rounds.addresses(result)}"
    subject.claim_ips = recorded
    return None


def delete_claims(run: Run) -> None:
    """Delete every IPAMClaim of the bench's namespace, kubevirt's finalizer dropped first (as
    ipam-extensions does once the VM is gone); keeps going past a failure."""
    for name, cluster in run.clusters.items():
        try:
            with cluster.admin() as admin:
                claims = admin.list(claims_path(BENCH_NAMESPACE))
                for claim in claims:
                    path = claims_path(BENCH_NAMESPACE, claim["metadata"]["name"])
                    if KUBEVIRT_FINALIZER in (claim["metadata"].get("finalizers") or []):
                        admin.request("PATCH", path, {"metadata": {"finalizers": None}},
                                      content_type="application/merge-patch+json")
                    admin.delete(path)
        except Exception as exc:  # keep cleaning up
            log(f"deleting the IPAMClaims of control plane {name}: {exc}")
            continue
        if claims:
            log(f"control plane {name}: deleted {len(claims)} IPAMClaim(s)")
