"""The agent's pass over many attachments (cni_plugin/policy/sync.py, enforce.py) writes only
what changed: a change to one policy leaves every other attachment's rules as they were, byte
for byte, and the periodic repair gives way to a change. nft contexts are stand-ins that keep
what each netns was sent."""

from __future__ import annotations

import ipaddress
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.networks import NetworkName
from cni_plugin.policy.compile import Endpoint, PodFacts, World
from cni_plugin.policy.enforce import Enforcer
from cni_plugin.policy.model import MULTI, parse_policy
from cni_plugin.policy.networks import PodKey
from cni_plugin.policy.records import LocalAttachment
from cni_plugin.policy.sync import repair, sync

NAD = NetworkName("ns1", "nad")
ADDRESSES = {"web": "10.0.0.1", "db": "10.0.0.2", "cache": "10.0.0.3", "api": "10.0.0.4"}


class SentScripts:
    """Stand-in nft contexts: the scripts each netns was sent, and the contexts opened."""

    def __init__(self) -> None:
        self.sent: dict[str, list[str]] = {}
        self.opened: list[str] = []
        self.deadlines: list[Deadline | None] = []  # each run's, in order

    def open(self, netns: str, _deadline: Deadline) -> Context:
        self.opened.append(netns)
        return Context(self.sent.setdefault(netns, []), self.deadlines)

    def since(self, before: dict[str, int]) -> dict[str, list[str]]:
        """What each netns was sent after `before` (counts from `counts`)."""
        return {netns: scripts[before.get(netns, 0):] for netns, scripts in self.sent.items()
                if scripts[before.get(netns, 0):]}

    def counts(self) -> dict[str, int]:
        return {netns: len(scripts) for netns, scripts in self.sent.items()}


class Context:
    def __init__(self, into: list[str], deadlines: list[Deadline | None]) -> None:
        self._into = into
        self._deadlines = deadlines

    def run(self, script: str, deadline: Deadline | None = None) -> str:
        self._into.append(script)
        self._deadlines.append(deadline)
        return ""

    def close(self) -> None:
        pass


def attachment(pod: str) -> LocalAttachment:
    return LocalAttachment(f"c-{pod}", "net1", "veth", pod, f"G{pod}", "v1", "1", 7,
                           PodKey("ns1", pod, f"uid-{pod}"), NAD, (ADDRESSES[pod],), "nad")


def policy(name: str, app: str, port: int, peers: dict[str, Any] | None = None) -> Any:
    return parse_policy({"metadata": {
        "name": name, "namespace": "ns1", "uid": f"uid-{name}",
        "annotations": {"k8s.v1.cni.cncf.io/policy-for": "ns1/nad"}},
        "spec": {"podSelector": {"matchLabels": {"app": app}}, "ingress": [
            {"from": [{"podSelector": peers or {}}], "ports": [{"port": port}]}]}}, MULTI)


def world(policies: list[Any], labels: dict[str, dict[str, str]]) -> World:
    return World(policies, {("ns1", pod): PodFacts("ns1", pod, pod_labels)
                            for pod, pod_labels in labels.items()}, {"ns1": {}},
                 [Endpoint("ns1", pod, NAD, "v1", (ipaddress.ip_address(ADDRESSES[pod]),))
                  for pod in labels])


LABELS = {"web": {"app": "web"}, "db": {"app": "db"}, "cache": {"app": "cache"}}


def test_a_change_to_one_policy_leaves_the_other_attachments_rules_byte_identical() -> None:
    kernel = SentScripts()
    enforcer = Enforcer(kernel.open)
    nodes = [attachment("web"), attachment("db"), attachment("cache")]
    first = sync(world([policy("to-db", "db", 5432), policy("to-web", "web", 80)], LABELS),
                 nodes, enforcer, Deadline(5))
    assert first.enforced == 2
    written = {netns: scripts[-1] for netns, scripts in kernel.sent.items()}
    assert "5432" in written["db"] and " 80 " in written["web"]  # both written whole
    assert "delete table" in written["cache"]  # selected by nothing: no table left
    before = kernel.counts()
    sync(world([policy("to-db", "db", 5433), policy("to-web", "web", 80)], LABELS), nodes,
         enforcer, Deadline(5))
    changed = kernel.since(before)
    assert list(changed) == ["db"]  # web and cache were sent nothing: their rules as they were
    assert "5433" in changed["db"][0] and "5432" not in changed["db"][0]
    assert kernel.sent["web"][-1] == written["web"]


def test_a_pod_coming_refills_the_sets_of_the_rules_that_select_it_and_no_more() -> None:
    kernel = SentScripts()
    enforcer = Enforcer(kernel.open)
    nodes = [attachment("web"), attachment("db")]
    policies = [policy("to-db", "db", 5432, {"matchLabels": {"role": "client"}}),
                policy("to-web", "web", 80)]
    sync(world(policies, {**LABELS, "api": {"app": "api"}}), nodes, enforcer, Deadline(5))
    before = kernel.counts()
    sync(world(policies, {**LABELS, "api": {"app": "api", "role": "client"}}), nodes, enforcer,
         Deadline(5))
    # db's rule admits the api Pod now: its set refilled, not a rule rewritten; web's rule
    # admits every Pod of the namespace, the api Pod already among them: nothing sent.
    assert kernel.since(before) == {"db": [
        "flush set inet vpc_attach_policy_net1 i0_4\n"
        "add element inet vpc_attach_policy_net1 i0_4 { 10.0.0.4/32 }\n"]}


def test_the_periodic_repair_rewrites_whole_and_gives_way_to_a_change() -> None:
    kernel = SentScripts()
    enforcer = Enforcer(kernel.open)
    nodes = [attachment("web"), attachment("db"), attachment("cache")]
    sync(world([policy("to-db", "db", 5432)], LABELS), nodes, enforcer, Deadline(5))
    whole = kernel.sent["db"][-1]
    before, opened = kernel.counts(), len(kernel.opened)
    due = {node.key for node in nodes}
    asked = iter([False, False, True])  # a change comes after the second attachment
    repair(nodes, enforcer, due, lambda: next(asked), Deadline(5))
    assert kernel.since(before) == {"web": ["table inet vpc_attach_policy_net1 {}\n"
                                            "delete table inet vpc_attach_policy_net1\n"],
                                    "db": [whole]}
    assert due == {"c-cache/net1"} and len(kernel.opened) == opened + 2  # new contexts
    repair(nodes, enforcer, due, lambda: False, Deadline(5))
    assert not due and list(kernel.since(before)) == ["web", "db", "cache"]
    before = kernel.counts()
    sync(world([policy("to-db", "db", 5432)], LABELS), nodes, enforcer, Deadline(5))
    assert kernel.since(before) == {}  # repaired is still known: nothing to write


def test_a_context_kept_from_an_earlier_pass_runs_within_the_current_passs_deadline() -> None:
    kernel = SentScripts()
    enforcer = Enforcer(kernel.open)
    nodes = [attachment("db")]
    first, second = Deadline(5), Deadline(7)
    sync(world([policy("to-db", "db", 5432)], LABELS), nodes, enforcer, first)
    opened = len(kernel.opened)
    sync(world([policy("to-db", "db", 5433)], LABELS), nodes, enforcer, second)
    assert len(kernel.opened) == opened  # the first pass's context, kept
    assert kernel.deadlines == [first, second]  # each write within its own pass's deadline
