"""How a verb reaches the API server, counted (`e2e/test_api_sessions.py`): on the server side by
the fault proxy in front of the API server (the connections that carried the verb's requests: a
`KubeClient` has one connection, so that is the clients the verb used; and which of them it
accepted during the verb, not the agent's watches' or Events writer's), by the plugin's debug
line for each session a verb opens, and, for an ADD run in this process, the deadlines it
starts (every `Deadline` made during it, by the moment it starts from: the forward part of a
deadline and its rollback share it). The scenes: a Pod's five verbs (`verbs_reach`), and a VM
network of its own with a claim and a virt-launcher Pod in a `scope: cluster` pool
(`vm_network_of`)."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.stdio import answer_stdio
from e2e.harness.faults import ProxiedCluster, Seen
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.scene import vm_network
from e2e.harness.kubevirt.standins import (
    IFNAME,
    kubevirt_creates_claim,
    kubevirt_starts_launcher,
)
from e2e.harness.nodes import NODES
from e2e.harness.plugin import Plugin, base_conf, host_local, with_prev
from e2e.harness.publishing import Node, create_pod, delete_pod
from e2e.harness.wait import wait_until

SESSION_LINE = "cluster session opened for container "


@dataclass(frozen=True)
class Reach:
    """How one verb reached the API server."""

    sessions: int  # cluster sessions the plugin says it opened for the container
    clients: int  # distinct connections that carried the verb's requests
    # Connections accepted during the verb that carried its requests (the agent's own, a
    # watch's or the Events writer's after the answer, are not the verb's).
    new_connections: int
    requests: int  # the verb's requests (watches and the agent's Events aside)


def verbs_reach(kube: Kube, proxied: ProxiedCluster, plugin: Plugin, node: Node, vpc: str,
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
            lines = session_lines(log, container)
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
            seen = [s for s in proxied.proxy.seen()[mark:] if the_verbs(s)]
            reach[verb] = Reach(session_lines(log, container) - lines,
                                len({s.connection for s in seen}),
                                len({s.connection for s in seen if s.connection > accepted}),
                                len(seen))
            return answer

        result = run("ADD", conf)
        run("CHECK", with_prev(conf, result))
        run("STATUS", conf)
        run("GC", {**conf, "cni.dev/valid-attachments": [
            {"containerID": container, "ifname": "eth0"}]})
        run("DEL", with_prev(conf, result))
    delete_pod(kube, pod)
    return reach


def the_verbs(seen: Seen) -> bool:
    """A request of the verb: not a watch (the agent's caches), not an Event (the agent's
    writer, after the answer)."""
    return "watch=1" not in seen.path and seen.resource != "events"


def session_lines(log: Path, container: str) -> int:
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


@contextlib.contextmanager
def node_object(kube: Kube, name: str) -> Iterator[None]:
    """The Node the node's IPAMBlocks belong to (deleted after: its blocks go with it)."""
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield
    finally:
        kube.delete(f"{NODES}/{name}")


@contextlib.contextmanager
def deadlines_started(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[float]]:
    """The moments every `Deadline` made in this process during the block starts from."""
    origins: set[float] = set()
    made = Deadline.__init__

    def counted(self: Deadline, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        origins.add(self.started)

    with monkeypatch.context() as patched:
        patched.setattr(Deadline, "__init__", counted)
        yield origins


def add_in_this_process(plugin: Plugin, vm: VmNetwork, netns: str,
                     capsys: pytest.CaptureFixture[str]) -> Any:
    """The executable's in-process path of vm's ADD, run in this process; its answer."""
    environ = plugin.env("ADD", vm.container, netns, IFNAME, CNI_ARGS=vm.cni_args)
    with pytest.raises(SystemExit) as exited:
        answer_stdio(environ, json.dumps(vm.conf).encode())
    out = capsys.readouterr().out
    assert exited.value.code == 0, out
    return json.loads(out)


@dataclass
class VmNetwork:
    """One VM's network on the node: its own pool, claim and virt-launcher Pod."""

    conf: dict[str, Any]
    container: str
    cni_args: str


def vm_network_of(kube: Kube, node: Node, namespace: str, vpc: str, data_dir: Path,
                tag: str, attachment: str) -> VmNetwork:
    """A VM network of its own (so its ADD claims a block of its pool), the claim
    ipam-extensions makes for it and the VM's virt-launcher Pod on node."""
    conf = vm_network(vpc, data_dir, ipam={"scope": "cluster"})
    # A network (so a pool) and a VPC attachment (so a host link) of its own.
    conf["name"], conf["vpcattachment"] = f"vms-{tag}-{vpc}", attachment
    conf.pop("publish")  # the defaults: BGP and an IPv6 EndpointSlice
    claim = kubevirt_creates_claim(kube, namespace, conf["name"], vm=f"vm-{tag}")
    pod, uid = kubevirt_starts_launcher(kube, namespace, node.name,
                                        str(claim["metadata"]["name"]), f"vm-{tag}")
    return VmNetwork(conf, f"ctr-{pod}", node.cni_args(pod, uid, namespace))


def add_reach(proxied: ProxiedCluster, log: Path, container: str, via_agent: bool,
               add: Callable[[], Any]) -> tuple[Any, Reach, list[Seen]]:
    """An ADD's answer, how it reached the API server, and its requests."""
    mark, accepted = len(proxied.proxy.seen()), proxied.proxy.accepted()
    lines = session_lines(log, container)
    result = add()
    wait_until("the proxy to record the ADD's requests",
               lambda: proxied.proxy.in_flight() == 0, 10, interval=0.05)
    if via_agent:  # the agent's Event, written after the answer, counts for no verb
        wait_until("the agent to write the ADD's Event",
                   lambda: any(s.resource == "events" for s in proxied.proxy.seen()[mark:]), 15)
        wait_until("the proxy to record the Event", lambda: proxied.proxy.in_flight() == 0, 10,
                   interval=0.05)
    seen = [s for s in proxied.proxy.seen()[mark:] if the_verbs(s)]
    return result, Reach(session_lines(log, container) - lines, len({s.connection for s in seen}),
                         len({s.connection for s in seen if s.connection > accepted}),
                         len(seen)), seen


def agent_watches_router_instances(proxied: ProxiedCluster, plugin: Plugin,
                                   conf: dict[str, Any]) -> None:
    """Through the agent: STATUS, as containerd polls it, until the agent's watch of the node's
    routers is in sync and has started the watch of the router's VRF instances, whose first
    listing is then seen (STATUS itself never lists instances). The first ADD after a new
    kubeconfig finds the routers' watch still listing and asks the API, so it starts no
    instance watch: without this the next ADD's window would count that watch's listing."""
    mark = len(proxied.proxy.seen())

    def instances_listed() -> bool:
        plugin.ok("STATUS", conf)
        wait_until("the proxy to record STATUS's requests",
                   lambda: proxied.proxy.in_flight() == 0, 10, interval=0.05)
        return any(s.resource == "bgpvrfinstances" and s.name is None and "routerRef" in s.path
                   for s in proxied.proxy.seen()[mark:])
    wait_until("the agent's watch of the router's VRF instances to list them", instances_listed,
               30, interval=0.2)
