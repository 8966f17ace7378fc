"""One cluster session per verb (issue 31): ADD, CHECK, STATUS, GC and DEL each open at most one
API client and reuse its connection for every step (tenancy, publishing, rollback; issue 38: the
IPAMBlocks of a `scope: cluster` pool and the IPAMClaim of KubeVirt's persistent IPs too), and
through a warm node agent they open no new connection to the API server at all; and one
deadline per verb (issue 38).

Counted on the server side by the fault proxy in front of the API server (the plugin runs in a
process of its own): the TCP connections it accepted during the verb, and the connections that
carried the verb's requests (a `KubeClient` has one connection, so that is the clients the verb
used); and by the plugin's debug line for each session a verb opens. The deadlines an ADD starts
are counted in-process (the ADD run in this process): every `Deadline` made during it, by the
moment it starts from (the forward part of a deadline and its rollback share it)."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import plugin as plugin_module
from e2e.harness.faults import start_proxy
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.standins import IFNAME, claims_namespace
from e2e.harness.plugin import Plugin, with_prev
from e2e.harness.publishing import make_node
from e2e.harness.report import report
from e2e.harness.sessions import (
    VmNetwork,
    add_in_this_process,
    add_reach,
    agent_watches_router_instances,
    deadlines_started,
    node_object,
    verbs_reach,
    vm_network_of,
)

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]


def test_each_verb_opens_one_api_client_and_a_warm_agent_no_connection(
        kube: Kube, cluster: Any, plugin: Plugin, agent_socket: str, vpc: str, tmp_path: Path,
        pytestconfig: pytest.Config) -> None:
    proxied = start_proxy(cluster, tmp_path)
    try:
        node = make_node(kube, cluster, plugin)
        plugin.environ.update({"VPC_ATTACH_KUBECONFIG": str(proxied.kubeconfig),
                               "VPC_ATTACH_LOG_LEVEL": "debug"})
        agent = agent_socket if plugin_module.VIA_AGENT else None
        if agent is None:
            log = tmp_path / "plugin.log"
            plugin.environ["VPC_ATTACH_LOG_FILE"] = str(log)
        else:  # the session agent's own log (AgentProcess keeps it next to its socket)
            log = Path(agent).with_name("agent.log")
        # The first round warms the agent for this kubeconfig (its pool, its watches).
        verbs_reach(kube, proxied, plugin, node, vpc, tmp_path, log, "warm", agent is not None)
        reach = verbs_reach(kube, proxied, plugin, node, vpc, tmp_path, log, "counted",
                             agent is not None)
    finally:
        proxied.stop()
    path = "agent" if agent else "in-process"
    report(pytestconfig, f"API sessions per verb ({path})",
           tmp_path / f"api-sessions-{path}.json", {verb: asdict(r) for verb, r in reach.items()})
    for verb, r in reach.items():
        assert r.requests > 0 or agent, (verb, r)
        assert r.sessions == 1, (verb, r)
        assert r.clients == (1 if r.requests else 0), (verb, r)
        if agent:
            assert r.new_connections == 0, (verb, r)
        else:
            assert r.new_connections == 1, (verb, r)


def test_a_cluster_pool_add_with_an_ipamclaim_opens_one_session_one_client_one_deadline(
        kube: Kube, cluster: Any, plugin: Plugin, agent_socket: str, vpc: str, tmp_path: Path,
        pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A VM's Pod in a `scope: cluster` pool with KubeVirt's persistent IPs: its ADD claims a
    block (the Node, the pool's IPAMBlocks, the network's IPAMClaims, a create) and reads and
    writes the claim, besides tenancy and publishing, all on the verb's one session and by its
    one deadline. In-process, the counted ADD runs in this process, where its deadlines are
    counted; the first VM warms the agent for this kubeconfig."""
    agent = agent_socket if plugin_module.VIA_AGENT else None
    proxied = start_proxy(cluster, tmp_path)
    deadlines: set[float] | None = None
    try:
        node = make_node(kube, cluster, plugin)
        plugin.environ.update({"VPC_ATTACH_KUBECONFIG": str(proxied.kubeconfig),
                               "VPC_ATTACH_LOG_LEVEL": "debug",
                               "VPC_ATTACH_IPAM_DATA_ROOT": str(tmp_path)})
        log = Path(agent).with_name("agent.log") if agent else tmp_path / "plugin.log"
        if agent is None:
            plugin.environ["VPC_ATTACH_LOG_FILE"] = str(log)
        with node_object(kube, node.name), claims_namespace(kube) as namespace, \
                contextlib.ExitStack() as netns_of_each:
            added: list[tuple[VmNetwork, str, Any]] = []
            try:
                for tag, attachment in (("warm", "61"), ("counted", "62")):
                    vm = vm_network_of(kube, node, namespace, vpc, tmp_path / "ipam", tag,
                                     attachment)
                    netns = netns_of_each.enter_context(temporary_netns("vpa-ses"))

                    def add(vm: VmNetwork = vm, netns: str = netns) -> Any:
                        return plugin.ok("ADD", vm.conf, container_id=vm.container, netns=netns,
                                         ifname=IFNAME, CNI_ARGS=vm.cni_args)

                    def add_here(vm: VmNetwork = vm, netns: str = netns) -> Any:
                        return add_in_this_process(plugin, vm, netns, capsys)

                    if agent is None and tag == "counted":
                        with deadlines_started(monkeypatch) as deadlines:
                            result, reach, seen = add_reach(proxied, log, vm.container, False,
                                                             add_here)
                    else:
                        result, reach, seen = add_reach(proxied, log, vm.container,
                                                         agent is not None, add)
                    added.append((vm, netns, result))
                    if agent is not None and tag == "warm":  # as warm as a running node's
                        agent_watches_router_instances(proxied, plugin, vm.conf)
                    # What the ADD had to do on the API: claim a block, write the claim.
                    assert any(s.method == "POST" and s.resource == "ipamblocks"
                               for s in seen), seen
                    assert any(s.method == "PUT" and s.resource == "ipamclaims"
                               for s in seen), seen
            finally:
                for vm, netns, result in added:
                    plugin.ok("DEL", with_prev(vm.conf, result), container_id=vm.container,
                              netns=netns, ifname=IFNAME)
    finally:
        proxied.stop()
    path = "agent" if agent else "in-process"
    counted = {**asdict(reach), "deadlines": None if deadlines is None else len(deadlines)}
    report(pytestconfig, f"API sessions of a cluster-pool ADD with an IPAMClaim ({path})",
           tmp_path / f"api-sessions-claim-{path}.json", counted)
    # The counted ADD's requests, by the connection that carried each: who opened a second.
    carried = "; ".join(f"{s.connection} {s.method} {s.resource}/{s.name} {s.path}" for s in seen)
    assert (reach.sessions, reach.clients) == (1, 1), (reach, carried)
    assert reach.new_connections == (0 if agent else 1), (reach, carried)
    if deadlines is not None:
        assert len(deadlines) == 1, f"{len(deadlines)} deadlines started during one ADD"
