"""The run's node agents: one `vpc-attach agent` per control plane, each probed with a DEL of
nothing before any row relies on it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from e2e.bench import spawn, subjects
from e2e.bench.run import LARGE, SMALL, Agent, Run, log, one_line
from e2e.harness.agentproc import AgentProcess
from e2e.harness.plugin import random_vpc

AGENT_PROBE_TIMEOUT = 30.0


def start_agents(run: Run, bin_dir: Path) -> None:
    """One `vpc-attach agent` per control plane (kernel-only rows use the first)."""
    for name in (SMALL, LARGE):
        if name == LARGE and name not in run.clusters:
            continue
        directory = run.workdir / f"agent-{name}"
        directory.mkdir()
        agent = Agent(name, directory / "agent.sock")
        run.agents[name] = agent
        # The IPAM root too: the agent frees deleted IPAMClaims' records under it, never
        # under the host's own.
        env = {"VPC_ATTACH_HOST_CONFIG": str(run.workdir / "absent-host.json"),
               "VPC_ATTACH_IPAM_DATA_ROOT": str(run.workdir / "ipam"),
               "VPC_ATTACH_LOCK_DIR": str(run.workdir / "locks"),
               "VPC_ATTACH_NODE_NAME": run.node}
        if name in run.clusters:
            env["VPC_ATTACH_KUBECONFIG"] = str(run.clusters[name].plugin_kubeconfig)
        try:
            agent.process = AgentProcess(directory, env=env).start()
        except Exception as exc:
            agent.problem = f"`vpc-attach agent` did not start: {one_line(str(exc))}"
            log(agent.problem)
            continue
        agent.problem = _probe(run, agent, bin_dir)


def stop_agents(run: Run) -> None:
    """Stop every agent this run started (keeps going past a failure)."""
    for agent in run.agents.values():
        if agent.process is not None:
            try:
                agent.process.stop(timeout=30)
            except Exception as exc:  # keep cleaning up
                log(f"stopping agent {agent.name}: {exc}")


def _probe(run: Run, agent: Agent, bin_dir: Path) -> str | None:
    """A DEL of nothing through the agent: does it answer and log it?"""
    container_id = f"bench-{run.token}-probe-{agent.name}"
    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "DEL",
           "CNI_CONTAINERID": container_id, "CNI_NETNS": "", "CNI_IFNAME": "eth0",
           "CNI_PATH": str(bin_dir),
           "VPC_ATTACH_HOST_CONFIG": str(run.workdir / "absent-host.json"),
           "VPC_ATTACH_AGENT_SOCKET": str(agent.socket)}
    ipam = subjects.host_local(run.workdir / "ipam" / "probe", 250)
    stanza = subjects.vpc_attach_stanza(random_vpc(), ipam, subjects.KERNEL_ONLY)("1")
    done = spawn.run([str(bin_dir / "vpc-attach")], env, json.dumps(stanza).encode(),
                     AGENT_PROBE_TIMEOUT)
    if done.status != 0:
        return f"the agent's probe DEL failed: {one_line(done.stdout.decode())}"
    if not any(line.get("containerID") == container_id
               for line in agent.process.verb_lines()):
        return "the probe DEL was not served by the agent (the executable ran it in-process)"
    return None
