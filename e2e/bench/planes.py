"""The run's two control planes (10 and N foreign objects of each kind), side by side so that
the 10-vs-N comparison is interleaved too, and the Pods every publishing or persistent-IP ADD
needs."""

from __future__ import annotations

import time

from e2e.bench import claims, population
from e2e.bench.run import CONCURRENCY, LARGE, SMALL, SMALL_OBJECTS, Run, log
from e2e.bench.subjects import Subject
from e2e.harness.cluster import Cluster, down
from e2e.harness.tenancy import create_binding


def start_clusters(run: Run, needed: set[str]) -> None:
    """Two control planes side by side, so the 10-vs-N comparison is interleaved too (only
    those needed: `--only`)."""
    for name, count in ((SMALL, SMALL_OBJECTS), (LARGE, run.options.objects)):
        if name not in needed:
            run.cluster_problem[name] = "not needed by the subjects --only names"
            continue
        began = time.monotonic()
        try:
            cluster = Cluster.up(run.workdir / f"cluster-{name}")
        except Exception as exc:
            run.cluster_problem[name] = f"control plane did not start: {exc}"
            log(run.cluster_problem[name])
            continue
        run.clusters[name] = cluster
        with cluster.admin() as admin:
            population.prepare_namespaces(admin)
            population.bench_router(admin, run.node)
            population.bench_node(admin, run.node)
            population.foreign_objects(admin, count)
        log(f"control plane {name} up with {count} foreign objects of each kind "
            f"({time.monotonic() - began:.0f} s)")


def bind_vpcs(run: Run, made: list[Subject]) -> None:
    """A VPCBinding of every measured VPC in each control plane (the plugin enforces bindings
    wherever it has a kubeconfig, SPEC §14): the check is part of what an ADD costs."""
    vpcs = sorted({subject.vpc for subject in made if subject.vpc})
    for cluster in run.clusters.values():
        with cluster.admin() as admin:
            for vpc in vpcs:
                create_binding(admin, vpc, name=f"bench-{vpc.lower()}")


def create_pods(run: Run, made: list[Subject]) -> None:
    """A Pod for every publishing and persistent-IP invocation (with the IPAMClaims those
    name); both control planes get as many Pods."""
    run_ids = [f"w{n}" for n in range(run.options.warmup)] + \
              [f"r{n}" for n in range(run.options.runs)]
    burst_ids = [f"b{b}-{j}" for b in range(run.options.bursts) for j in range(CONCURRENCY)]
    wanted: dict[str, list[str]] = {SMALL: [], LARGE: []}
    for subject in made:
        if subject.publishes and subject.cluster:
            wanted[subject.cluster] += [f"{subject.key}-{r}" for r in run_ids]
            if subject.key in ("full-agent", "full-inproc"):
                wanted[subject.cluster] += [f"{subject.key}-{b}" for b in burst_ids]
    launchers = claims.create_claims_and_pods(run, made, run_ids)
    held = {name: len(wanted[name]) + len(launchers.get(name, [])) for name in wanted}
    most = max(held.values())
    for name, cluster in run.clusters.items():
        names = wanted[name] + [f"spare-{k}" for k in range(most - held[name])]
        began = time.monotonic()
        with cluster.admin() as admin:
            run.pods.setdefault(name, {}).update(population.bench_pods(admin, run.node, names))
        log(f"control plane {name}: {len(names)} bench Pods "
            f"({time.monotonic() - began:.0f} s)")
    if run.clusters:
        which = "Both control planes also hold" if len(run.clusters) > 1 else \
            "The control plane also holds"
        run.notes.append(
            f"{which} the bench's own {most} Pods on the bench node "
            f"(one per publishing or persistent-IP ADD, created beforehand); the 10 / "
            f"{run.options.objects:,} objects of each kind are other nodes' (other "
            f"routers; Pods and EndpointSlices half in the bench's namespace, half in "
            f"others).")


def stop_clusters(run: Run) -> None:
    """Stop both control planes (also one that failed half-way) and remove their state."""
    for name in (SMALL, LARGE):
        state_dir = run.workdir / f"cluster-{name}"
        if state_dir.exists():
            try:
                down(state_dir)
            except Exception as exc:
                log(f"stopping control plane {name}: {exc}")
