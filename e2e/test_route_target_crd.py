"""On a cluster whose BGPVRFInstance CRD is galactic's own (route targets of at most 9 digits a
side; vpc-attach's CRDs take 10, SPEC §8), a VPC whose route target does not fit is refused
with code 7 naming the CRD's limit before anything is made: the ADD's only write is a dry run
of the instance (whether the instance exists or not), no link appears in the host's or the
Pod's netns, the IPAM plugin never runs, no object is made. One that fits attaches there and
asks nothing more (the positive control that requests and link events are seen), and the same
wide VPC attaches once vpc-attach's CRD is back (its dry run answered 201). The cluster is this
module's own control plane (the session's keeps vpc-attach's CRDs), reached through a fault
proxy that records each request (`e2e.harness.route_target`); in the agent pass, through an
agent of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.resources import VRF_INSTANCES
from e2e.harness.agentproc import OwnAgents
from e2e.harness.faults import Seen
from e2e.harness.kernel import links_in, temporary_netns
from e2e.harness.link_events import LinkEvents
from e2e.harness.plugin import host_local_reservations
from e2e.harness.publishing import BGP_NS
from e2e.harness.route_target import (
    ARGS,
    NODE,
    ControlPlane,
    another_writers_instance,
    conf,
    control_plane_up,
    label,
    node_plugin,
    objects,
    requests_of,
    version,
    writes,
)
from e2e.harness.tenancy import bound
from netconf.base62 import encode_base62

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
WIDE_VPC = encode_base62(4_000_000_062)  # route target 65000:4000000062: 10 digits
NARROW_VPC = encode_base62(999_000_062)  # 65000:999000062: 9 digits
DRY_RUN_REFUSED = "POST bgpvrfinstances (dry run) 422"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's control plane (its own: it swaps the BGPVRFInstance CRD)."""
    with control_plane_up(tmp_path_factory.mktemp("route-target-crd")) as up:
        yield up


@pytest.mark.parametrize("existing", [False, True], ids=["no-instance", "another-writers-instance"])
def test_a_route_target_galactics_crd_cannot_hold_is_refused_before_anything_is_made(
        control_plane: ControlPlane, cni_bin: Path, tmp_path: Path, own_agents: OwnAgents,
        existing: bool) -> None:
    """Refused by the dry run of the instance before the kernel, the IPAM plugin or the
    instance's own write; also where the VPC's instance on this node exists (another writer's,
    with a route target that fits): the CRD validates the dry run before it finds the name
    taken, and the instance is left as it was."""
    cluster, proxied = control_plane.cluster, control_plane.proxied
    name = naming.vrf_instance_name(WIDE_VPC, NODE)
    with cluster.admin() as kube, bound(kube, WIDE_VPC), \
            node_plugin(control_plane, cni_bin, tmp_path, own_agents) as plugin, \
            temporary_netns("vpa-rt") as netns:
        control_plane.serve(kube, "galactic")
        theirs = another_writers_instance(kube, name) if existing else None
        try:
            before = links_in()
            mark = len(proxied.proxy.seen())
            with LinkEvents(netns) as events:
                refused = plugin.call("ADD", conf(WIDE_VPC, tmp_path), container_id="rt-wide",
                                      netns=netns, CNI_ARGS=ARGS)
            seen = requests_of(proxied, mark)
            print(f"\nADD of VPC {WIDE_VPC} ({naming.route_target(65000, WIDE_VPC)}) with "
                  f"galactic's CRD: {refused.body}\nrequests: {[label(s) for s in seen]}")
            assert refused.status != 0 and refused.code == 7, refused.stdout
            assert refused.body["msg"] == (
                f"invalid vpc {WIDE_VPC!r}: its route target 65000:4000000062 does not fit this "
                "cluster's BGPVRFInstance CRD, which accepts at most 9 digits on each side of "
                "the colon (galactic's CRD)"), refused.body
            assert "packaging/crds" in refused.body["details"]
            # Nothing was made, not even for a moment: the only write is the dry run, and the
            # settling thread (its first request reads the instance by name) never started;
            assert writes(seen) == [DRY_RUN_REFUSED], seen
            assert not [s for s in seen if s.resource == "bgpvrfinstances" and s.name], seen
            # no link appeared in either netns (the host link's name never in an event),
            host = naming.host_link_name(WIDE_VPC, "1")
            assert not [e for e in events.between_marks("host") if host in e]
            assert events.between_marks("pod") == []
            assert links_in(netns) == {"lo"} and links_in() == before
            # the IPAM plugin never ran (host-local makes its network's directory first),
            assert not (tmp_path / "ipam" / f"net-{WIDE_VPC}").exists()
            assert host_local_reservations(tmp_path / "ipam", f"net-{WIDE_VPC}") == []
            # and no object was made (another writer's instance is as it was).
            instances, advertisements = objects(kube)
            assert advertisements == [] and [version(i) for i in instances] == (
                [version(theirs)] if theirs else [])
        finally:
            if theirs is not None:
                kube.delete(VRF_INSTANCES.path(BGP_NS, name))


def test_a_route_target_that_fits_attaches_with_galactics_crd_and_asks_nothing_more(
        control_plane: ControlPlane, cni_bin: Path, tmp_path: Path,
        own_agents: OwnAgents) -> None:
    """The positive control: the cluster, galactic's CRD and the node serve a VPC that fits;
    its ADD makes its link, its IPAM reservation and its instance (the counting sees them), and
    no dry run."""
    seen, events = _attaches(control_plane, "galactic", NARROW_VPC, cni_bin, tmp_path,
                             own_agents)
    assert "POST bgpvrfinstances 201" in writes(seen), seen
    assert not [s for s in seen if s.dry_run], seen
    host = naming.host_link_name(NARROW_VPC, "1")
    assert [e for e in events.between_marks("host") if host in e]
    assert events.between_marks("pod")


def test_the_wide_route_target_attaches_with_vpc_attachs_crd(
        control_plane: ControlPlane, cni_bin: Path, tmp_path: Path,
        own_agents: OwnAgents) -> None:
    """The same VPC that galactic's CRD refused, with vpc-attach's CRD on the same cluster:
    its dry run is answered 201, then the instance is made."""
    seen, _ = _attaches(control_plane, "vpc-attach", WIDE_VPC, cni_bin, tmp_path, own_agents)
    assert writes(seen)[:2] == ["POST bgpvrfinstances (dry run) 201",
                                "POST bgpvrfinstances 201"], seen


def _attaches(control_plane: ControlPlane, crd: str, vpc: str, cni_bin: Path, tmp_path: Path,
              own_agents: OwnAgents) -> tuple[list[Seen], LinkEvents]:
    """ADD of `vpc` with `crd` served creates its instance (DEL after); the ADD's requests and
    link events."""
    cluster = control_plane.cluster
    with cluster.admin() as kube, bound(kube, vpc), \
            node_plugin(control_plane, cni_bin, tmp_path, own_agents) as plugin, \
            temporary_netns("vpa-rt") as netns:
        control_plane.serve(kube, crd)
        stanza = conf(vpc, tmp_path)
        mark = len(control_plane.proxied.proxy.seen())
        with LinkEvents(netns) as events:
            added = plugin.ok("ADD", stanza, container_id="rt-fits", netns=netns, CNI_ARGS=ARGS)
        seen = requests_of(control_plane.proxied, mark)
        print(f"\nADD of VPC {vpc} with {crd}'s CRD: requests {[label(s) for s in seen]}")
        try:
            instances, _ = objects(kube)
            assert [(i["metadata"]["name"], i["spec"]["importRouteTargets"]) for i in
                    instances] == [(naming.vrf_instance_name(vpc, NODE), [
                        {"value": naming.route_target(65000, vpc)}])]
            assert host_local_reservations(tmp_path / "ipam", f"net-{vpc}")
        finally:
            plugin.ok("DEL", {**stanza, "prevResult": added}, container_id="rt-fits",
                      netns=netns, CNI_ARGS=ARGS)
    return seen, events
