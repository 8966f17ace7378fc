"""64 simulated nodes publishing the same attachment at once, each into its own BGPAdvertisement
(SPEC §6): every ADD succeeds within its deadline, each node's object holds exactly its Pod's
prefix and names its router, nothing is lost; conflicts, if any, are resolved.

All 64 plugins start on this machine's two cores at once (a real node has its own), so the
deadline is 60 s rather than the default 30 s: start-up alone queues for ~10 s in-process."""

from __future__ import annotations

import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from e2e.harness.kube import Kube
from e2e.harness.plugin import Answer, Plugin
from e2e.harness.publishing import advertisement, make_node
from e2e.harness.report import report

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
NODES = 64
TIMEOUT_SECONDS = 60


def conflicts(kube: Kube) -> int:
    """409 answers the API server has given for BGPAdvertisements (its own metrics)."""
    status, text = kube.get_text("/metrics")
    assert status == 200, text[:200]
    total = 0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'code="409"' in line \
                and 'resource="bgpadvertisements"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_64_nodes_add_the_same_attachment_at_once(kube: Kube, cluster: Any, plugin: Plugin,
                                                  vpc: str, tmp_path: Path,
                                                  pytestconfig: pytest.Config) -> None:
    nodes = []
    for index in range(NODES):
        locks = tmp_path / f"locks-{index}"
        locks.mkdir()
        node_plugin = Plugin(plugin.cni_bin, locks, agent_socket=plugin.agent_socket)
        nodes.append(make_node(kube, cluster, node_plugin))
    before = conflicts(kube)

    def publish(index: int) -> tuple[Answer, float]:
        node = nodes[index]
        prev = {"cniVersion": "1.1.0", "ips": [{"address": f"fd00:64::{index + 1:x}/64"}],
                "interfaces": [{"name": "eth0", "sandbox": "/proc/1/ns/net"}]}
        conf = {"cniVersion": "1.1.0", "name": "contention", "type": "vpc-attach", "vpc": vpc,
                "vpcattachment": "1", "attachment": "existing", "prevResult": prev,
                "publish": {"bgp": True, "endpointSlice": False}}
        began = time.monotonic()
        answer = node.plugin.call("ADD", conf, container_id=f"ctr-node-{index}",
                                  netns="/proc/1/ns/net", CNI_ARGS=node.cni_args(f"p{index}"),
                                  VPC_ATTACH_TIMEOUT_SECONDS=str(TIMEOUT_SECONDS))
        return answer, time.monotonic() - began

    with ThreadPoolExecutor(max_workers=NODES) as pool:
        results = list(pool.map(publish, range(NODES)))
    failures = [answer.stdout for answer, _ in results if answer.status != 0]
    assert not failures, failures[:3]
    seconds = sorted(elapsed for _, elapsed in results)
    assert seconds[-1] < TIMEOUT_SECONDS, "an ADD outlived its deadline"

    for index, node in enumerate(nodes):  # each node announces its own Pod through its router
        adv = advertisement(kube, naming.advertisement_name(vpc, "1", node.name))
        assert adv is not None, node.name
        assert adv["spec"]["prefixes"] == [f"fd00:64::{index + 1:x}/128"], node.name
        assert adv["spec"]["routerRef"] == {"name": node.router}
        recorded = {key.rsplit(".", 1)[1] for key in adv["metadata"]["annotations"]
                    if re.match(r"galactic\.datum\.net/node\.", key)}
        assert recorded == {naming.annotation_cid(f"ctr-node-{index}")}
    assert advertisement(kube, naming.shared_advertisement_name(vpc, "1")) is None

    figures = {"nodes": NODES, "failed": len(failures),
               "median_s": round(statistics.median(seconds), 3),
               "p95_s": round(seconds[int(0.95 * (len(seconds) - 1))], 3),
               "max_s": round(seconds[-1], 3), "deadline_s": TIMEOUT_SECONDS,
               "conflicts_resolved": conflicts(kube) - before}
    report(pytestconfig, "64-node contention figures",
           tmp_path / "contention-figures.json", figures)
