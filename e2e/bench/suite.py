"""One benchmark run: set up, measure every row interleaved, tear down.

Recipe: a CNI bin dir → two control planes (10 and N foreign objects of each kind; `planes`) →
one node agent per control plane (`agents`) → the subjects and rows (`plan`) → Pods for every
publishing ADD, IPAMClaims and virt-launcher Pods for the persistent-IP rows, each adopted
claim's first allocation (`claims`) → warm-up rounds → measured rounds (`rounds`: each round
runs every subject once, in an order rotated per round, each ADD/DEL pair in its own fresh
netns; `bursts` of 32 concurrent ADDs spread over the rounds) → the plugin's own log lines
(`logs`: time inside the verb, and proof the agent served the agent rows) → the agent's
resident set (`memory`) → `Report`. `close()` removes everything the run created.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from e2e.bench import agents, bursts, claims, logs, machine, memory, plan, planes, rounds, spawn
from e2e.bench.report import Report
from e2e.bench.run import LARGE, SMALL, Options, Run, log

METHOD_NOTES = [
    "IPv4 only, for every row: with an IPv6 address the Go reference ptp waits ~2 s for "
    "duplicate address detection on every ADD, which would measure DAD, not the plugin.",
    "Each plugin is exec'd by a small Go launcher the way libcni does (exec.Cmd, CNI "
    "environment, config on stdin, DEL with the ADD result as prevResult); latency is that "
    "exec's wall time, peak RSS its wait4 ru_maxrss (including reaped children such as "
    "host-local; the launcher's own ~2.4 MiB is the floor).",
    "Agent rows count only invocations found in the agent's log; VERSION never consults the "
    "agent (the executable answers it), so the start-up row is the executable alone.",
    "DEL through the agent answers once its links are retired (down, renamed); the agent "
    "deletes them right after. Agent DEL rows therefore exclude the kernel's ~17 ms veth "
    "teardown that the Go reference and in-process DEL include. After every agent DEL (and "
    "burst) the bench waits, unmeasured, until those deletions are done, so they overlap no "
    "other row.",
    "allowPersistentIPs rows (SPEC §16): vpc-attach-ipam, publishing off, each invocation a "
    "virt-launcher Pod of its own in the small control plane as kubevirt's webhook leaves it "
    "(interface net1). 'holding addresses': every Pod names the same IPAMClaim, which got its "
    "addresses from an unmeasured ADD before the rounds: ADD reads the Pod and the claim, "
    "adopts them (checked) and writes the claim's ownerPod. 'new': every Pod names a claim of "
    "its own that holds nothing yet: ADD allocates and writes the claim's status. 'without': "
    "the Pod's element names no claim: ADD reads the Pod only.",
    "10 versus 2,000 objects: two control planes side by side, each with its own agent, so "
    "that comparison is interleaved like every other. The 32-concurrent in-process row has no "
    "target: it shows the fallback under a burst.",
]


class Bench:
    """Owns everything one run creates."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.state = Run(options)

    def run(self) -> Report:
        """Measure everything; the report (outputs are written by the caller)."""
        run = self.state
        started = time.monotonic()
        bin_dir = self._bin_dir()
        if self.options.with_cluster:
            planes.start_clusters(run, plan.clusters_needed(self.options.only))
        else:
            run.cluster_problem = {c: "--no-cluster given" for c in (SMALL, LARGE)}
        agents.start_agents(run, bin_dir)
        all_subjects = plan.make_subjects(run, bin_dir)
        plan.plan_rows(run, all_subjects)
        planes.create_pods(run, all_subjects)
        planes.bind_vpcs(run, all_subjects)
        claims.allocate_adopted_claims(run, all_subjects)
        sequential = [s for s in all_subjects if not s.skipped]
        concurrent = [s for s in sequential if s.key in plan.CONCURRENT]
        bursts_after = bursts.burst_rounds(self.options.runs, self.options.bursts)
        total = self.options.warmup + self.options.runs
        run.load_before = machine.load_average()
        for number in range(total):
            measured = number >= self.options.warmup
            run_id = f"r{number - self.options.warmup}" if measured else f"w{number}"
            rounds.measure_round(run, sequential, number, run_id, measured)
            if measured and (number - self.options.warmup) in bursts_after:
                burst = sorted(bursts_after).index(number - self.options.warmup)
                for subject in rounds.rotated(concurrent, number):
                    bursts.burst(run, subject, burst)
            log(f"round {number + 1}/{total} {'measured' if measured else 'warm-up'} "
                f"({time.monotonic() - started:.0f} s)")
        run.load_after = machine.load_average()
        logs.read_plugin_logs(run, all_subjects)
        memory_rows = memory.memory_rows(run)
        run.notes[:0] = METHOD_NOTES
        busiest = max(run.load_before, run.load_after)
        if busiest > len(os.sched_getaffinity(0)):
            run.notes.append(f"Other work was running: the 1-minute load average was "
                             f"{busiest:.1f} on {len(os.sched_getaffinity(0))} CPUs. Absolute "
                             f"times are inflated; the ratios compare runs that shared the "
                             f"same conditions (interleaved), but CPU-bound Python suffers "
                             f"more from contention than the kernel-bound Go reference.")
        run.notes.append(f"The whole run took {time.monotonic() - started:.0f} s.")
        return Report(machine=machine.machine(run), settings=machine.settings(run),
                      rows=list(run.rows.values()), memory=memory_rows, notes=run.notes)

    def close(self) -> None:
        """Remove every process, namespace, link, rule, IPAMClaim, control plane and file of this
        run."""
        run = self.state
        spawn.kill_all()
        agents.stop_agents(run)
        try:
            removed = run.janitor.sweep()
            if removed:
                log(f"removed {len(removed)} leftover kernel object(s): {', '.join(removed[:5])}")
        except Exception as exc:
            log(f"kernel sweep: {exc}")
        claims.delete_claims(run)
        planes.stop_clusters(run)
        shutil.rmtree(run.workdir, ignore_errors=True)

    def _bin_dir(self) -> Path:
        """CNI_PATH: the Go reference plugins and our two executables, as a node gets them."""
        from e2e.harness import cnibin
        from e2e.harness.tools.gotools import reference_plugins_dir
        workdir = self.state.workdir
        bin_dir = cnibin.populate(workdir / "bin", reference_plugins_dir())
        console = cnibin.console_script("vpc-attach")
        if console is None:
            raise SystemExit("vpc-attach is not installed (run scripts/setup.sh)")
        (workdir / rounds.CONSOLE_SCRIPT).symlink_to(console)
        (workdir / "locks").mkdir()
        (workdir / "logs").mkdir()
        return bin_dir
