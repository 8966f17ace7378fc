"""One benchmark run: set up, measure every row interleaved, tear down.

Recipe: a CNI bin dir → two control planes (10 and N foreign objects of each kind) → one node
agent per control plane → the subjects → Pods for every publishing ADD → warm-up rounds →
measured rounds (each round runs every subject once, in an order rotated per round, each
ADD/DEL pair in its own fresh netns; bursts of 32 concurrent ADDs spread over the rounds) →
the plugin's own log lines (time inside the verb, and proof the agent served the agent rows)
→ the agent's resident set → `Report`. `close()` removes everything the run created.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from e2e.bench import kernel, spawn, subjects, targets
from e2e.bench.kernel import KernelJanitor, Netns
from e2e.bench.report import MemoryRow, Report, Row
from e2e.bench.subjects import AGENT, GO, IN_PROCESS, Subject
from netconf import base62

INVOKE_TIMEOUT = 60.0  # every ADD/DEL; the plugin's own deadline is 30 s
VERSION_TIMEOUT = 20.0
CONSOLE_SCRIPT = "console-script-vpc-attach"  # pip's wrapper, for the start-up comparison
# VERSION steps of a round: executable (relative to the work dir) and the row it feeds
VERSION_STEPS = {"go-version": ("bin/ptp", "go-ptp/VERSION"),
                 "vpc-version": ("bin/vpc-attach", "vpc-attach/VERSION"),
                 "console-version": (CONSOLE_SCRIPT, "console/VERSION")}
CONCURRENCY = 32
SMALL_OBJECTS = 10
SMALL, LARGE = "small", "large"
AGENT_PROBE_TIMEOUT = 30.0

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
    "10 versus 2,000 objects: two control planes side by side, each with its own agent, so "
    "that comparison is interleaved like every other. The 32-concurrent in-process row has no "
    "target: it shows the fallback under a burst.",
]

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Options:
    """How much to measure."""

    runs: int
    warmup: int
    bursts: int
    objects: int
    quick: bool
    with_cluster: bool = True


@dataclass
class Invocation:
    """Which row an invocation belongs to, to find its log line afterwards."""

    row: str
    verb: str
    container_id: str
    via_agent: bool


@dataclass
class Agent:
    """A started node agent (or why it is not there)."""

    name: str
    socket: Path
    process: Any = None  # e2e.harness.agentproc.AgentProcess
    problem: str | None = None


def log(message: str) -> None:
    """Progress to stderr (stdout stays quiet)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class Bench:
    """Owns everything one run creates."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.token = secrets.token_hex(3)
        self.workdir = Path(tempfile.mkdtemp(prefix="vpc-attach-bench-"))
        self.janitor = KernelJanitor(self.token)
        self.node = f"bench-node-{self.token}"
        self.notes: list[str] = []
        self.clusters: dict[str, Any] = {}  # e2e.harness.cluster.Cluster
        self.cluster_problem: dict[str, str] = {}
        self.agents: dict[str, Agent] = {}
        self.rows: dict[str, Row] = {}
        self.invocations: list[Invocation] = []
        self.pods: dict[str, dict[str, str]] = {}  # cluster -> pod name -> uid
        self._lock = threading.Lock()
        self.load_before = self.load_after = 0.0

    # The recipe --------------------------------------------------------------------------

    def run(self) -> Report:
        """Measure everything; the report (outputs are written by the caller)."""
        started = time.monotonic()
        bin_dir = self._bin_dir()
        if self.options.with_cluster:
            self._start_clusters()
        else:
            self.cluster_problem = {c: "--no-cluster given" for c in (SMALL, LARGE)}
        self._start_agents(bin_dir)
        all_subjects = self._subjects(bin_dir)
        sequential = [s for s in all_subjects if not s.skipped]
        concurrent = [s for s in sequential
                      if s.key in ("go-ptp", "kernel-hl-agent", "full-agent", "full-inproc")]
        self._plan_rows(all_subjects)
        self._create_pods(all_subjects)
        bursts_after = self._burst_rounds()
        total = self.options.warmup + self.options.runs
        self.load_before = _load_average()
        for number in range(total):
            measured = number >= self.options.warmup
            run_id = f"r{number - self.options.warmup}" if measured else f"w{number}"
            self._round(sequential, number, run_id, measured)
            if measured and (number - self.options.warmup) in bursts_after:
                burst = sorted(bursts_after).index(number - self.options.warmup)
                for subject in _rotated(concurrent, number):
                    self._burst(subject, burst)
            log(f"round {number + 1}/{total} {'measured' if measured else 'warm-up'} "
                f"({time.monotonic() - started:.0f} s)")
        self.load_after = _load_average()
        self._read_plugin_logs(all_subjects)
        memory = self._memory()
        self.notes[:0] = METHOD_NOTES
        busiest = max(self.load_before, self.load_after)
        if busiest > len(os.sched_getaffinity(0)):
            self.notes.append(f"Other work was running: the 1-minute load average was "
                              f"{busiest:.1f} on {len(os.sched_getaffinity(0))} CPUs. Absolute "
                              f"times are inflated; the ratios compare runs that shared the "
                              f"same conditions (interleaved), but CPU-bound Python suffers "
                              f"more from contention than the kernel-bound Go reference.")
        self.notes.append(f"The whole run took {time.monotonic() - started:.0f} s.")
        return Report(machine=self._machine(), settings=self._settings(),
                      rows=list(self.rows.values()), memory=memory, notes=self.notes)

    def close(self) -> None:
        """Remove every process, namespace, link, rule, control plane and file of this run."""
        spawn.kill_all()
        for agent in self.agents.values():
            if agent.process is not None:
                try:
                    agent.process.stop(timeout=30)
                except Exception as exc:  # keep cleaning up
                    log(f"stopping agent {agent.name}: {exc}")
        try:
            removed = self.janitor.sweep()
            if removed:
                log(f"removed {len(removed)} leftover kernel object(s): {', '.join(removed[:5])}")
        except Exception as exc:
            log(f"kernel sweep: {exc}")
        from e2e.harness.cluster.cluster import down
        for name in (SMALL, LARGE):
            state_dir = self.workdir / f"cluster-{name}"
            if state_dir.exists():
                try:
                    down(state_dir)
                except Exception as exc:
                    log(f"stopping control plane {name}: {exc}")
        shutil.rmtree(self.workdir, ignore_errors=True)

    # Set-up ------------------------------------------------------------------------------

    def _bin_dir(self) -> Path:
        """CNI_PATH: the Go reference plugins and our two executables, as a node gets them."""
        from e2e.harness import cnibin
        from e2e.harness.tools.gotools import reference_plugins_dir
        bin_dir = cnibin.populate(self.workdir / "bin", reference_plugins_dir())
        console = cnibin.console_script("vpc-attach")
        if console is None:
            raise SystemExit("vpc-attach is not installed (run scripts/setup.sh)")
        (self.workdir / CONSOLE_SCRIPT).symlink_to(console)
        (self.workdir / "locks").mkdir()
        (self.workdir / "logs").mkdir()
        return bin_dir

    def _start_clusters(self) -> None:
        """Two control planes side by side, so the 10-vs-N comparison is interleaved too."""
        from e2e.bench import population
        from e2e.harness.cluster import Cluster
        for name, count in ((SMALL, SMALL_OBJECTS), (LARGE, self.options.objects)):
            began = time.monotonic()
            try:
                cluster = Cluster.up(self.workdir / f"cluster-{name}")
            except Exception as exc:
                self.cluster_problem[name] = f"control plane did not start: {exc}"
                log(self.cluster_problem[name])
                continue
            self.clusters[name] = cluster
            with cluster.admin() as admin:
                population.prepare_namespaces(admin)
                population.bench_router(admin, self.node)
                population.foreign_objects(admin, count)
            log(f"control plane {name} up with {count} foreign objects of each kind "
                f"({time.monotonic() - began:.0f} s)")

    def _start_agents(self, bin_dir: Path) -> None:
        """One `vpc-attach agent` per control plane (kernel-only rows use the first)."""
        for name in (SMALL, LARGE):
            if name == LARGE and name not in self.clusters:
                continue
            directory = self.workdir / f"agent-{name}"
            directory.mkdir()
            agent = Agent(name, directory / "agent.sock")
            self.agents[name] = agent
            env = {"VPC_ATTACH_HOST_CONFIG": str(self.workdir / "absent-host.json"),
                   "VPC_ATTACH_LOCK_DIR": str(self.workdir / "locks"),
                   "VPC_ATTACH_NODE_NAME": self.node}
            if name in self.clusters:
                env["VPC_ATTACH_KUBECONFIG"] = str(self.clusters[name].plugin_kubeconfig)
            try:
                from e2e.harness.agentproc import AgentProcess
                agent.process = AgentProcess(directory, env=env).start()
            except Exception as exc:
                agent.problem = f"`vpc-attach agent` did not start: {_one_line(str(exc))}"
                log(agent.problem)
                continue
            agent.problem = self._probe_agent(agent, bin_dir)

    def _probe_agent(self, agent: Agent, bin_dir: Path) -> str | None:
        """A DEL of nothing through the agent: does it answer and log it?"""
        container_id = f"bench-{self.token}-probe-{agent.name}"
        env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "DEL",
               "CNI_CONTAINERID": container_id, "CNI_NETNS": "", "CNI_IFNAME": "eth0",
               "CNI_PATH": str(bin_dir),
               "VPC_ATTACH_HOST_CONFIG": str(self.workdir / "absent-host.json"),
               "VPC_ATTACH_AGENT_SOCKET": str(agent.socket)}
        ipam = subjects.host_local(self.workdir / "ipam" / "probe", 250)
        stanza = subjects.vpc_attach_stanza(subjects.random_vpc(), ipam, subjects.KERNEL_ONLY)("1")
        done = spawn.run([str(bin_dir / "vpc-attach")], env, json.dumps(stanza).encode(),
                         AGENT_PROBE_TIMEOUT)
        if done.status != 0:
            return f"the agent's probe DEL failed: {_one_line(done.stdout.decode())}"
        if not any(line.get("containerID") == container_id
                   for line in agent.process.verb_lines()):
            return "the probe DEL was not served by the agent (the executable ran it in-process)"
        return None

    def _subjects(self, bin_dir: Path) -> list[Subject]:
        """Everything measured, each with its own VPC, /24 and IPAM data dir."""
        ipam_dir = self.workdir / "ipam"
        absent = {"VPC_ATTACH_HOST_CONFIG": str(self.workdir / "absent-host.json")}
        no_agent = {**absent, "VPC_ATTACH_AGENT_SOCKET": str(self.workdir / "no-agent.sock"),
                    "VPC_ATTACH_LOCK_DIR": str(self.workdir / "locks"),
                    "VPC_ATTACH_NODE_NAME": self.node}

        def via(cluster: str) -> dict[str, str]:
            # Only the socket: the agent knows its node, kubeconfig and lock dir (DaemonSet).
            return {**absent, "VPC_ATTACH_AGENT_SOCKET": str(self.agents[cluster].socket)
                    if cluster in self.agents else str(self.workdir / "no-agent.sock")}

        def kubeconfig(cluster: str) -> dict[str, str]:
            found = self.clusters.get(cluster)
            return {"VPC_ATTACH_KUBECONFIG": str(found.plugin_kubeconfig)} if found else {}

        many = f"{self.options.objects:,}"
        plan: list[tuple[str, str, str, str, str | None]] = [
            # key, label, path, ipam, cluster
            ("go-ptp", "Go ptp + host-local (reference)", GO, "host-local", None),
            ("kernel-hl-agent", "vpc-attach kernel-only, host-local", AGENT, "host-local", None),
            ("kernel-hl-inproc", "vpc-attach kernel-only, host-local", IN_PROCESS, "host-local",
             None),
            ("kernel-ipam-agent", "vpc-attach kernel-only, vpc-attach-ipam", AGENT,
             "vpc-attach-ipam", None),
            ("kernel-ipam-inproc", "vpc-attach kernel-only, vpc-attach-ipam", IN_PROCESS,
             "vpc-attach-ipam", None),
            ("full-agent", f"vpc-attach full (publishing), {SMALL_OBJECTS} objects of each kind",
             AGENT, "host-local", SMALL),
            ("full-inproc", f"vpc-attach full (publishing), {SMALL_OBJECTS} objects of each kind",
             IN_PROCESS, "host-local", SMALL),
            ("full-many-agent", f"vpc-attach full (publishing), {many} objects of each kind",
             AGENT, "host-local", LARGE),
            ("full-many-inproc", f"vpc-attach full (publishing), {many} objects of each kind",
             IN_PROCESS, "host-local", LARGE),
        ]
        made = []
        for index, (key, label, path, ipam_type, cluster) in enumerate(plan):
            data = ipam_dir / key
            if path == GO:
                made.append(Subject(key, label, GO, bin_dir / "ptp",
                                    subjects.ptp_stanza(data, index)))
                continue
            vpc = subjects.random_vpc()
            self.janitor.own_vpc(vpc)
            ipam = subjects.host_local(data, index) if ipam_type == "host-local" \
                else subjects.vpc_attach_ipam(data, index)
            publish = subjects.PUBLISH_IPV4 if cluster else subjects.KERNEL_ONLY
            agent_name = cluster or SMALL
            if path == AGENT:
                environ = via(agent_name)
            else:
                environ = {**no_agent, **(kubeconfig(agent_name) if cluster else {}),
                           "VPC_ATTACH_LOG_FILE": str(self.workdir / "logs" / f"{key}.log")}
            subject = Subject(key, label, path, bin_dir / "vpc-attach",
                              subjects.vpc_attach_stanza(vpc, ipam, publish), environ, vpc=vpc,
                              publishes=cluster is not None, cluster=cluster)
            if cluster and cluster not in self.clusters:
                subject.skipped = self.cluster_problem.get(cluster, "no control plane")
            elif path == AGENT:
                agent = self.agents.get(agent_name)
                subject.skipped = agent.problem if agent else "no agent"
            made.append(subject)
        return made

    def _plan_rows(self, made: list[Subject]) -> None:
        """The table's rows, their Go reference and the issue-5 targets they answer to."""
        by_key = {s.key: s for s in made}
        kernel_agent = {"kernel-hl-agent", "kernel-ipam-agent"}
        in_process = {"kernel-hl-inproc", "kernel-ipam-inproc", "full-inproc"}
        for subject in made:
            for verb in ("ADD", "DEL"):
                row = self._row(subject, verb, f"{subject.key}/{verb}")
                if subject.key in kernel_agent:
                    target = targets.KERNEL_ADD if verb == "ADD" else targets.KERNEL_DEL
                    row.targets.append((target, f"ratio:go-ptp/{verb}"))
                if verb == "ADD" and subject.key in in_process:
                    row.targets.append((targets.IN_PROCESS_ADD, "median"))
                if verb == "ADD" and subject.key == "full-agent":
                    row.targets.append((targets.FULL_ADD, "median"))
                if verb == "ADD" and subject.key.startswith("full-many-"):
                    baseline = subject.key.replace("full-many-", "full-")
                    row.targets.append((targets.SCALE, f"ratio:{baseline}/ADD"))
        go_version = Row("go-ptp/VERSION", "Go ptp start-up (reference)", "VERSION", GO)
        ours = Row("vpc-attach/VERSION", "vpc-attach start-up", "VERSION", IN_PROCESS,
                   reference=go_version.key)
        console = Row("console/VERSION", "vpc-attach start-up, pip's console script instead "
                      "of the launcher", "VERSION", IN_PROCESS, reference=go_version.key)
        for row in (go_version, ours, console):
            self.rows[row.key] = row
        for key in ("go-ptp", "kernel-hl-agent", "full-agent", "full-inproc"):
            subject = by_key[key]
            for verb in ("ADD", "DEL"):
                row = self._row(subject, f"{verb} x{CONCURRENCY}",
                                f"{key}/{verb}x{CONCURRENCY}",
                                label=f"{CONCURRENCY} concurrent: {subject.label}")
                if verb == "ADD" and subject.path == AGENT:
                    row.targets.append((targets.CONCURRENT, "p95"))

    def _row(self, subject: Subject, verb: str, key: str, label: str | None = None) -> Row:
        reference = None if subject.path == GO else f"go-ptp/{verb.replace(' x', 'x')}"
        row = Row(key, label or subject.label, verb, subject.path, reference=reference,
                  skipped=subject.skipped)
        self.rows[key] = row
        return row

    def _burst_rounds(self) -> set[int]:
        """Measured rounds after which a burst runs, spread evenly over the run."""
        runs, bursts = self.options.runs, self.options.bursts
        return {min(runs - 1, int((b + 0.5) * runs / bursts)) for b in range(bursts)}

    def _create_pods(self, made: list[Subject]) -> None:
        """A Pod for every publishing invocation; both control planes get as many Pods."""
        from e2e.bench import population
        run_ids = [f"w{n}" for n in range(self.options.warmup)] + \
                  [f"r{n}" for n in range(self.options.runs)]
        burst_ids = [f"b{b}-{j}" for b in range(self.options.bursts) for j in range(CONCURRENCY)]
        wanted: dict[str, list[str]] = {SMALL: [], LARGE: []}
        for subject in made:
            if subject.publishes and subject.cluster:
                wanted[subject.cluster] += [f"{subject.key}-{r}" for r in run_ids]
                if subject.key in ("full-agent", "full-inproc"):
                    wanted[subject.cluster] += [f"{subject.key}-{b}" for b in burst_ids]
        most = max(len(names) for names in wanted.values())
        for name, cluster in self.clusters.items():
            names = wanted[name] + [f"spare-{k}" for k in range(most - len(wanted[name]))]
            began = time.monotonic()
            with cluster.admin() as admin:
                self.pods[name] = population.bench_pods(admin, self.node, names)
            log(f"control plane {name}: {len(names)} bench Pods "
                f"({time.monotonic() - began:.0f} s)")
        if self.clusters:
            self.notes.append(
                f"Both control planes also hold the bench's own {most} Pods on the bench node "
                f"(one per publishing ADD, created beforehand); the 10 / "
                f"{self.options.objects:,} objects of each kind are other nodes' (other "
                f"routers; Pods and EndpointSlices half in the bench's namespace, half in "
                f"others).")

    # Measuring -------------------------------------------------------------------------------

    def _round(self, sequential: list[Subject], number: int, run_id: str,
               measured: bool) -> None:
        """Every subject once (ADD then DEL in a fresh netns), plus the VERSION rows."""
        steps: list[Subject | str] = [*sequential, *VERSION_STEPS]
        namespaces = {s.key: self.janitor.netns() for s in sequential}
        try:
            for step in _rotated(steps, number):
                if isinstance(step, str):
                    self._version(step, measured)
                else:
                    self._pair(step, namespaces[step.key], run_id, measured)
        finally:
            for netns in namespaces.values():
                self.janitor.remove(netns)

    def _version(self, which: str, measured: bool) -> None:
        executable, key = VERSION_STEPS[which]
        env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "VERSION"}
        done = spawn.run([str(self.workdir / executable)], env,
                         json.dumps(subjects.version_stanza()).encode(), VERSION_TIMEOUT)
        if measured:
            self._record(self.rows[key], done, _problem(done, "VERSION", needs_json=True))

    def _pair(self, subject: Subject, netns: Netns, run_id: str, measured: bool) -> None:
        container_id = f"bench-{self.token}-{subject.key}-{run_id}"
        pod = f"{subject.key}-{run_id}"
        added, result, problem = self._add(subject, netns, container_id, pod, "1")
        if measured:
            self._record(self.rows[f"{subject.key}/ADD"], added, problem,
                         Invocation(f"{subject.key}/ADD", "ADD", container_id,
                                    subject.path == AGENT))
        deleted, del_problem = self._del(subject, netns, container_id, pod, "1", result)
        self._after_agent_dels(subject)
        if measured and result is not None:
            self._record(self.rows[f"{subject.key}/DEL"], deleted, del_problem,
                         Invocation(f"{subject.key}/DEL", "DEL", container_id,
                                    subject.path == AGENT))

    def _add(self, subject: Subject, netns: Netns, container_id: str, pod: str,
             att: str) -> tuple[spawn.Execution, dict[str, Any] | None, str | None]:
        done = self._invoke(subject, "ADD", subject.stanza(att), container_id, netns, pod)
        problem = _problem(done, "ADD", needs_json=True)
        result = None
        if problem is None:
            result = json.loads(done.stdout)
        return done, result, problem

    def _del(self, subject: Subject, netns: Netns, container_id: str, pod: str, att: str,
             result: dict[str, Any] | None) -> tuple[spawn.Execution, str | None]:
        stanza = subject.stanza(att)
        if result is not None:
            stanza["prevResult"] = result  # as libcni sends DEL
        done = self._invoke(subject, "DEL", stanza, container_id, netns, pod)
        return done, _problem(done, "DEL", needs_json=False)

    def _invoke(self, subject: Subject, verb: str, stanza: dict[str, Any], container_id: str,
                netns: Netns, pod: str) -> spawn.Execution:
        args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE=vpc-attach-bench;K8S_POD_NAME={pod};"
                f"K8S_POD_INFRA_CONTAINER_ID={container_id}")
        if subject.publishes and subject.cluster:
            args += f";K8S_POD_UID={self.pods[subject.cluster][pod]}"
        env = subject.env(verb, container_id, netns.path, args)
        return spawn.run([str(subject.executable)], env, json.dumps(stanza).encode(),
                         INVOKE_TIMEOUT)

    def _burst(self, subject: Subject, burst: int) -> None:
        """32 ADDs at once (each in its own netns), then their 32 DELs at once."""
        members = [(j, f"b{burst}-{j}") for j in range(CONCURRENCY)]
        namespaces = [self.janitor.netns() for _ in members]
        try:
            def add(member: tuple[int, str]) -> tuple[float, float, Any]:
                j, run_id = member
                t0 = time.perf_counter()
                outcome = self._add(subject, namespaces[j],
                                    f"bench-{self.token}-{subject.key}-{run_id}",
                                    f"{subject.key}-{run_id}", base62.encode_base62(j + 1))
                return t0, time.perf_counter(), outcome

            added = _concurrently(add, members)
            row = self.rows[f"{subject.key}/ADDx{CONCURRENCY}"]
            for (_, run_id), (_, _, (done, _, problem)) in zip(members, added, strict=True):
                self._record(row, done, problem,
                             Invocation(row.key, "ADD", f"bench-{self.token}-{subject.key}-"
                                        f"{run_id}", subject.path == AGENT))
            row.walls_ms.append(_wall(added))

            def delete(member: tuple[int, str]) -> tuple[float, float, Any]:
                j, run_id = member
                t0 = time.perf_counter()
                outcome = self._del(subject, namespaces[j],
                                    f"bench-{self.token}-{subject.key}-{run_id}",
                                    f"{subject.key}-{run_id}", base62.encode_base62(j + 1),
                                    added[j][2][1])
                return t0, time.perf_counter(), outcome

            deleted = _concurrently(delete, members)
            self._after_agent_dels(subject)
            row = self.rows[f"{subject.key}/DELx{CONCURRENCY}"]
            for (j, run_id), (_, _, (done, problem)) in zip(members, deleted, strict=True):
                if added[j][2][1] is not None:
                    self._record(row, done, problem,
                                 Invocation(row.key, "DEL", f"bench-{self.token}-{subject.key}-"
                                            f"{run_id}", subject.path == AGENT))
            row.walls_ms.append(_wall(deleted))
        finally:
            for netns in namespaces:
                self.janitor.remove(netns)

    def _after_agent_dels(self, subject: Subject) -> None:
        """Outside any measurement: let the agent finish deleting what its DELs retired, so
        that kernel work overlaps no other row (the Go reference's in particular)."""
        if subject.path == AGENT and not kernel.reaper_done():
            log(f"{subject.key}: retired links still present after "
                f"{kernel.REAPER_TIMEOUT:.0f} s; the next rows may overlap their deletion")

    def _record(self, row: Row, done: spawn.Execution, problem: str | None,
                invocation: Invocation | None = None) -> None:
        with self._lock:
            if problem is not None:
                row.fail(problem)
                return
            row.samples.append(done.elapsed_ms)
            row.rss_kib.append(done.max_rss_kib)
            if invocation is not None:
                self.invocations.append(invocation)

    # After the rounds ------------------------------------------------------------------------

    def _read_plugin_logs(self, made: list[Subject]) -> None:
        """Attach each invocation's in-plugin duration; count agent rows it did not serve."""
        durations: dict[tuple[str, str], float] = {}
        agent_served: set[tuple[str, str]] = set()
        for agent in self.agents.values():
            if agent.process is None:
                continue
            for line in agent.process.verb_lines():
                if "verb" in line and "durationMs" in line:
                    key = (str(line["verb"]), str(line.get("containerID")))
                    durations[key] = float(line["durationMs"])
                    agent_served.add(key)
        for subject in made:
            path = self.workdir / "logs" / f"{subject.key}.log"
            if subject.path == IN_PROCESS and path.exists():
                for text in path.read_text().splitlines():
                    line = json.loads(text) if text.startswith("{") else {}
                    if "verb" in line and "durationMs" in line:
                        durations[(str(line["verb"]), str(line.get("containerID")))] = \
                            float(line["durationMs"])
        for invocation in self.invocations:
            key = (invocation.verb, invocation.container_id)
            row = self.rows[invocation.row]
            if invocation.via_agent and key not in agent_served:
                row.missed_agent += 1
            if key in durations:
                row.in_plugin_ms.append(durations[key])
        if any(r.missed_agent for r in self.rows.values()):
            self.notes.append("Some agent-row invocations were not served by the agent (they "
                              "fell back to in-process): those rows are marked and cannot pass.")

    def _memory(self) -> list[MemoryRow]:
        """Peak RSS of the executables per path, and each agent's resident set now."""
        def peaks(path: str, verbs: Sequence[str]) -> list[int]:
            return [k for r in self.rows.values() if r.path == path and r.verb in verbs
                    for k in r.rss_kib]
        pair = ("ADD", "DEL", f"ADD x{CONCURRENCY}", f"DEL x{CONCURRENCY}")
        agent_skip = None if any(a.problem is None for a in self.agents.values()) else \
            "no agent served this run"
        memory = [
            MemoryRow("vpc-attach executable, forwarding path (every ADD/DEL via the agent)",
                      peaks(AGENT, pair), targets.FORWARDING_RSS, skipped=agent_skip),
            MemoryRow("vpc-attach executable, in-process (every ADD/DEL)", peaks(IN_PROCESS, pair)),
            MemoryRow("vpc-attach executable, VERSION", self.rows["vpc-attach/VERSION"].rss_kib),
            MemoryRow("Go ptp executable (+ host-local), every ADD/DEL (reference)",
                      peaks(GO, pair)),
        ]
        time.sleep(1.0)  # let the last connection threads end
        for agent in self.agents.values():
            label = f"agent ({agent.name} control plane) steady VmRSS after the runs"
            if agent.process is None or agent.problem is not None:
                memory.append(MemoryRow(label, [], skipped=agent.problem))
                continue
            status = _proc_status(agent.process.proc.pid)
            memory.append(MemoryRow(label, [status.get("VmRSS", 0)],
                                    detail=f"peak VmHWM {status.get('VmHWM', 0) / 1024:.1f} MiB"))
        return memory

    def _machine(self) -> dict[str, Any]:
        from e2e.harness.cluster import build
        from e2e.harness.tools.gotools import PLUGINS_VERSION
        return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(),
                "kernel": platform.release(),
                "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "load_average": [round(self.load_before, 2), round(self.load_after, 2)],
                "python": platform.python_version(), "go_plugins": PLUGINS_VERSION,
                "kubernetes": build.KUBERNETES.version}

    def _settings(self) -> dict[str, Any]:
        return {"runs": self.options.runs, "warmup": self.options.warmup,
                "bursts": self.options.bursts, "concurrency": CONCURRENCY,
                "objects": {"small": SMALL_OBJECTS, "large": self.options.objects},
                "quick": self.options.quick, "percentile_method": "nearest-rank",
                "timeouts_s": {"invoke": INVOKE_TIMEOUT, "version": VERSION_TIMEOUT}}


# Helpers -------------------------------------------------------------------------------------

def _rotated(items: Sequence[T], number: int) -> list[T]:
    """items starting at position number (mod len): round-robin order, rotated per round."""
    if not items:
        return []
    shift = number % len(items)
    return [*items[shift:], *items[:shift]]


def _concurrently(work: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """work(item) for all items at once (released together by a barrier); results in order."""
    barrier = threading.Barrier(len(items), timeout=60)

    def released(item: T) -> U:
        barrier.wait()
        return work(item)

    pool = ThreadPoolExecutor(len(items), thread_name_prefix="bench-burst")
    futures = [pool.submit(released, item) for item in items]
    try:
        return [future.result() for future in futures]
    except BaseException:
        barrier.abort()
        while not all(f.done() for f in futures):  # kill what runs so the threads end
            spawn.kill_all()
            time.sleep(0.05)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _wall(outcomes: Sequence[tuple[float, float, Any]]) -> float:
    return (max(end for _, end, _ in outcomes) - min(start for start, _, _ in outcomes)) * 1000


def _problem(done: spawn.Execution, verb: str, needs_json: bool) -> str | None:
    """Why an invocation did not succeed, or None."""
    if done.timed_out:
        return f"{verb} timed out after {INVOKE_TIMEOUT:.0f} s"
    out = done.stdout.decode(errors="replace")
    if done.status != 0:
        return f"{verb} exit {done.status}: {_one_line(out)} {_one_line(done.stderr.decode())}"
    if needs_json:
        try:
            json.loads(out)
        except ValueError:
            return f"{verb} printed no JSON: {_one_line(out)}"
    return None


def _one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _load_average() -> float:
    """The 1-minute load average (other work competing for the CPUs)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM … of a process, in KiB."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Vm") and line.endswith("kB"):
                name, value = line.split(":", 1)
                values[name] = int(value.split()[0])
    except OSError:
        pass
    return values
