"""The on-node record of a galactic registration names a veth's Pod end (netns, ifname), what
doctor reads the Pod's offloads through; a tap's, an older record's or a damaged one's names
none."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cni_plugin.galactic import layout, record
from cni_plugin.galactic.registration import Registration


def _registration(pod_netns: str) -> Registration:
    return Registration(network="net1", container_id="c1", ifname="eth1", host_link="G1H",
                        host_ifindex=7, egress_kind=layout.EGRESS_KIND_VETH,
                        locator="2001:db8:a::/48", node_id=1, argument=3, table_id=5,
                        prefixes=(ipaddress.ip_network("10.0.0.5/32"),), pod_netns=pod_netns)


def _write(lock_dir: Path, reg: Registration) -> None:
    record.write_record(str(lock_dir), reg.container_id, reg.ifname, network=reg.network,
                        host_link=reg.host_link, rows=reg.attachment_rows(),
                        uses=reg.shared_rows(), pod_netns=reg.pod_netns)


def test_a_veth_records_its_pod_end(tmp_path: Path) -> None:
    _write(tmp_path, _registration("/var/run/netns/cni-1"))
    path = record.record_path(str(tmp_path), "c1", "eth1")
    assert record.pod_end(path) == ("/var/run/netns/cni-1", "eth1")
    assert record.read_record(path) is not None


def test_a_tap_an_older_record_or_a_damaged_one_names_no_pod_end(tmp_path: Path) -> None:
    _write(tmp_path, _registration(""))
    path = record.record_path(str(tmp_path), "c1", "eth1")
    assert "podNetns" not in Path(path).read_text()
    assert record.pod_end(path) is None
    Path(path).write_text("{not json")
    assert record.pod_end(path) is None
    assert record.pod_end(str(tmp_path / "absent.json")) is None
