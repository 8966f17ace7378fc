"""A link's offloads read and turned off over ethtool's netlink family
(`cni_plugin/kernel/ethtool.py`), checked with the real `ethtool -k` on a veth in a netns."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Iterator

import pytest

from cni_plugin.kernel import ethtool
from cni_plugin.kernel.netns import entered
from e2e.harness.kernel import run_ip, temporary_netns

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(shutil.which("ethtool") is None,
                                 reason="needs ethtool (scripts/setup.sh all)")]


@pytest.fixture
def veth() -> Iterator[str]:
    """A netns holding a veth pair `pod0`/`peer0` (its path)."""
    with temporary_netns("vpa-offl") as path:
        run_ip("-n", path.rsplit("/", 1)[1], "link", "add", "pod0", "type", "veth", "peer",
               "name", "peer0")
        yield path


def ethtool_k(path: str, link: str) -> dict[str, str]:
    """`ethtool -k`: {feature: on|off} (", [fixed]" dropped)."""
    shown = subprocess.run(["ip", "netns", "exec", path.rsplit("/", 1)[1], "ethtool", "-k",
                            link], capture_output=True, text=True, timeout=30, check=True)
    return dict(re.findall(r"^\s*([\w-]+): (on|off)", shown.stdout, re.M))


def test_segmentation_offloads_turned_off_as_ethtool_reads_them(veth: str) -> None:
    before = ethtool_k(veth, "pod0")
    assert before["tcp-segmentation-offload"] == before["tx-udp-segmentation"] == "on"
    with entered(veth), ethtool.Ethtool(timeout=10) as reader:
        index = socket.if_nametoindex("pod0")
        assert "tx-tcp-segmentation" in ethtool.segmentation_offloads_on(reader.features(index))
        left_on = ethtool.turn_off_segmentation_offloads(reader, index)
        seen = ethtool.segmentation_offloads_on(reader.features(index))
    after = ethtool_k(veth, "pod0")
    assert left_on == seen == frozenset()
    # Every "...-segmentation" of the device off, the stack's own GSO (in software) kept.
    device_segmentation = {k for k in after if k.startswith("tx-") and k.endswith(
        "segmentation")}
    assert device_segmentation and {after[k] for k in device_segmentation} == {"off"}
    assert after["tcp-segmentation-offload"] == "off"
    assert after["generic-segmentation-offload"] == "on"
    # Nothing else changed (checksums, scatter-gather, GRO...).
    changed = {k for k in before if before[k] != after[k]} - device_segmentation - {
        "tcp-segmentation-offload", "tx-gso-list"}
    assert not changed, changed
    assert ethtool_k(veth, "peer0") == before, "the peer keeps its own"


def test_receive_aggregation_read_as_ethtool_sets_it(veth: str) -> None:
    name = veth.rsplit("/", 1)[1]
    for state in ("on", "off"):
        subprocess.run(["ip", "netns", "exec", name, "ethtool", "-K", "peer0", "gro", state],
                       check=True, timeout=30, capture_output=True)
        with entered(veth), ethtool.Ethtool(timeout=10) as reader:
            features = reader.features(socket.if_nametoindex("peer0"))
        assert ("rx-gro" in ethtool.receive_aggregation_on(features)) == (state == "on")
