"""What one run measures: the subjects (each with its own VPC, /24 and IPAM data dir) and the
table's rows, with their Go reference and the issue-5 targets they answer to."""

from __future__ import annotations

from pathlib import Path

from e2e.bench import subjects, targets
from e2e.bench.report import Row
from e2e.bench.run import CONCURRENCY, LARGE, SMALL, SMALL_OBJECTS, Run
from e2e.bench.subjects import ADOPT, AGENT, FIRST, GO, IN_PROCESS, NO_CLAIM, Subject
from e2e.harness.kubevirt.standins import IFNAME
from e2e.harness.plugin import random_vpc

# key, label ({many}: the large control plane's objects of each kind), path, ipam, cluster
PLAN: tuple[tuple[str, str, str, str, str | None], ...] = (
    ("go-ptp", "Go ptp + host-local (reference)", GO, "host-local", None),
    ("kernel-hl-agent", "vpc-attach kernel-only, host-local", AGENT, "host-local", None),
    ("kernel-hl-inproc", "vpc-attach kernel-only, host-local", IN_PROCESS, "host-local", None),
    ("kernel-ipam-agent", "vpc-attach kernel-only, vpc-attach-ipam", AGENT, "vpc-attach-ipam",
     None),
    ("kernel-ipam-inproc", "vpc-attach kernel-only, vpc-attach-ipam", IN_PROCESS,
     "vpc-attach-ipam", None),
    # A pool shared by nodes: blocks claimed through the small control plane (issue 22).
    ("kernel-ipamcl-agent", "vpc-attach kernel-only, vpc-attach-ipam scope cluster",
     AGENT, "vpc-attach-ipam-cluster", None),
    ("full-agent", f"vpc-attach full (publishing), {SMALL_OBJECTS} objects of each kind",
     AGENT, "host-local", SMALL),
    ("full-inproc", f"vpc-attach full (publishing), {SMALL_OBJECTS} objects of each kind",
     IN_PROCESS, "host-local", SMALL),
    ("full-many-agent", "vpc-attach full (publishing), {many} objects of each kind",
     AGENT, "host-local", LARGE),
    ("full-many-inproc", "vpc-attach full (publishing), {many} objects of each kind",
     IN_PROCESS, "host-local", LARGE),
)
# The subjects measured in bursts as well.
CONCURRENT = ("go-ptp", "kernel-hl-agent", "full-agent", "full-inproc")
# Persistent IPs (SPEC §16): vpc-attach-ipam with allowPersistentIPs, publishing off, the Pods
# and their IPAMClaims in the small control plane (`claims`). key, label, path, which Pods.
PERSISTENT_IPS = "vpc-attach allowPersistentIPs, vpc-attach-ipam"
PERSISTENT_IP_PLAN: tuple[tuple[str, str, str, str], ...] = (
    ("pip-claim-agent", f"{PERSISTENT_IPS}: Pod of an IPAMClaim holding addresses (adopted)",
     AGENT, ADOPT),
    ("pip-claim-inproc", f"{PERSISTENT_IPS}: Pod of an IPAMClaim holding addresses (adopted)",
     IN_PROCESS, ADOPT),
    ("pip-first-agent", f"{PERSISTENT_IPS}: Pod of a new IPAMClaim (first allocation)",
     AGENT, FIRST),
    ("pip-first-inproc", f"{PERSISTENT_IPS}: Pod of a new IPAMClaim (first allocation)",
     IN_PROCESS, FIRST),
    ("pip-none-agent", f"{PERSISTENT_IPS}: Pod without an IPAMClaim", AGENT, NO_CLAIM),
    ("pip-none-inproc", f"{PERSISTENT_IPS}: Pod without an IPAMClaim", IN_PROCESS, NO_CLAIM),
)
POOL_ADDRESSES = 253  # a /24 less network, gateway and broadcast
KEYS = tuple(entry[0] for entry in PLAN) + tuple(entry[0] for entry in PERSISTENT_IP_PLAN)
REFERENCE = "go-ptp"


def selected(run: Run, key: str) -> bool:
    """Whether this run measures the subject (`--only`; the Go reference always)."""
    return not run.options.only or key == REFERENCE or key in run.options.only


def clusters_needed(only: frozenset[str]) -> set[str]:
    """The control planes the selected subjects need (`--only`; all without it)."""
    if not only:
        return {SMALL, LARGE}
    needed = {cluster or SMALL for key, _, _, ipam, cluster in PLAN
              if key in only and (cluster or ipam.endswith("cluster"))}
    if any(key in only for key, *_ in PERSISTENT_IP_PLAN):
        needed.add(SMALL)
    return needed


def make_subjects(run: Run, bin_dir: Path) -> list[Subject]:
    """Everything measured, each with its own VPC, /24 and IPAM data dir."""
    ipam_dir = run.workdir / "ipam"
    absent = {"VPC_ATTACH_HOST_CONFIG": str(run.workdir / "absent-host.json"),
              "VPC_ATTACH_IPAM_DATA_ROOT": str(ipam_dir)}  # where vpc-attach-ipam may write
    no_agent = {**absent, "VPC_ATTACH_AGENT_SOCKET": str(run.workdir / "no-agent.sock"),
                "VPC_ATTACH_LOCK_DIR": str(run.workdir / "locks"),
                "VPC_ATTACH_NODE_NAME": run.node}

    def via(cluster: str) -> dict[str, str]:
        # Only the socket: the agent knows its node, kubeconfig and lock dir (DaemonSet).
        return {**absent, "VPC_ATTACH_AGENT_SOCKET": str(run.agents[cluster].socket)
                if cluster in run.agents else str(run.workdir / "no-agent.sock")}

    def kubeconfig(cluster: str) -> dict[str, str]:
        found = run.clusters.get(cluster)
        return {"VPC_ATTACH_KUBECONFIG": str(found.plugin_kubeconfig)} if found else {}

    many = f"{run.options.objects:,}"
    made = []
    for index, (key, label, path, ipam_type, cluster) in enumerate(PLAN):
        if not selected(run, key):
            continue
        label = label.format(many=many)
        data = ipam_dir / key
        if path == GO:
            made.append(Subject(key, label, GO, bin_dir / "ptp",
                                subjects.ptp_stanza(data, index)))
            continue
        vpc = random_vpc()
        run.janitor.own_vpc(vpc)
        ipam = subjects.host_local(data, index) if ipam_type == "host-local" \
            else subjects.vpc_attach_ipam(data, index,
                                          cluster_scope=ipam_type.endswith("cluster"))
        publish = subjects.PUBLISH_IPV4 if cluster else subjects.KERNEL_ONLY
        agent_name = cluster or SMALL
        if path == AGENT:
            environ = via(agent_name)
        else:
            environ = {**no_agent, **(kubeconfig(agent_name) if cluster else {}),
                       "VPC_ATTACH_LOG_FILE": str(run.workdir / "logs" / f"{key}.log")}
        subject = Subject(key, label, path, bin_dir / "vpc-attach",
                          subjects.vpc_attach_stanza(vpc, ipam, publish), environ, vpc=vpc,
                          publishes=cluster is not None, cluster=cluster)
        needs = cluster or (SMALL if ipam_type.endswith("cluster") else None)
        if needs and needs not in run.clusters:
            subject.skipped = run.cluster_problem.get(needs, "no control plane")
        elif path == AGENT:
            agent = run.agents.get(agent_name)
            subject.skipped = agent.problem if agent else "no agent"
        made.append(subject)
    for index, (key, label, path, claims) in enumerate(PERSISTENT_IP_PLAN, start=len(PLAN)):
        if not selected(run, key):
            continue
        vpc = random_vpc()
        run.janitor.own_vpc(vpc)
        ipam = subjects.vpc_attach_ipam(ipam_dir / key, index)
        environ = via(SMALL) if path == AGENT else {
            **no_agent, **kubeconfig(SMALL),
            "VPC_ATTACH_LOG_FILE": str(run.workdir / "logs" / f"{key}.log")}
        subject = Subject(key, label, path, bin_dir / "vpc-attach",
                          subjects.vpc_attach_stanza(vpc, ipam, subjects.KERNEL_ONLY,
                                                     persistent_ips=True),
                          environ, vpc=vpc, cluster=SMALL, ifname=IFNAME, claims=claims)
        agent = run.agents.get(SMALL)
        if SMALL not in run.clusters:
            subject.skipped = run.cluster_problem.get(SMALL, "no control plane")
        elif path == AGENT and (agent is None or agent.problem):
            subject.skipped = agent.problem if agent else "no agent"
        elif claims == FIRST and run.options.warmup + run.options.runs > POOL_ADDRESSES:
            subject.skipped = (f"every ADD keeps an address for its claim: "
                               f"{run.options.warmup + run.options.runs} runs, a /24 holds "
                               f"{POOL_ADDRESSES}")
        made.append(subject)
    return made


def plan_rows(run: Run, made: list[Subject]) -> None:
    """The table's rows, their Go reference and the issue-5 targets they answer to."""
    by_key = {s.key: s for s in made}
    kernel_agent = {"kernel-hl-agent", "kernel-ipam-agent"}
    in_process = {"kernel-hl-inproc", "kernel-ipam-inproc", "full-inproc"}
    for subject in made:
        for verb in ("ADD", "DEL"):
            row = _row(run, subject, verb, f"{subject.key}/{verb}")
            if subject.key in kernel_agent:
                target = targets.KERNEL_ADD if verb == "ADD" else targets.KERNEL_DEL
                row.targets.append((target, f"ratio:go-ptp/{verb}"))
            if verb == "ADD" and subject.key in in_process:
                row.targets.append((targets.IN_PROCESS_ADD, "median"))
            if verb == "ADD" and subject.key == "full-agent":
                row.targets.append((targets.FULL_ADD, "median"))
            if verb == "ADD" and subject.key.startswith("full-many-"):
                baseline = subject.key.replace("full-many-", "full-")
                if baseline in by_key:  # not without it (`--only`)
                    row.targets.append((targets.SCALE, f"ratio:{baseline}/ADD"))
    go_version = Row("go-ptp/VERSION", "Go ptp start-up (reference)", "VERSION", GO)
    ours = Row("vpc-attach/VERSION", "vpc-attach start-up", "VERSION", IN_PROCESS,
               reference=go_version.key)
    console = Row("console/VERSION", "vpc-attach start-up, pip's console script instead "
                  "of the launcher", "VERSION", IN_PROCESS, reference=go_version.key)
    for row in (go_version, ours, console):
        run.rows[row.key] = row
    for key in CONCURRENT:
        if key not in by_key:
            continue
        subject = by_key[key]
        for verb in ("ADD", "DEL"):
            row = _row(run, subject, f"{verb} x{CONCURRENCY}", f"{key}/{verb}x{CONCURRENCY}",
                       label=f"{CONCURRENCY} concurrent: {subject.label}")
            if verb == "ADD" and subject.path == AGENT:
                row.targets.append((targets.CONCURRENT, "p95"))


def _row(run: Run, subject: Subject, verb: str, key: str, label: str | None = None) -> Row:
    reference = None if subject.path == GO else f"go-ptp/{verb.replace(' x', 'x')}"
    row = Row(key, label or subject.label, verb, subject.path, reference=reference,
              skipped=subject.skipped)
    run.rows[key] = row
    return row
