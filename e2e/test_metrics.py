"""The node agent's /metrics, /healthz and /readyz (SPEC §12) during real verbs against the
real control plane: the scrape, parsed with prometheus-client's own parser, counts exactly the
verbs, errors and rollbacks that ran; readiness follows the API server."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness.agentproc import AgentProcess
from e2e.harness.kube import Kube
from e2e.harness.plugin import Plugin, base_conf, with_prev
from e2e.harness.publishing import create_pod, deny_writes, endpoint_slice, make_node, wait_denied
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster]
Labels = tuple[tuple[str, str], ...]


def samples(text: str) -> dict[tuple[str, Labels], float]:
    """Every sample of a scrape, by (name, sorted labels), parsed by the library."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def total(found: dict[tuple[str, Labels], float], name: str, **labels: str) -> float:
    """The sum of name's samples whose labels include labels."""
    return sum(value for (sample, sample_labels), value in found.items() if sample == name
               and set(labels.items()) <= set(sample_labels))


def _ipam(tmp_path: Path) -> dict[str, Any]:
    return {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / "ipam"),
            "ipv6_subnet": "fd00:3c::/48", "ipv4_subnet": "10.60.0.0/16"}


def test_scrape_counts_the_verbs_errors_and_rollbacks_that_ran(
        kube: Kube, cluster: Any, plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    run = secrets.token_hex(3)
    pods = [f"m-{run}-{n}" for n in range(3)]
    uids = [create_pod(kube, pod, node.name) for pod in pods]
    denied = f"m-{run}-denied"
    denied_uid = create_pod(kube, denied, node.name)
    (tmp_path / "agent").mkdir()
    conf = base_conf(vpc, "1", ipam=_ipam(tmp_path))
    conf.pop("publish")  # BGP objects and EndpointSlices: API requests to count
    network = conf["name"]
    with contextlib.ExitStack() as stack:
        netns = [stack.enter_context(_netns()) for _ in range(4)]
        agent = stack.enter_context(AgentProcess(tmp_path / "agent", metrics=True))
        env = {"VPC_ATTACH_AGENT_SOCKET": str(agent.socket)}
        started = time.monotonic()
        results = [plugin.ok("ADD", {**conf, "vpcattachment": str(n + 1)},
                             container_id=f"m-{n}", netns=netns[n],
                             CNI_ARGS=node.cni_args(pods[n], uids[n]), **env)
                   for n in range(3)]
        plugin.ok("CHECK", with_prev({**conf, "vpcattachment": "1"}, results[0]),
                  container_id="m-0", netns=netns[0], CNI_ARGS=node.cni_args(pods[0], uids[0]),
                  **env)
        bad = plugin.call("ADD", {**conf, "mtu": 1}, container_id="m-bad", netns=netns[3],
                          CNI_ARGS=node.cni_args(denied, denied_uid), **env)
        assert bad.code == 7
        # A refused EndpointSlice fails the ADD after IPAM, links and BGP objects: rollback.
        remove = deny_writes(kube, f"deny-{run}", "endpointslices", "discovery.k8s.io",
                             ["CREATE"], denied)
        try:
            wait_denied(lambda: kube.create("/apis/discovery.k8s.io/v1/namespaces/default/"
                                            "endpointslices", _probe_slice(denied),
                                            dry_run=True))
            refused = plugin.call("ADD", {**conf, "vpcattachment": "9"}, container_id="m-denied",
                                  netns=netns[3], CNI_ARGS=node.cni_args(denied, denied_uid),
                                  **env)
        finally:
            remove()
        assert refused.code == 104, refused.stdout
        in_use = samples(agent.scrape())
        for n in range(3):
            plugin.ok("DEL", with_prev({**conf, "vpcattachment": str(n + 1)}, results[n]),
                      container_id=f"m-{n}", netns=netns[n],
                      CNI_ARGS=node.cni_args(pods[n], uids[n]), **env)
        elapsed = time.monotonic() - started
        wait_until("the reaper to delete the retired links", lambda: total(
            samples(agent.scrape()), "vpc_attach_retired_links_pending") == 0, 30)
        text = agent.scrape()
    found = samples(text)
    verb = "vpc_attach_verb_duration_seconds"
    ran = {("ADD", "ok"): 3, ("ADD", "error"): 2, ("CHECK", "ok"): 1, ("DEL", "ok"): 3}
    for (name, outcome), count in ran.items():
        labels = (("outcome", outcome), ("verb", name))
        assert found[(f"{verb}_count", labels)] == count, (name, outcome)
        assert found[(f"{verb}_bucket", (("le", "+Inf"), *labels))] == count
        assert 0 < found[(f"{verb}_sum", labels)] < elapsed
    assert total(found, f"{verb}_count") == sum(ran.values()), "nothing else was counted"
    assert found[("vpc_attach_verb_errors_total", (("code", "7"), ("verb", "ADD")))] == 1
    assert found[("vpc_attach_verb_errors_total", (("code", "104"), ("verb", "ADD")))] == 1
    assert total(found, "vpc_attach_verb_errors_total") == 2
    assert found[("vpc_attach_rollbacks_total", (("outcome", "complete"),))] == 1
    assert found[("vpc_attach_rollbacks_total", (("outcome", "incomplete"),))] == 0
    # Every API exchange is counted once, under its method and answer, and timed.
    requests = "vpc_attach_api_requests_total"
    for method in ("GET", "POST", "PUT", "DELETE"):
        assert total(found, requests, method=method) == found.get(
            ("vpc_attach_api_request_duration_seconds_count", (("method", method),)), 0)
    assert total(found, requests, method="POST", code="201") >= 3 * 2  # instances, slices
    assert total(found, requests, method="POST") > total(found, requests, method="POST",
                                                         code="201"), "the refused create"
    assert total(found, requests, method="WATCH", code="200") >= 2  # routers and Pods
    # vpc-attach-ipam: three attachments held a block in each pool, then released them.
    pools = {f"{network}/fd00:3c::_48_96", f"{network}/10.60.0.0_16_32"}
    for pool in pools:
        key = ("vpc_attach_ipam_addresses_in_use", (("pool", pool),))
        assert in_use[key] == 3 and found[key] == 0, pool
    assert found[("process_resident_memory_bytes", ())] > 0
    assert any(name == "python_info" for name, _ in found)
    assert endpoint_slice(kube, f"{denied}-{_hex(vpc)}-9-ipv6") is None, "rolled back"
    _show("scrape", text)


def _probe_slice(pod: str) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{pod}-probe"}, "addressType": "IPv6", "endpoints": []}


def _hex(vpc: str) -> str:
    from netconf.base62 import decode_base62
    return f"{decode_base62(vpc):x}"


@contextlib.contextmanager
def _netns() -> Iterator[str]:
    from e2e.harness.kernel import temporary_netns
    with temporary_netns("vpa-m") as path:
        yield path


def _show(what: str, text: str) -> None:
    """Print the vpc_attach_* lines (pytest -s shows them: samples for the docs)."""
    print(f"\n--- {what} ---")
    print("\n".join(line for line in text.splitlines() if "vpc_attach_" in line))


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP: it holds its sockets and answers nothing) for the block."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_readiness_follows_the_api_server_and_liveness_does_not(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    (tmp_path / "agent").mkdir()
    # The agent's own settings name the cluster and node, as the DaemonSet's host file does:
    # it watches this node's routers and Pods from the start.
    env = {"VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
           "VPC_ATTACH_NODE_NAME": node.name,
           "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent-host.json")}
    with AgentProcess(tmp_path / "agent", env=env, metrics=True) as agent:
        wait_until("the agent to be ready", lambda: agent.http_get("/readyz") == (200, "ok\n"),
                   30)
        with _stopped(cluster.pids()["kube-apiserver"]):
            wait_until("readiness to fail while the API server is stopped",
                       lambda: agent.http_get("/readyz")[0] == 503, 30)
            status, reason = agent.http_get("/readyz")
            assert "Kubernetes API unavailable: GET /version" in reason, reason
            assert reason.count("\n") == 1, "one line"
            assert agent.http_get("/healthz") == (200, "ok\n"), "alive without the API"
        wait_until("readiness to return with the API server",
                   lambda: agent.http_get("/readyz") == (200, "ok\n"), 60)
        print(f"\n/readyz while the API server was stopped: {status} {reason.strip()}")
