"""Parse once, carry the type (issue 31): one ADD decodes its network config and its CNI_ARGS
once, and reads the node's host file once (issue 38), in process as through the agent. The log
line, the agent's metrics and the Pod's Event read the `Invocation` the dispatcher's `Outcome`
carries, never the raw request again.

Counted: every `json.loads` of the config's text anywhere in this process, and every cut of
the CNI_ARGS text into pairs (a `str` that counts its `split` and `partition`). The IPAM
delegate is the reference `host-local`, run as a process of its own, as any exec'd delegate is.
Both paths run in this process (the agent as the in-repo server on a thread), so this test
needs no agent pass.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, SupportsIndex

import pytest

from cni_plugin.agent import client, events, server
from cni_plugin.agent.events import ATTACHED, EventRecorder, PodEvent
from cni_plugin.agent.metrics import AgentMetrics
from cni_plugin.agent.reaper import Reaper
from cni_plugin.agent.server import Agent
from cni_plugin.agent.warm import WarmCluster
from cni_plugin.core.request import Request
from cni_plugin.dispatch import Outcome, run
from cni_plugin.stdio import answer_stdio
from e2e.harness import kernel
from e2e.harness.plugin import base_conf, host_local, with_prev

pytestmark = pytest.mark.root
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-0;K8S_POD_UID=u-1"
SERVE_SECONDS = 30.0


class CountedArgs(str):
    """CNI_ARGS text that counts how often it is cut into pairs."""

    counts: Counter[str]

    def __new__(cls, text: str, counts: Counter[str]) -> CountedArgs:
        made = super().__new__(cls, text)
        made.counts = counts
        return made

    def split(self, sep: str | None = None, maxsplit: SupportsIndex = -1) -> list[str]:
        self.counts["CNI_ARGS"] += 1
        return super().split(sep, maxsplit)

    def partition(self, sep: str, /) -> tuple[str, str, str]:
        self.counts["CNI_ARGS"] += 1
        return super().partition(sep)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts of decodes: "stdin" for every `json.loads` of a vpc-attach network config,
    "CNI_ARGS" for every cut of a `CountedArgs`."""
    counts: Counter[str] = Counter()
    loads = json.loads

    def counting_loads(text: str | bytes | bytearray, *args: Any, **kwargs: Any) -> Any:
        decoded = loads(text, *args, **kwargs)
        if isinstance(decoded, dict) and decoded.get("type") == "vpc-attach":
            counts["stdin"] += 1
        return decoded

    monkeypatch.setattr(json, "loads", counting_loads)
    yield counts


def _environ(tmp_path: Path, cni_bin: Path, netns: str, container_id: str,
             counts: Counter[str] | None = None, command: str = "ADD") -> dict[str, str]:
    args = CountedArgs(ARGS, counts) if counts is not None else ARGS
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0", "CNI_PATH": str(cni_bin), "CNI_ARGS": args,
            "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent-host.json"),
            "VPC_ATTACH_LOCK_DIR": str(tmp_path / "locks"),
            "VPC_ATTACH_LOG_FILE": str(tmp_path / "vpc-attach.log"),  # the verb line is written
            # Events are due (a Pod, a kubeconfig and a node), though no API server listens:
            # the recorder gives the write up after the count.
            "VPC_ATTACH_KUBECONFIG": str(tmp_path / "absent.kubeconfig"),
            "VPC_ATTACH_NODE_NAME": "node-1", "VPC_ATTACH_TENANCY": "off",
            # MultiNetworkPolicy (on by default) reads the Pod before any kernel change, and
            # no API server is here: this ADD asks none (policy: e2e/test_policy_enforcement)
            "VPC_ATTACH_MULTI_NETWORK_POLICY": "off"}


@contextlib.contextmanager
def serving_agent(socket: Path) -> Iterator[Agent]:
    """The in-repo agent with metrics and Events, serving on a thread until the block ends;
    then stopped and drained (every answered verb counted, every Event tried)."""
    cluster = WarmCluster()
    reaper = Reaper()
    agent = Agent(str(socket), cluster, reaper, AgentMetrics(reaper.pending),
                  EventRecorder(cluster))
    serving = threading.Thread(target=agent.serve, name="agent", daemon=True)
    serving.start()
    try:
        yield agent
    finally:
        agent.stop()
        serving.join(SERVE_SECONDS)


def _delete(tmp_path: Path, cni_bin: Path, netns: str, container_id: str,
            conf: dict[str, Any], result: dict[str, Any] | None, **extra: str) -> None:
    environ = {**_environ(tmp_path, cni_bin, netns, container_id, command="DEL"), **extra}
    stdin = json.dumps(with_prev(conf, result) if result else conf).encode()
    assert run(Request(environ, stdin)).status == 0


def test_an_add_in_process_decodes_config_and_cni_args_once(
        decodes: Counter[str], cni_bin: Path, netns: str, vpc: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    conf = base_conf(vpc, "1", ipam=host_local(tmp_path / "ipam", "fd00:d1::/64"))
    environ = _environ(tmp_path, cni_bin, netns, "decode-in-process", decodes)
    result = None
    try:
        with pytest.raises(SystemExit) as exited:  # the executable's in-process path
            answer_stdio(environ, json.dumps(conf).encode())
        assert exited.value.code == 0, capsys.readouterr().out
        counted = dict(decodes)
        result = json.loads(capsys.readouterr().out)
        assert result["ips"], result
        assert counted == {"stdin": 1, "CNI_ARGS": 1}
        line = json.loads((tmp_path / "vpc-attach.log").read_text().splitlines()[-1])
        assert (line["verb"], line["pod"], line["cniVersion"]) == ("ADD", "team-a/web-0", "1.1.0")
    finally:
        _delete(tmp_path, cni_bin, netns, "decode-in-process", conf, result)


def test_an_add_through_the_agent_decodes_config_and_cni_args_once(
        decodes: Counter[str], monkeypatch: pytest.MonkeyPatch, cni_bin: Path, vpc: str,
        tmp_path: Path) -> None:
    received = server._request

    def counted_request(forwarded: dict[str, str], stdin: bytes) -> Request:
        # The wire carries plain text: count the agent's reads of what it received.
        request = received(forwarded, stdin)
        args = CountedArgs(request.environ["CNI_ARGS"], decodes)
        return Request({**request.environ, "CNI_ARGS": args}, request.stdin)

    described: list[tuple[Outcome, PodEvent | None]] = []
    pod_event = events.pod_event

    def described_event(outcome: Outcome) -> PodEvent | None:
        event = pod_event(outcome)
        described.append((outcome, event))
        return event

    monkeypatch.setattr(server, "_request", counted_request)
    monkeypatch.setattr(events, "pod_event", described_event)
    conf = base_conf(vpc, "2", ipam=host_local(tmp_path / "ipam", "fd00:d2::/64"))
    stdin = json.dumps(conf).encode()
    result = None
    with kernel.temporary_netns("vpa-decode") as netns:
        try:
            environ = _environ(tmp_path, cni_bin, netns, "decode-agent")
            with serving_agent(tmp_path / "agent.sock") as agent:
                answer = client.forward(environ, stdin, str(tmp_path / "agent.sock"))
            assert answer is not None and answer[0] == 0, answer
            result = json.loads(answer[1])
            assert decodes == {"stdin": 1, "CNI_ARGS": 1}
            # What read the outcome after the answer did run: metrics, the Event, the log line.
            assert agent.metrics is not None
            assert agent.metrics.registry.get_sample_value(
                "vpc_attach_verb_duration_seconds_count", {"verb": "ADD", "outcome": "ok"}) == 1
            [(outcome, event)] = described
            assert outcome.invocation is not None and outcome.invocation.conf.vpc == vpc
            assert event is not None and (event.reason, event.namespace, event.pod,
                                          event.uid) == (ATTACHED, "team-a", "web-0", "u-1")
            lines = (tmp_path / "vpc-attach.log").read_text().splitlines()
            assert any(json.loads(line).get("verb") == "ADD" for line in lines)
        finally:
            _delete(tmp_path, cni_bin, netns, "decode-agent", conf, result)


@pytest.fixture
def host_file_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    """A host file the node's settings come from, and every open of it in this process."""
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps({"lockDir": str(tmp_path / "locks"),
                                     "ipamDataRoot": str(tmp_path), "tenancy": "off"}))
    reads: list[str] = []
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file) == str(host_file):
            reads.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    yield reads


def test_an_add_in_process_reads_the_host_file_once(
        host_file_reads: list[str], cni_bin: Path, netns: str, vpc: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The log settings, the parse, host protection, and vpc-attach-ipam in-process (its data
    root) all read the settings the verb read once."""
    ipam = {"type": "vpc-attach-ipam", "ipv6_subnet": "fd00:d3::/64",
            "dataDir": str(tmp_path / "ipam")}
    conf = base_conf(vpc, "3", ipam=ipam)
    environ = {**_environ(tmp_path, cni_bin, netns, "reads-in-process"),
               "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "host.json")}
    for name in ("VPC_ATTACH_LOCK_DIR", "VPC_ATTACH_TENANCY"):  # from the host file
        environ.pop(name)
    result = None
    try:
        with pytest.raises(SystemExit) as exited:
            answer_stdio(environ, json.dumps(conf).encode())
        assert exited.value.code == 0, capsys.readouterr().out
        reads = len(host_file_reads)
        result = json.loads(capsys.readouterr().out)
        assert result["ips"], result
        assert (tmp_path / "locks").is_dir(), "the lock dir came from the host file"
        assert reads == 1, f"the host file was read {reads} times"
    finally:
        _delete(tmp_path, cni_bin, netns, "reads-in-process", conf, result,
                VPC_ATTACH_HOST_CONFIG=str(tmp_path / "host.json"))
