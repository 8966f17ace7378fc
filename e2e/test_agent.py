"""The node agent and the thin client (SPEC §11): forwarding, fallback, and restarts with
ADDs in flight."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.agent.protocol import MAGIC, REFUSAL, recv_exact
from cni_plugin.core import naming
from e2e.harness.agentproc import AgentProcess
from e2e.harness.kernel import links_in, run_ip, temporary_netns
from e2e.harness.plugin import Answer, Plugin, base_conf, with_prev
from e2e.harness.wait import wait_until

pytestmark = pytest.mark.root
HEAVY_MODULES = ("pydantic", "pyroute2", "yaml", "cni_plugin.dispatch", "cni_plugin.verbs",
                 "json", "re", "typing")


def _pool_conf(vpc: str, att: str, data: Path) -> dict[str, Any]:
    return base_conf(vpc, att, ipam={"type": "vpc-attach-ipam", "dataDir": str(data),
                                     "ipv6_subnet": "fd00:a9::/48", "ipv4_subnet": "10.169.0.0/16"})


def _imported(importtime: bytes) -> list[str]:
    return [line.split("|")[-1].strip() for line in importtime.decode().splitlines()
            if line.startswith("import time:")]


def test_forwarded_call_imports_only_the_standard_library(plugin: Plugin, tmp_path: Path,
                                                          vpc: str) -> None:
    with AgentProcess(tmp_path) as agent:
        env = plugin.env("DEL", "fwd-1", "", "eth0", VPC_ATTACH_AGENT_SOCKET=str(agent.socket))
        # The launcher as its #! line runs it (-I -S), with import timing on.
        proc = subprocess.run([sys.executable, "-IS", "-X", "importtime",
                               str(plugin.cni_bin / "vpc-attach")],
                              input=json.dumps(_pool_conf(vpc, "9", tmp_path)).encode(), env=env,
                              capture_output=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        baseline = subprocess.run([sys.executable, "-IS", "-X", "importtime", "-c", "pass"],
                                  capture_output=True, timeout=60, check=True)
        startup = set(_imported(baseline.stderr))  # what the interpreter itself loads
        imported = [m for m in _imported(proc.stderr) if m not in startup]
        heavy = [m for m in imported
                 if any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)]
        assert not heavy, f"the forwarding path imported {heavy}"
        # Nor `os` or `struct` (~1.7 ms a call): `posix` and int.to_bytes do.
        assert not {"os", "struct"} & set(imported), imported
        assert any(line["containerID"] == "fwd-1" for line in agent.verb_lines()), \
            "the agent served the DEL"


def test_without_an_agent_the_verb_runs_in_process(plugin: Plugin, netns: str, vpc: str,
                                                   tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(stale))
    listener.close()  # a socket file nobody listens on: connection refused
    conf = _pool_conf(vpc, "1", tmp_path / "ipam")
    result = plugin.ok("ADD", conf, container_id="inproc", netns=netns,
                       VPC_ATTACH_AGENT_SOCKET=str(stale))
    assert naming.host_link_name(vpc, "1") in links_in()
    plugin.ok("DEL", with_prev(conf, result), container_id="inproc", netns=netns,
              VPC_ATTACH_AGENT_SOCKET=str(stale))


def test_an_agent_of_another_protocol_version_is_not_used(plugin: Plugin, netns: str, vpc: str,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "future.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    seen: list[bytes] = []

    def future_agent() -> None:
        listener.settimeout(30)
        conn, _ = listener.accept()
        seen.append(recv_exact(conn, 4))  # the request's version marker
        conn.sendall(REFUSAL)  # what an agent of another version answers
        conn.close()

    thread = threading.Thread(target=future_agent)
    thread.start()
    conf = _pool_conf(vpc, "2", tmp_path / "ipam")
    plugin.ok("ADD", conf, container_id="future", netns=netns,
              VPC_ATTACH_AGENT_SOCKET=str(path))
    thread.join(timeout=30)
    listener.close()
    assert seen == [MAGIC], "the client asked the agent first"
    assert naming.host_link_name(vpc, "2") in links_in(), "then ran the verb itself"
    plugin.ok("DEL", conf, container_id="future", netns=netns, VPC_ATTACH_AGENT_SOCKET=str(path))


def _parallel_adds(plugin: Plugin, socket_path: Path, jobs: list[tuple[dict[str, Any], str, str]],
                   ) -> list[Answer]:
    def add(job: tuple[dict[str, Any], str, str]) -> Answer:
        conf, cid, netns = job
        return plugin.call("ADD", conf, container_id=cid, netns=netns,
                           VPC_ATTACH_AGENT_SOCKET=str(socket_path))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(add, jobs))


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "killed"])
def test_restarting_the_agent_with_adds_in_flight_loses_nothing(
        plugin: Plugin, vpc: str, tmp_path: Path, how: signal.Signals) -> None:
    count = 8
    with contextlib.ExitStack() as stack:
        namespaces = [stack.enter_context(temporary_netns("vpa-rs")) for _ in range(count)]
        jobs = [(_pool_conf(vpc, str(i + 1), tmp_path / "ipam"), f"restart-{i}", namespaces[i])
                for i in range(count)]
        first_dir, second_dir = tmp_path / "a1", tmp_path / "a2"
        first_dir.mkdir()
        second_dir.mkdir()
        first = stack.enter_context(AgentProcess(first_dir))
        answers: list[Answer] = []
        runner = threading.Thread(target=lambda: answers.extend(
            _parallel_adds(plugin, first.socket, jobs)))
        runner.start()
        vpc_links = f"G{naming.pad_base62(vpc, 9)}"
        # Once a link shows, ADDs are in flight inside the agent.
        wait_until("an ADD to reach the kernel",
                   lambda: any(name.startswith(vpc_links) for name in links_in()), 30)
        first.stop(how)
        second = stack.enter_context(AgentProcess(second_dir))  # restarted, on its own socket
        runner.join(timeout=120)
        assert len(answers) == count
        for answer in answers:  # completed, or failed cleanly with one CNI error object
            assert answer.status == 0 or (answer.code == 11 and answer.body["msg"]), answer.stdout
            assert "Traceback" not in answer.stdout
        if how == signal.SIGTERM:
            assert all(a.status == 0 for a in answers), "a graceful stop drains in-flight ADDs"
        # The runtime retries what failed; every ADD converges to a working attachment.
        retried = _parallel_adds(plugin, second.socket, jobs)
        assert all(a.status == 0 for a in retried), [a.stdout for a in retried if a.status]
        for (conf, cid, netns), result in zip(jobs, retried, strict=True):
            check = plugin.call("CHECK", with_prev(conf, result.body), container_id=cid,
                                netns=netns, VPC_ATTACH_AGENT_SOCKET=str(second.socket))
            assert check.status == 0, check.stdout
        addresses = [ip["address"] for r in retried for ip in r.body["ips"]]
        assert len(set(addresses)) == len(addresses) == 2 * count
        for conf, cid, netns in jobs:
            plugin.ok("DEL", conf, container_id=cid, netns=netns,
                      VPC_ATTACH_AGENT_SOCKET=str(second.socket))
        assert not any(naming.host_link_name(vpc, str(i + 1)) in links_in()
                       for i in range(count))


def _retired_links() -> dict[str, str]:
    """Retired links on the host: name -> alias."""
    found = {}
    for line in run_ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("vpz") and "alias vpc-attach-retired/" in line:
            found[name] = line.split("alias ", 1)[1].split()[0]
    return found


def test_del_through_the_agent_retires_the_links_and_deletes_them_after_answering(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    conf = _pool_conf(vpc, "4", tmp_path / "ipam")
    host_name = naming.host_link_name(vpc, "4")
    monitor = subprocess.Popen(["ip", "-o", "monitor", "link"], stdout=subprocess.PIPE)
    try:
        with AgentProcess(tmp_path) as agent:
            env = {"VPC_ATTACH_AGENT_SOCKET": str(agent.socket)}
            result = plugin.ok("ADD", conf, container_id="retire-1", netns=netns, **env)
            plugin.ok("DEL", with_prev(conf, result), container_id="retire-1", netns=netns,
                      **env)
            # Answered: both names are free at once, whatever the kernel still has to do.
            assert host_name not in links_in() and "eth0" not in links_in(netns)
            wait_until("the retired links to be deleted",
                       lambda: "retire-1" not in str(_retired_links()), 10)
            # The same container can come back at once (a runtime retrying a sandbox).
            result = plugin.ok("ADD", conf, container_id="retire-1", netns=netns, **env)
            plugin.ok("DEL", with_prev(conf, result), container_id="retire-1", netns=netns,
                      **env)
            wait_until("the retired links to be deleted",
                       lambda: "retire-1" not in str(_retired_links()), 10)
            assert [line["verb"] for line in agent.verb_lines()] == ["ADD", "DEL", "ADD", "DEL"]
    finally:
        # The kernel has deleted them; read until ip monitor has printed both deletions.
        events = _monitor_output(monitor, lambda text: len(_retired_deletions(text, host_name)[1])
                                 >= 2, timeout=10)
        monitor.terminate()
        rest, _ = monitor.communicate(timeout=10)
        events += rest.decode()
    # The kernel saw each host end (by its index) renamed to vpz…, and deleted under that name.
    indexes, deleted = _retired_deletions(events, host_name)
    assert len(indexes) == 2 and len(deleted) == 2, events


def _retired_deletions(events: str, host_name: str) -> tuple[set[str], list[str]]:
    """Indexes `ip -o monitor link` showed as host_name, and its deletions of them as vpz…."""
    indexes = {line.split(":")[0] for line in events.splitlines()
               if line.startswith(f"{line.split(':')[0]}: {host_name}@")}
    deleted = [line for line in events.splitlines() if line.startswith("Deleted ")
               and line.split()[1].rstrip(":") in indexes and line.split()[2].startswith("vpz")]
    return indexes, deleted


def _monitor_output(monitor: subprocess.Popen[bytes], done: Callable[[str], bool],
                    timeout: float) -> str:
    """What the monitor printed so far, read until done(text) holds or timeout passes."""
    assert monitor.stdout is not None
    text = ""
    give_up = time.monotonic() + timeout
    while not done(text) and time.monotonic() < give_up:
        readable, _, _ = select.select([monitor.stdout.fileno()], [], [], 0.1)
        if readable:
            chunk = os.read(monitor.stdout.fileno(), 65536)
            if not chunk:
                break
            text += chunk.decode()
    return text


@pytest.mark.both_paths
def test_agent_start_and_gc_delete_retired_links_left_behind(
        plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    left = [f"vpz{secrets.token_hex(6)}" for _ in range(2)]
    foreign = f"vpz{secrets.token_hex(6)}"  # a vpz… name without our alias: not ours
    for name in (*left, foreign):
        run_ip("link", "add", name, "type", "veth", "peer", "name", f"p{name[3:]}")
    for name in left:
        run_ip("link", "set", name, "alias", "vpc-attach-retired/dead-agent/eth0")
    try:
        with AgentProcess(tmp_path):
            assert left[0] not in links_in() and left[1] not in links_in()
        assert foreign in links_in()
        run_ip("link", "add", left[0], "type", "veth", "peer", "name", f"p{left[0][3:]}")
        run_ip("link", "set", left[0], "alias", "vpc-attach-retired/dead-agent/eth0")
        conf = {**_pool_conf(vpc, "1", tmp_path / "ipam"), "cni.dev/valid-attachments": []}
        plugin.ok("GC", conf)  # not this test's agent: in-process, or the session's (agent pass)
        assert left[0] not in links_in() and foreign in links_in()
    finally:
        for name in (*left, foreign):
            run_ip("link", "del", name, check=False)
