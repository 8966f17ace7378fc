"""Kubernetes Events on the Pod from the node agent (SPEC §12), read back through the official
client from the real API server: `VPCAttached` after an ADD, one `VPCAttachFailed` whose series
counts the repeats, and none where the API denies `events` (the ADD succeeds all the same)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import AgentProcess
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, host_local, with_prev
from e2e.harness.publishing import create_pod, make_node
from e2e.harness.rbac import identity_without
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster]
CONTROLLER = "vpc-attach.datum.net/agent"


def pod_events(kube: Kube, pod: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The events.k8s.io/v1 Events regarding a Pod."""
    return [event for event in kube.list(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
            if (event.get("regarding") or {}).get("name") == pod]


def kubectl_events(events: list[dict[str, Any]]) -> str:
    """The Events as `kubectl events` lists them (times absolute)."""
    rows = [("LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE")]
    for event in sorted(events, key=lambda e: e["eventTime"]):
        series = event.get("series")
        seen = series["lastObservedTime"] if series else event["eventTime"]
        if series:
            seen += f" (x{series['count']} since {event['eventTime']})"
        rows.append((seen, event["type"], event["reason"],
                     f"pod/{event['regarding']['name']}", event["note"]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("   ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                                 row[4]]) for row in rows)


def test_adds_through_the_agent_record_events_on_the_pod(
        kube: Kube, cluster: Any, plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    attached, failing = f"ev-ok-{secrets.token_hex(3)}", f"ev-bad-{secrets.token_hex(3)}"
    uid = create_pod(kube, attached, node.name)
    create_pod(kube, failing, node.name)
    (tmp_path / "agent").mkdir()
    conf = base_conf(vpc, "1", ipam=host_local(tmp_path / "ipam", "fd00:e7::/64"))
    conf.pop("publish")  # published too: a full ADD
    with AgentProcess(tmp_path / "agent") as agent:
        env = {"VPC_ATTACH_AGENT_SOCKET": str(agent.socket)}
        # No K8S_POD_UID: the agent finds the Pod's UID itself (for `kubectl describe pod`).
        result = plugin.ok("ADD", conf, container_id="ev-ok", netns=netns,
                           CNI_ARGS=node.cni_args(attached), **env)
        for _ in range(3):  # the kubelet retrying a sandbox whose network fails
            answer = plugin.call("ADD", {**conf, "mtu": 1}, container_id="ev-bad", netns=netns,
                                 CNI_ARGS=node.cni_args(failing), **env)
            assert answer.code == 7
        wait_until("the VPCAttached Event", lambda: len(pod_events(kube, attached)) == 1)
        wait_until("three failures counted in one Event's series", lambda: [
            (e.get("series") or {}).get("count") for e in pod_events(kube, failing)] == [3])
        plugin.ok("DEL", with_prev(conf, result), container_id="ev-ok", netns=netns,
                  CNI_ARGS=node.cni_args(attached), **env)

    [ok] = pod_events(kube, attached)
    assert (ok["type"], ok["reason"], ok["action"]) == ("Normal", "VPCAttached", "Attach")
    assert (ok["reportingController"], ok["reportingInstance"]) == (CONTROLLER, node.name)
    assert ok["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                               "name": attached, "uid": uid}
    addresses = [ip["address"] for ip in result["ips"]]
    assert ok["note"] == f"VPC {vpc} attachment 1 attached as eth0: {', '.join(addresses)}"
    [bad] = pod_events(kube, failing)
    assert (bad["type"], bad["reason"]) == ("Warning", "VPCAttachFailed")
    assert bad["note"].startswith(f"VPC {vpc} attachment 1 on eth0: ADD failed with CNI "
                                  "error 7: ")
    # The core/v1 view (`kubectl get events`, `kubectl describe pod`) has the same series.
    core = kube.get(f"/api/v1/namespaces/default/events/{bad['metadata']['name']}")
    assert core is not None and core["series"]["count"] == 3
    assert (core["involvedObject"]["kind"], core["involvedObject"]["name"]) == ("Pod", failing)
    print("\n" + kubectl_events([ok, bad]))  # for the operations guide and the issue


def test_where_the_api_denies_events_the_add_succeeds_and_none_is_written(
        kube: Kube, cluster: Any, plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    pod = f"ev-denied-{secrets.token_hex(3)}"
    create_pod(kube, pod, node.name)
    (tmp_path / "agent").mkdir()
    conf = base_conf(vpc, "2", ipam=host_local(tmp_path / "ipam", "fd00:e8::/64"))
    with identity_without(kube, cluster, tmp_path, {("events.k8s.io", "events")}) as kubeconfig, \
            AgentProcess(tmp_path / "agent") as agent:
        env = {"VPC_ATTACH_AGENT_SOCKET": str(agent.socket),
               "VPC_ATTACH_KUBECONFIG": str(kubeconfig)}
        result = plugin.ok("ADD", conf, container_id="ev-denied", netns=netns,
                           CNI_ARGS=node.cni_args(pod), **env)
        wait_until("the agent to log the refused Event", lambda: any(
            f"could not record VPCAttached on Pod default/{pod}" in line and "403" in line
            for line in agent.log.read_text().splitlines()), 30)
        plugin.ok("DEL", with_prev(conf, result), container_id="ev-denied", netns=netns,
                  CNI_ARGS=node.cni_args(pod), **env)
    assert pod_events(kube, pod) == []
