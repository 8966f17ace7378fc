"""The agent's metrics and its HTTP endpoint, without root: the real prometheus-client registry
parsed back with the library's own parser, the real HTTP server on loopback, a real Unix socket
for liveness, and vpc-attach-ipam pools allocated by the real allocator."""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cni_plugin.agent.health import HealthServer, Probes, metrics_address, parse_address
from cni_plugin.agent.metrics import AgentMetrics, ipam_data_dir
from cni_plugin.agent.warm import WarmCluster
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.ipam.plugin import allocator
from cni_plugin.ipam.plugin.config import DEFAULT_DATA_DIR, parse_network
from cni_plugin.ipam.plugin.store import Attachment

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, by (name, sorted labels)."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_verbs_api_requests_and_rollbacks_are_counted_under_the_spec_names() -> None:
    metrics = AgentMetrics(lambda: 2)
    metrics.verb_answered("ADD", 0, 0.004)
    metrics.verb_answered("ADD", 7, 0.002)
    metrics.verb_answered("DEL", 0, 0.020)
    metrics.verb_answered("BOGUS", 4, 0.001)
    metrics.api_exchange("GET", "200", 0.003)
    metrics.api_exchange("GET", "error", 2.0)
    metrics.api_exchange("POST", "201", 0.01)
    metrics.rollback_finished(True)
    found = samples(generate_latest(metrics.registry).decode())
    verb = "vpc_attach_verb_duration_seconds"
    assert found[(f"{verb}_count", (("outcome", "ok"), ("verb", "ADD")))] == 1
    assert found[(f"{verb}_count", (("outcome", "error"), ("verb", "ADD")))] == 1
    assert found[(f"{verb}_sum", (("outcome", "ok"), ("verb", "DEL")))] == pytest.approx(0.02)
    assert found[(f"{verb}_bucket", (("le", "0.001"), ("outcome", "ok"), ("verb", "ADD")))] == 0
    assert found[(f"{verb}_bucket", (("le", "0.005"), ("outcome", "ok"), ("verb", "ADD")))] == 1
    assert found[(f"{verb}_bucket", (("le", "30.0"), ("outcome", "ok"), ("verb", "ADD")))] == 1
    assert found[("vpc_attach_verb_errors_total", (("code", "7"), ("verb", "ADD")))] == 1
    assert found[("vpc_attach_verb_errors_total", (("code", "4"), ("verb", "other")))] == 1
    assert found[("vpc_attach_api_requests_total", (("code", "error"), ("method", "GET")))] == 1
    assert found[("vpc_attach_api_request_duration_seconds_count", (("method", "GET"),))] == 2
    assert found[("vpc_attach_rollbacks_total", (("outcome", "complete"),))] == 1
    assert found[("vpc_attach_rollbacks_total", (("outcome", "incomplete"),))] == 0
    assert found[("vpc_attach_retired_links_pending", ())] == 2
    assert ("process_resident_memory_bytes", ()) in found
    assert any(name == "python_info" for name, _ in found)


def test_a_rollback_reports_whether_it_undid_everything() -> None:
    heard: list[bool] = []

    def broken(_: Deadline) -> None:
        raise OSError("gone")

    for undo in (lambda _: None, broken):
        rollback = Rollback(Deadline(10), on_finish=heard.append)
        rollback.created("thing", undo)
        rollback.run()
    Rollback(Deadline(10), on_finish=heard.append).run()  # nothing to undo: not a rollback
    assert heard == [True, False]


def _pools_conf(data_dir: Path) -> dict[str, object]:
    return {"cniVersion": "1.1.0", "name": "vpc21", "type": "vpc-attach",
            "ipam": {"type": "vpc-attach-ipam", "dataDir": str(data_dir),
                     "ipv6_subnet": "fd00:21::/64", "ipv4_subnet": "172.21.1.0/24"}}


def test_ipam_addresses_in_use_counts_the_records_of_each_pool_at_scrape_time(
        tmp_path: Path) -> None:
    config = _pools_conf(tmp_path)
    conf = parse_network(config)
    for n in range(3):
        allocator.allocate_all(conf, Attachment(f"c{n}", "eth0"))
    metrics = AgentMetrics(lambda: 0)
    metrics.pools.learn(config)
    pools = {labels[0][1]: value for (name, labels), value in
             samples(generate_latest(metrics.registry).decode()).items()
             if name == "vpc_attach_ipam_addresses_in_use"}
    assert pools["vpc21/172.21.1.0_24_32"] == 3 and pools["vpc21/fd00:21::_64_96"] == 3
    allocator.release(conf, Attachment("c1", "eth0"))
    pools = {labels[0][1]: value for (name, labels), value in
             samples(generate_latest(metrics.registry).decode()).items()
             if name == "vpc_attach_ipam_addresses_in_use"}
    assert pools["vpc21/172.21.1.0_24_32"] == 2


@pytest.mark.parametrize(("config", "expected"), [
    ({"ipam": {"type": "vpc-attach-ipam", "dataDir": "/d"}}, "/d"),
    ({"IPAM": {"Type": "galactic-ipam"}}, DEFAULT_DATA_DIR),
    ({"ipam": {"type": "host-local", "dataDir": "/d"}}, None),
    ({"ipam": {"type": "vpc-attach-ipam", "dataDir": "relative"}}, None),
    ({}, None),
])
def test_the_data_dir_of_a_requests_ipam_block(config: dict[str, object],
                                               expected: str | None) -> None:
    assert ipam_data_dir(config) == expected


IPAM_BLOCKS = st.dictionaries(
    st.sampled_from(["type", "Type", "dataDir", "DATADIR"]),
    st.one_of(st.none(), st.integers(), st.text(max_size=12),
              st.sampled_from(["vpc-attach-ipam", "galactic-ipam", "/abs", "rel"])))


@given(st.dictionaries(st.sampled_from(["ipam", "IPAM", "name"]),
                       st.one_of(IPAM_BLOCKS, st.text(max_size=5), st.none())))
def test_any_network_config_gives_an_absolute_data_dir_or_none(
        config: dict[str, object]) -> None:
    found = ipam_data_dir(config)
    assert found is None or found.startswith("/")


@given(host=st.one_of(st.ip_addresses().map(str), st.from_regex(r"[a-z][a-z0-9.-]{0,20}",
                                                                 fullmatch=True)),
       port=st.integers(0, 65535), brackets=st.booleans())
def test_metrics_address_round_trips(host: str, port: int, brackets: bool) -> None:
    text = f"[{host}]:{port}" if brackets and ":" in host else f"{host}:{port}"
    assert parse_address(text) == (host, port)


@pytest.mark.parametrize("text", ["9471", ":9471", "host:", "host:99999", "host:x1", "[]:1"])
def test_a_malformed_metrics_address_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="VPC_ATTACH_METRICS_ADDRESS"):
        parse_address(text)


def test_metrics_address_defaults_to_loopback_and_empty_turns_it_off() -> None:
    assert metrics_address({}) == ("127.0.0.1", 9471)
    assert metrics_address({"VPC_ATTACH_METRICS_ADDRESS": ""}) is None
    assert metrics_address({"VPC_ATTACH_METRICS_ADDRESS": "[::1]:0"}) == ("::1", 0)


@pytest.fixture
def verb_socket(unix_listener: socket.socket) -> str:
    """A listening Unix socket standing for the agent's verb socket."""
    return str(unix_listener.getsockname())


def _get(server: HealthServer, path: str) -> tuple[int, str, str]:
    host, _, port = server.address.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", \
            response.read().decode()
    finally:
        conn.close()


def test_endpoint_serves_metrics_health_and_readiness(verb_socket: str, kubeconfig: str) -> None:
    metrics = AgentMetrics(lambda: 0)
    metrics.verb_answered("ADD", 0, 0.01)
    cluster = WarmCluster()
    accepting = {"now": True}
    server = HealthServer(("127.0.0.1", 0), metrics.registry)
    server.start(Probes(verb_socket, lambda: accepting["now"], cluster, None))
    try:
        status, content_type, body = _get(server, "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert 'vpc_attach_verb_duration_seconds_count{outcome="ok",verb="ADD"} 1.0' in body
        assert _get(server, "/healthz")[::2] == (200, "ok\n")
        assert _get(server, "/readyz")[::2] == (200, "ok\n")  # no kubeconfig: nothing to ask
        assert _get(server, "/nothing")[0] == 404
        # A kubeconfig whose API server is not there: not ready, saying why, in one line.
        server.probes = Probes(verb_socket, lambda: True, cluster, kubeconfig)
        status, _, reason = _get(server, "/readyz")
        assert status == 503 and "Kubernetes API unavailable" in reason
        assert reason.count("\n") == 1
        assert _get(server, "/healthz")[0] == 200, "liveness does not depend on the API"
        accepting["now"] = False
        server.probes = Probes(verb_socket, lambda: accepting["now"], cluster, None)
        assert _get(server, "/healthz")[0] == 503
    finally:
        server.close()


def test_liveness_fails_when_the_socket_no_longer_accepts(tmp_path: Path) -> None:
    probes = Probes(str(tmp_path / "gone.sock"), lambda: True, WarmCluster(), None)
    reason = probes.live()
    assert reason is not None and "gone.sock" in reason
