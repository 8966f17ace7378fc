"""One cluster session per verb (issue 31): ADD, CHECK, STATUS, GC and DEL each open at most one
API client and reuse its connection for every step (tenancy, publishing, rollback), and through
a warm node agent they open no new connection to the API server at all.

Counted on the server side by the fault proxy in front of the API server (the plugin runs in a
process of its own): the TCP connections it accepted during the verb, and the connections that
carried the verb's requests (a `KubeClient` has one connection, so that is the clients the verb
used); and by the plugin's debug line for each session a verb opens."""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import plugin as plugin_module
from e2e.harness.faults import ProxiedCluster, Seen, start_proxy
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, host_local, with_prev
from e2e.harness.publishing import Node, create_pod, delete_pod, make_node
from e2e.harness.report import report
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
SESSION_LINE = "cluster session opened for container "


@dataclass(frozen=True)
class Reach:
    """How one verb reached the API server."""

    sessions: int  # cluster sessions the plugin says it opened for the container
    clients: int  # distinct connections that carried the verb's requests
    new_connections: int  # TCP connections accepted during the verb
    requests: int  # the verb's requests (watches and the agent's Events aside)


def _verbs_reach(kube: Kube, proxied: ProxiedCluster, plugin: Plugin, node: Node, vpc: str,
                 tmp_path: Path, log: Path, tag: str, via_agent: bool) -> dict[str, Reach]:
    """ADD, CHECK, STATUS, GC and DEL of one Pod's attachment, each verb's reach."""
    pod = f"s-{tag}-{secrets.token_hex(3)}"
    uid = create_pod(kube, pod, node.name)
    container = f"ctr-{pod}"
    conf = base_conf(vpc, "1", ipam=host_local(tmp_path / f"ipam-{tag}", "fd00:5e::/64"))
    conf.pop("publish")  # the defaults: BGP and an IPv6 EndpointSlice
    reach: dict[str, Reach] = {}
    with temporary_netns("vpa-ses") as netns:
        def run(verb: str, config: dict[str, Any]) -> Any:
            mark, accepted = len(proxied.proxy.seen()), proxied.proxy.accepted()
            lines = _session_lines(log, container)
            answer = plugin.ok(verb, config, container_id=container, netns=netns,
                               CNI_ARGS=node.cni_args(pod, uid))
            # The proxy records a request once it relayed the answer: wait for the last one.
            wait_until(f"the proxy to record {verb}'s requests",
                       lambda: proxied.proxy.in_flight() == 0, 10, interval=0.05)
            if via_agent and verb == "ADD":
                # The agent's Events writer posts VPCAttached after the answer, on a pooled
                # client of its own: let it finish, so its requests count for no verb.
                wait_until("the agent to write the ADD's Event",
                           lambda: any(s.resource == "events"
                                       for s in proxied.proxy.seen()[mark:]), 15)
                wait_until("the proxy to record the Event", lambda: proxied.proxy.in_flight()
                           == 0, 10, interval=0.05)
            seen = [s for s in proxied.proxy.seen()[mark:] if _the_verbs(s)]
            reach[verb] = Reach(_session_lines(log, container) - lines,
                                len({s.connection for s in seen}),
                                proxied.proxy.accepted() - accepted, len(seen))
            return answer

        result = run("ADD", conf)
        run("CHECK", with_prev(conf, result))
        run("STATUS", conf)
        run("GC", {**conf, "cni.dev/valid-attachments": [
            {"containerID": container, "ifname": "eth0"}]})
        run("DEL", with_prev(conf, result))
    delete_pod(kube, pod)
    return reach


def _the_verbs(seen: Seen) -> bool:
    """A request of the verb: not a watch (the agent's caches), not an Event (the agent's
    writer, after the answer)."""
    return "watch=1" not in seen.path and seen.resource != "events"


def _session_lines(log: Path, container: str) -> int:
    if not log.exists():
        return 0
    count = 0
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == SESSION_LINE + container:
            count += 1
    return count


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
        _verbs_reach(kube, proxied, plugin, node, vpc, tmp_path, log, "warm", agent is not None)
        reach = _verbs_reach(kube, proxied, plugin, node, vpc, tmp_path, log, "counted",
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
