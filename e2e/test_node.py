"""A real Kubernetes node (issue 11, SPEC §13): kubelet starts Pods through vpc-attach, which
its own DaemonSet installed from its own image into the node's `/opt/cni/bin`.

One node serves the module (`Node.up`: control plane, kube-scheduler, containerd v2 + runc,
kubelet, the DaemonSet from `packaging/`); the plugin on it reaches the API server through a
fault proxy, so a test can make the API unreachable for the plugin alone. Everything is read
through clients independent of vpc-attach: ADD and DEL outcomes from the node's CRI (sandboxes,
their IPs and netns), the Kubernetes API as admin (Pods, Events, BGP objects) and `ip -j`; only
STATUS calls, which leave nothing else to read, from the plugin's own log lines.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni_plugin.core import naming
from cni_plugin.kubevirt.migration import RECORDS_DIR as MIGRATION_RECORDS
from cni_plugin.tenancy.choice import ANNOTATION as ATTACHMENT_ANNOTATION
from e2e.harness import kernel, tenancy
from e2e.harness.faults import Denials, Fault, Rule
from e2e.harness.ipamclaims import claim_status
from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.standins import (
    kubevirt_creates_claim,
    kubevirt_deletes_claim,
    kubevirt_marks_target_ready,
    kubevirt_starts_launcher,
    launcher_pod,
)
from e2e.harness.nodes import api_port, in_node, node_namespace, node_objects
from e2e.harness.plugin import Plugin, with_prev
from e2e.harness.publishing import create_router
from e2e.harness.report import report
from e2e.harness.victims import planted_victims
from e2e.harness.wait import wait_until
from e2e.node import Node, deploy
from e2e.node.mountns import BOUND
from e2e.node.node import EXAMPLES
from e2e.node.observe import (
    BGP_API,
    Snapshot,
    advertisements,
    bgp_router,
    create_pod,
    delete_pod,
    get_pod,
    host_links,
    netns_exists,
    plugin_log,
    pod_addresses,
    pod_events,
    pod_manifest,
    sandbox,
    sandbox_failures,
    sandboxes,
    snapshot,
    unique,
    verb_lines,
    vrf_instances,
    wait_running,
)
from e2e.node.undertest import (
    SETTLE_S,
    NodeUnderTest,
    advertising,
    attached_sandboxes,
    node_under_test,
    owned_slices,
    pause_image,
    ready_condition,
    start_pod,
    wait_nothing_left,
)
from netconf.host import DEFAULT_AGENT_SOCKET, DEFAULT_IPAM_DATA_ROOT, DEFAULT_LOCK_DIR
from tests.ipam_files import IpamFiles

pytestmark = [pytest.mark.root, pytest.mark.cluster]

VPC_V4 = ipaddress.ip_network("172.21.1.0/24")  # the veth-pod example's pools
VPC_V6 = ipaddress.ip_network("fd00:21:ff01::/48")
PTP_POOL = ipaddress.ip_network("fd00:33::/64")  # the publish-after-ptp example's pool
GC_DEL_S = 180.0  # kubelet's sandbox GC runs once a minute
RETRY_S = 180.0  # kubelet retries a failed sandbox with backoff
DEPLOYMENT_S = 240.0
POD_TRIES = 3  # Pods an ADD may read from the API before one must come from the watch
VM_NETWORK = "vpc21"  # the veth-pod example's network name: the claims' spec.network
NOWHERE_LABEL = "vpc-attach.e2e/nowhere"  # no node carries it: the DaemonSet runs on none


@pytest.fixture(scope="module")
def real_node(tmp_path_factory: pytest.TempPathFactory,
              pytestconfig: pytest.Config) -> Iterator[NodeUnderTest]:
    """A node up for the whole module; `down` at the end must leave nothing on the host."""
    if not kernel.IS_ROOT:
        pytest.skip("needs root for mounts, cgroups and network namespaces")
    base = tmp_path_factory.mktemp("node")
    with node_under_test(base) as under_test:
        yield under_test
    report(pytestconfig, "real node figures", base / "node-figures.json", under_test.figures)
    left = under_test.figures["down"]["left_on_host"]
    assert not left, f"`down` left these on the host: {left}"


@pytest.fixture
def node(real_node: NodeUnderTest) -> Node:
    return real_node.node


@pytest.fixture
def admin(node: Node) -> Iterator[Kube]:
    """Cluster-admin access; every Pod a test made is deleted after it (and waited for)."""
    with node.admin() as kube:
        yield kube
        for pod in kube.list("/api/v1/namespaces/default/pods"):
            delete_pod(kube, pod["metadata"]["name"])


@pytest.fixture
def baseline(node: Node, admin: Kube) -> Snapshot:
    """The node with no test Pod: what must be there again after each test."""
    wait_until("no test pod left", lambda: not admin.list("/api/v1/namespaces/default/pods"),
               SETTLE_S)
    return snapshot(node, admin)


# -- the veth-pod conflist ------------------------------------------------------------------


def test_a_pod_runs_with_its_vpc_address_published_and_deletion_withdraws_it(
        node: Node, admin: Kube, baseline: Snapshot) -> None:
    pod, sandbox_id, netns = start_pod(node, admin, "web")
    uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
    pod_ips = {entry["ip"] for entry in pod["status"]["podIPs"]}
    assert ipaddress.ip_address(pod["status"]["podIP"]) in VPC_V4
    assert any(ipaddress.ip_address(ip) in VPC_V6 for ip in pod_ips), pod_ips
    assert pod_ips == set(pod_addresses(node, netns)), "the Pod IPs are eth0's addresses"

    slices = owned_slices(admin, uid)
    assert len(slices) == 1
    owner = slices[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", name, uid)
    assert {a for e in slices[0]["endpoints"] for a in e["addresses"]} == \
        {ip for ip in pod_ips if ipaddress.ip_address(ip).version == 6}

    (ad,) = advertising(node, admin, sandbox_id)
    router = bgp_router(node, admin)
    assert ad["spec"]["routerRef"] == {"name": router}
    prefixes = set(ad["spec"]["prefixes"])
    v4 = next(ip for ip in pod_ips if ipaddress.ip_address(ip).version == 4)
    assert f"{v4}/32" in prefixes
    assert any(ipaddress.ip_address(ip) in ipaddress.ip_network(prefix)
               for prefix in prefixes if ":" in prefix for ip in pod_ips if ":" in ip)
    (instance,) = [instance for instance in vrf_instances(node, admin)
                   if instance["spec"]["vrfID"] == ad["spec"]["vrfID"]]
    assert instance["spec"]["routerRef"] == {"name": router}

    # One ADD, as the runtime saw it: one sandbox, ready, holding the Pod's IPs (a 1.1.0 config).
    (box,) = sandboxes(node, uid)
    assert (box.id, box.ready, box.netns) == (sandbox_id, True, netns)
    assert {box.ip, *box.additional_ips} == pod_ips
    assert (node.loaded_conflist() or {}).get("cniVersion") == "1.1.0"
    assert sandbox_failures(admin, name) == []
    assert netns_exists(node, netns)

    delete_pod(admin, name)
    # The DEL of the sandbox's stop succeeded: the runtime stopped it and removed its netns.
    wait_until(f"sandbox {sandbox_id} stopped and its netns removed", lambda: not any(
        box.ready for box in sandboxes(node, uid)) and not netns_exists(node, netns), SETTLE_S)
    assert not owned_slices(admin, uid) and not advertising(node, admin, sandbox_id)
    assert wait_nothing_left(node, admin, baseline) == {}

    # kubelet's sandbox GC removes the sandbox later (DEL again, the netns gone): the runtime
    # forgets a sandbox only once that DEL succeeded too.
    wait_until(f"sandbox {sandbox_id} removed by kubelet's sandbox GC",
               lambda: sandboxes(node, uid) == [], GC_DEL_S, interval=1.0)


def test_a_second_pod_shows_in_use_and_starts_once_the_first_is_deleted(
        node: Node, admin: Kube, baseline: Snapshot) -> None:
    first, first_sandbox, _ = start_pod(node, admin, "first")
    second = unique("second")
    create_pod(admin, pod_manifest(second, pause_image(node)))
    wait_until(f"{second}'s FailedCreatePodSandBox event", lambda: any(
        "in use by container" in message for message in sandbox_failures(admin, second)),
        RETRY_S, interval=0.5)
    assert (get_pod(admin, second) or {}).get("status", {}).get("phase") == "Pending"
    assert any(first_sandbox in message for message in sandbox_failures(admin, second))

    delete_pod(admin, first["metadata"]["name"])
    started = wait_running(admin, second, timeout=RETRY_S)
    assert ipaddress.ip_address(started["status"]["podIP"]) in VPC_V4
    delete_pod(admin, second)
    assert wait_nothing_left(node, admin, baseline) == {}


def test_five_create_delete_cycles_leave_nothing(real_node: NodeUnderTest, node: Node,
                                                 admin: Kube, baseline: Snapshot) -> None:
    leaks = []
    for _ in range(5):
        pod, _, _ = start_pod(node, admin, "cycle")
        delete_pod(admin, pod["metadata"]["name"])
        leaks.append(wait_nothing_left(node, admin, baseline))
    real_node.figures["create_delete_cycles"] = {
        "cycles": 5, "leaked": sum(len(items) for left in leaks for items in left.values())}
    assert leaks == [{}] * 5


def test_an_add_asks_the_api_server_only_what_the_agents_watches_cannot_tell(
        real_node: NodeUnderTest, node: Node, admin: Kube, baseline: Snapshot) -> None:
    """The agent knows the node's router, its Pods and the router's VRF instances from its
    watches: an ADD lists nothing and reads no Pod, and creates the new Pod's EndpointSlice
    without reading it first (seen by the proxy between the plugin and the API server)."""
    first, _, _ = start_pod(node, admin, "first")  # the VPC's instance exists from here on
    delete_pod(admin, first["metadata"]["name"])
    assert wait_nothing_left(node, admin, baseline) == {}
    # The agent's Pod watch and kubelet both hear of the Pod when it is bound; on a busy
    # machine (busy run 9: the hog, both lanes, the VM) the ADD can come first, and then reads
    # the Pod once, by design. Such an ADD proves nothing about the watch: another Pod is
    # started, and one of POD_TRIES must read no Pod at all.
    misses = []
    for _ in range(POD_TRIES):
        mark = len(real_node.proxy.seen())
        pod, sandbox_id, _ = start_pod(node, admin, "asks")
        name = pod["metadata"]["name"]
        seen = [s for s in real_node.proxy.seen()[mark:] if "watch=1" not in s.path]
        # One ADD, which succeeded: one sandbox for the Pod and no failed one.
        assert [box.id for box in sandboxes(node, pod["metadata"]["uid"])] == [sandbox_id]
        assert sandbox_failures(admin, name) == []
        lists = [f"{s.method} {s.path}" for s in seen if s.method == "GET" and s.name is None
                 and s.resource in ("bgprouters", "bgpvrfinstances", "pods")]
        assert lists == [], "answered from the agent's watches"
        reads = [f"{s.method} {s.path}" for s in seen if s.resource == "pods" and s.name == name]
        assert len(reads) <= 1, f"the Pod is read once at most: {reads}"
        assert [s.method for s in seen if s.resource == "endpointslices" and
                (s.name is None or s.name.startswith(name))] == ["POST"], \
            "a new Pod's slice is created without reading it first"
        delete_pod(admin, name)
        assert wait_nothing_left(node, admin, baseline) == {}
        if not reads:
            break
        misses.append(name)
    else:
        raise AssertionError(f"every ADD read its Pod from the API ({misses}): the agent's "
                             "Pod watch answered none")
    real_node.figures["api_requests_of_an_add"] = [
        f"{s.method} {s.resource}{'/' + s.name if s.name else ''} -> {s.status}" for s in seen
        if s.resource not in ("selfsubjectaccessreviews", "events", "leases")]
    real_node.figures["adds_before_the_pod_watch"] = len(misses)


def test_a_failing_add_is_the_pods_event_and_the_pod_recovers(
        node: Node, admin: Kube, baseline: Snapshot) -> None:
    """The API server refuses the Pod's EndpointSlice (an admission policy): ADD fails after
    it published the advertisement, rolls that back, and kubelet shows the plugin's message
    and retries until the refusal is lifted. (A missing BGPRouter fails STATUS too, and a
    node whose network is not ready starts no sandbox at all: see the STATUS test.)"""
    name = unique("refused")
    with Denials(admin, unique("deny-slices"), "default") as denials:
        denials.deny(("CREATE", "endpointslices", f"{name}-7d-7d-ipv6"))
        uid = create_pod(admin, pod_manifest(name, pause_image(node)))["metadata"]["uid"]
        wait_until(f"{name}'s FailedCreatePodSandBox event naming the refusal", lambda: any(
            "denied by the fault harness" in message
            for message in sandbox_failures(admin, name)), RETRY_S, interval=0.5)
        assert not [box.id for box in sandboxes(node, uid) if box.ready], \
            "a failed ADD leaves the Pod no ready sandbox"
        assert (get_pod(admin, name) or {}).get("status", {}).get("phase") == "Pending"
        denials.deny()
        pod = wait_running(admin, name, timeout=RETRY_S)
    assert owned_slices(admin, pod["metadata"]["uid"])
    delete_pod(admin, name)
    assert wait_nothing_left(node, admin, baseline) == {}


def test_a_namespace_without_a_binding_is_denied_until_one_is_created(
        real_node: NodeUnderTest, node: Node, admin: Kube, baseline: Snapshot) -> None:
    """The example network is bound to namespace default only (packaging/examples/
    vpcbinding.yaml): a Pod of another namespace fails its sandbox with code 106 and a
    `VPCAttachDenied` Event, and nothing is made for it anywhere; once a VPCBinding admits the
    namespace, kubelet's retry starts it."""
    with tenancy.namespace(admin) as ns:
        name = unique("tenant")
        manifest = pod_manifest(name, pause_image(node), namespace=ns)
        uid = create_pod(admin, manifest)["metadata"]["uid"]
        wait_until(f"{name}'s VPCAttachDenied event", lambda: any(
            event.get("reason") == "VPCAttachDenied" for event in pod_events(admin, name, ns)),
            RETRY_S, interval=0.5)
        # kubelet's FailedCreatePodSandBox comes on its own time, after the plugin's Event.
        wait_until(f"{name}'s sandbox failure naming the binding", lambda: any(
            "no VPCBinding admits it" in message
            for message in sandbox_failures(admin, name, ns)), RETRY_S, interval=0.5,
            detail=lambda: str(sandbox_failures(admin, name, ns)))
        assert not [box.id for box in sandboxes(node, uid) if box.ready], "no sandbox runs"
        assert snapshot(node, admin).added_since(baseline) == {}, "nothing made for it"
        selector = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
        with tenancy.bound(admin, "21", attachments=["21"], selector=selector,
                           uses=("veth",)):
            pod = wait_running(admin, name, ns, timeout=RETRY_S)
            assert ipaddress.ip_address(pod["status"]["podIP"]) in VPC_V4
            real_node.figures["denied_then_admitted"] = [
                f"{e.get('type')} {e.get('reason')}: {e.get('message')}"
                for e in sorted(pod_events(admin, name, ns),
                                key=lambda e: e.get("eventTime") or e.get("firstTimestamp")
                                or "")]
            delete_pod(admin, name, ns)
    assert wait_nothing_left(node, admin, baseline) == {}


def test_status_follows_the_api_and_the_node_reports_its_network(
        real_node: NodeUnderTest, node: Node, admin: Kube) -> None:
    """containerd 2 polls STATUS (cniVersion 1.1.0); with the API unreachable for the plugin
    STATUS fails with code 50 and the node reports its network not ready, then recovers."""
    wait_until("a STATUS from containerd", lambda: any(
        line["cniVersion"] == "1.1.0" and line["outcome"] == "ok"
        for line in verb_lines(node, "STATUS")), SETTLE_S)
    seen = len(verb_lines(node, "STATUS"))
    with real_node.proxy.rules(Rule(Fault.RESET_BEFORE_FORWARD, times=0)):
        wait_until("the node reporting its network not ready",
                   lambda: "NetworkPluginNotReady" in ready_condition(node, admin)["message"],
                   SETTLE_S, interval=0.5)
        wait_until("a failed STATUS in the plugin's log", lambda: any(
            line["outcome"] == "error" for line in verb_lines(node, "STATUS")[seen:]),
            SETTLE_S, interval=0.5)
        failed = [line for line in verb_lines(node, "STATUS")[seen:]
                  if line["outcome"] == "error"]
        assert all(line["code"] == 50 for line in failed), failed
        assert ready_condition(node, admin)["status"] == "False"
        assert "Kubernetes API unavailable" in ready_condition(node, admin)["message"]
    node.wait_schedulable(admin, SETTLE_S * 2)
    assert verb_lines(node, "STATUS")[-1]["outcome"] == "ok"


def test_pods_start_while_the_agent_pod_is_replaced(node: Node, admin: Kube,
                                                    baseline: Snapshot) -> None:
    agent = deploy.agent_pod(admin, node.node_name)
    assert agent is not None
    admin.delete(f"/api/v1/namespaces/{deploy.DAEMONSET[0]}/pods/{agent['metadata']['name']}")
    pod, sandbox_id, netns = start_pod(node, admin, "no-agent")
    assert ipaddress.ip_address(pod["status"]["podIP"]) in VPC_V4
    assert {entry["ip"] for entry in pod["status"]["podIPs"]} == set(pod_addresses(node, netns))
    assert [box.id for box in sandboxes(node, pod["metadata"]["uid"])] == [sandbox_id]
    replacement = deploy.wait_agent_ready(admin, node.node_name)
    assert replacement["metadata"]["uid"] != agent["metadata"]["uid"]
    delete_pod(admin, pod["metadata"]["name"])
    assert wait_nothing_left(node, admin, baseline) == {}


def test_kubelet_and_containerd_restarts_neither_add_nor_delete(node: Node,
                                                                admin: Kube) -> None:
    pod, sandbox_id, netns = start_pod(node, admin, "steady")
    # The runtime calls ADD only to run a new sandbox and DEL only to stop one.
    ready_before = attached_sandboxes(node, admin)
    eth0_before = _eth0(node, netns)
    node.restart_kubelet()
    node.restart_containerd()
    node.wait_schedulable(admin)
    # A host-network Pod started after both restarts: kubelet has synced every Pod by then.
    probe = unique("probe")
    manifest = pod_manifest(probe, pause_image(node))
    manifest["spec"]["hostNetwork"] = True
    create_pod(admin, manifest)
    wait_running(admin, probe)
    assert attached_sandboxes(node, admin) == ready_before, \
        "a restart made the runtime call ADD or DEL"
    assert sandbox(node, pod["metadata"]["uid"]).id == sandbox_id
    assert _eth0(node, netns) == eth0_before, "the Pod's eth0 is the one its ADD made"


def test_a_rebooted_node_brings_its_pods_back_attached_and_leaks_nothing(
        real_node: NodeUnderTest, node: Node, admin: Kube, baseline: Snapshot) -> None:
    pod, old_sandbox, _ = start_pod(node, admin, "reboot")
    uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
    node.reboot()
    node.wait_schedulable(admin, RETRY_S)

    def reattached() -> bool:
        try:
            return sandbox(node, uid).id != old_sandbox
        except LookupError:
            return False

    wait_until("the Pod's new sandbox", reattached, RETRY_S, interval=0.5)
    box = sandbox(node, uid)
    assert box.netns is not None
    addresses = pod_addresses(node, box.netns)
    assert any(ipaddress.ip_address(ip) in VPC_V4 for ip in addresses)
    assert len(owned_slices(admin, uid)) == 1
    wait_until("the old sandbox's annotations withdrawn",
               lambda: not advertising(node, admin, old_sandbox), SETTLE_S)
    assert advertising(node, admin, box.id)
    delete_pod(admin, name)
    left = wait_nothing_left(node, admin, baseline)
    real_node.figures["reboot"] = {"leaked": sum(len(items) for items in left.values()),
                                   "left": left}
    assert left == {}


# -- the publish-after-ptp conflist ---------------------------------------------------------


def test_a_deployment_behind_ptp_publishes_each_pod_and_withdraws_them(
        real_node: NodeUnderTest, node: Node, admin: Kube, baseline: Snapshot) -> None:
    veth = json.loads(next(node.cni_conf_dir.glob("*.conflist")).read_text())
    node.set_conflist(_ptp_conflist())
    name = unique("ptp")
    labels = {"app": name}
    template = pod_manifest(name, pause_image(node), labels=labels)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": name, "namespace": "default"},
                  "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels},
                                        "spec": template["spec"]}}}
    path = "/apis/apps/v1/namespaces/default/deployments"
    try:
        admin.create(path, deployment)
        _scale(admin, name, 8)

        def pods() -> list[dict[str, Any]]:
            return admin.list("/api/v1/namespaces/default/pods", labels=f"app={name}")

        wait_until("8 Pods Running", lambda: sum(
            p.get("status", {}).get("phase") == "Running" and bool(p["status"].get("podIP"))
            for p in pods()) == 8, DEPLOYMENT_S, interval=1.0)
        running = pods()
        ips = {p["status"]["podIP"] for p in running}
        assert len(ips) == 8 and all(ipaddress.ip_address(ip) in PTP_POOL for ip in ips)
        sandboxes = [sandbox(node, p["metadata"]["uid"]).id for p in running]
        (ad,) = {a["metadata"]["name"]: a for s in sandboxes
                 for a in advertising(node, admin, s)}.values()
        assert set(ad["spec"]["prefixes"]) == {f"{ip}/128" for ip in ips}
        slices = [s for p in running for s in owned_slices(admin, p["metadata"]["uid"])]
        assert len(slices) == 8
        assert {a for s in slices for e in s["endpoints"] for a in e["addresses"]} == ips

        _scale(admin, name, 0)
        wait_until("no Pod left", lambda: not pods(), DEPLOYMENT_S, interval=1.0)
        left = wait_nothing_left(node, admin, baseline)
        real_node.figures["deployment_0_8_0"] = {
            "pods": 8, "prefixes": len(ad["spec"]["prefixes"]), "slices": len(slices),
            "leaked": sum(len(items) for items in left.values())}
        assert left == {}
        assert not [a for a in advertisements(node, admin) if a["metadata"]["name"] ==
                    ad["metadata"]["name"]], "an advertisement without prefixes is deleted"
    finally:
        admin.delete(f"{path}/{name}")
        wait_until("the Deployment's Pods gone", lambda: not admin.list(
            "/api/v1/namespaces/default/pods", labels=f"app={name}"), DEPLOYMENT_S)
        node.set_conflist(veth)


def test_one_conflist_serves_two_tenants_each_pod_naming_its_attachment(
        node: Node, admin: Kube, baseline: Snapshot) -> None:
    """The node's conflist with `vpcFromPod` (no Multus): Pods of two namespaces, each bound to
    a VPC of its own, get the attachment their annotation names; DEL removes exactly that."""
    veth = json.loads(next(node.cni_conf_dir.glob("*.conflist")).read_text())
    shared = json.loads(json.dumps(veth))
    ours = next(p for p in shared["plugins"] if p["type"] == "vpc-attach")
    del ours["vpc"], ours["vpcattachment"]
    ours["vpcFromPod"] = True
    chosen = {"a": "aA1", "b": "bB2"}  # tenant -> VPC
    node.set_conflist(shared)
    try:
        with contextlib.ExitStack() as stack:
            names = []
            for tenant, vpc in chosen.items():
                ns = stack.enter_context(tenancy.namespace(admin, {"tenant": tenant}))
                stack.enter_context(tenancy.bound(admin, vpc, selector={
                    "matchLabels": {"tenant": tenant}}, uses=("veth",)))
                manifest = pod_manifest(unique(f"tenant-{tenant}"), pause_image(node), namespace=ns)
                manifest["metadata"]["annotations"] = {ATTACHMENT_ANNOTATION: f"{vpc}/5"}
                create_pod(admin, manifest)
                names.append((manifest["metadata"]["name"], ns))
            for name, ns in names:
                pod = wait_running(admin, name, ns, timeout=RETRY_S)
                assert ipaddress.ip_address(pod["status"]["podIP"]) in VPC_V4
            assert {naming.host_link_name(vpc, "5") for vpc in chosen.values()} <= \
                host_links(node)
            for name, ns in names:
                delete_pod(admin, name, ns)
            assert not {naming.host_link_name(vpc, "5") for vpc in chosen.values()} & \
                host_links(node)
        left = wait_nothing_left(node, admin, baseline)
        # A VPC's policy rules outlive its last attachment (per-VPC state, not this test's).
        ours = tuple(naming.host_link_name(vpc, "5") for vpc in chosen.values())
        left["rules"] = [r for r in left.get("rules", []) if not any(h in r for h in ours)]
        assert {kind: items for kind, items in left.items() if items} == {}
    finally:
        node.set_conflist(veth)
        kernel.remove_vpc_objects(list(chosen.values()))  # the rules this test's VPCs left


# -- a tenant's config naming host settings (SPEC §14) ----------------------------------------


def test_a_conflist_naming_host_settings_is_refused_and_touches_nothing(
        real_node: NodeUnderTest, node: Node, admin: Kube, tmp_path: Path) -> None:
    """The node's conflist as a tenant could write it (a NAD's config is the same stanza):
    containerd's STATUS gets code 7 naming the key, so the node reports its network not ready
    with that message; the file its logFile names and the socket its agentSocket names are
    never touched; the refusals are in the node's own log; the node recovers with its own."""
    veth = json.loads(next(node.cni_conf_dir.glob("*.conflist")).read_text())
    seen = len(verb_lines(node, "STATUS"))
    with planted_victims(tmp_path / "victim") as victims:
        tenant = copy.deepcopy(veth)
        tenant["plugins"][0] = {
            "logFile": str(victims.file), **tenant["plugins"][0], "logMaxBytes": 1,
            "logBackups": 1, "agentSocket": str(victims.listener.path),
            "kubeconfig": str(node.cluster.admin_kubeconfig), "nodeName": "another-node"}
        node.set_conflist(tenant)
        try:
            wait_until("a STATUS refused with code 7 in the node's log", lambda: any(
                line["code"] == 7 for line in verb_lines(node, "STATUS")[seen:]),
                SETTLE_S, interval=0.5)
            refused = [line for line in verb_lines(node, "STATUS")[seen:] if line["code"] == 7]
            # libcni hands the stanza on with its keys sorted: the first named is agentSocket
            assert all("config key 'agentSocket' is a host setting" in line["error"]
                       for line in refused), [line["error"] for line in refused]
            wait_until("the node reporting its network not ready", lambda: "NetworkPluginNot"
                       "Ready" in ready_condition(node, admin)["message"], SETTLE_S,
                       interval=0.5)
            ready = ready_condition(node, admin)
            assert ready["status"] == "False" and "host setting" in ready["message"], ready
            victims.assert_untouched()
        finally:
            node.set_conflist(veth)
        node.wait_schedulable(admin, SETTLE_S * 2)
        victims.assert_untouched()
    real_node.figures["tenant_host_keys"] = {"status_refusals": len(refused),
                                             "victims_untouched": True}


# -- KubeVirt's virt-launcher Pods through kubelet and containerd ------------------------------
# KubeVirt does not run here: the claim, the virt-launcher-like Pods (their VM's label, the
# claim reference in a network-selection element asking for eth0, since no Multus runs) and the
# ready timestamp are written on its behalf (e2e/harness/kubevirt/standins.py). What kubelet
# and containerd do with them is theirs: a container exiting, the phase, the sandbox's DEL, the
# STATUS poll.


def test_a_completed_virt_launcher_pod_keeps_the_claims_addresses_and_holds_the_claim_no_more(
        real_node: NodeUnderTest, node: Node, admin: Kube, baseline: Snapshot) -> None:
    """A virt-launcher-like Pod (restartPolicy Never) whose container exits: kubelet writes
    phase Succeeded — what `kubelet_reports_succeeded` writes in the e2e tests on its behalf —
    and stops its sandbox (the plugin's DEL). The claim keeps its addresses, in its status and
    in the node's records; the Pod keeps nothing: no link, no slice, no announcement, and the
    VM's next Pod gets the addresses announced at once (a Pod still holding the claim would make
    it a migration target, attached but not announced)."""
    started = time.monotonic()
    veth = json.loads(next(node.cni_conf_dir.glob("*.conflist")).read_text())
    node.set_conflist(_vm_network(veth))
    vm = unique("vm")
    claim = kubevirt_creates_claim(admin, "default", VM_NETWORK, vm)["metadata"]["name"]
    made: list[dict[str, Any]] = []
    try:
        first = _launcher(node, admin, claim, vm, exits=True)
        made.append(first)
        wait_until(f"{first['metadata']['name']} Succeeded", lambda: _phase(admin, first) ==
                   "Succeeded", RETRY_S, interval=0.5)
        (box,) = sandboxes(node, first["metadata"]["uid"])
        wait_until(f"{first['metadata']['name']}'s sandbox stopped and its DEL done", lambda:
                   not any(b.ready for b in sandboxes(node, first["metadata"]["uid"]))
                   and any(line["outcome"] == "ok"
                           for line in verb_lines(node, "DEL", container_id=box.id)),
                   RETRY_S, interval=0.5)
        addresses = sorted(claim_status(admin, "default", claim)["ips"])
        assert len(addresses) == 2, addresses
        # Kept: the claim's status and the node's records of its addresses.
        assert _claimed_on(node) == {_host(a): f"default/{claim}" for a in addresses}
        # Freed: the Pod's link, slice and announcement.
        assert naming.host_link_name("21", "21") not in host_links(node)
        assert owned_slices(admin, first["metadata"]["uid"]) == []
        assert advertising(node, admin, box.id) == []

        second = _launcher(node, admin, claim, vm, exits=False)
        made.append(second)
        running = wait_running(admin, second["metadata"]["name"], timeout=RETRY_S)
        assert sorted(ip["ip"] for ip in running["status"]["podIPs"]) == \
            sorted(_host(a) for a in addresses)
        assert claim_status(admin, "default", claim)["ownerPod"]["name"] == \
            second["metadata"]["name"]
        assert _pending_migrations(node) == [], "the completed Pod is no migration source"
        (box2,) = sandboxes(node, second["metadata"]["uid"])
        (announced,) = advertising(node, admin, box2.id)
        assert {_host(a) for a in addresses if ":" not in a} <= \
            {p.split("/")[0] for p in announced["spec"]["prefixes"]}
        assert [e["conditions"]["ready"] for s in owned_slices(admin,
                second["metadata"]["uid"]) for e in s["endpoints"]] == [True]
    finally:
        for pod in made:  # each DEL runs with the VM network's conflist
            _delete_and_wait_stopped(node, admin, pod)
        node.set_conflist(veth)
        kubevirt_deletes_claim(admin, "default", claim)
    # The claim gone, the node's agent frees its addresses: nothing of the VM is left.
    assert wait_nothing_left(node, admin, baseline) == {}
    real_node.figures["completed_virt_launcher_seconds"] = round(time.monotonic() - started, 1)


def test_containerds_own_status_poll_cuts_a_live_migration_over_with_no_agent_on_the_node(
        real_node: NodeUnderTest, node: Node, admin: Kube, baseline: Snapshot, cni_bin: Path,
        tmp_path: Path) -> None:
    """The VM runs on a simulated node (its Pod Pending there, attached by the test as that
    node's runtime would); its migration target is a Pod kubelet starts here, with the node's
    agent gone (the DaemonSet schedules nowhere: every verb runs in-process, no Pod watch; the
    host kubeconfig's token is bound to the Node, not to the deleted agent Pod, so they keep
    their credentials).
    containerd's ADD attaches the target unannounced; KubeVirt's ready timestamp is written on
    its behalf; then nothing but containerd's periodic STATUS runs the plugin on this node, and
    the routes move: this node's advertisement gets the VM's prefixes, the source's loses them."""
    started = time.monotonic()
    veth = json.loads(next(node.cni_conf_dir.glob("*.conflist")).read_text())
    conflist = _vm_network(veth)
    vm = unique("vm")
    with contextlib.ExitStack() as stack:
        stack.callback(deploy.wait_agent_ready, admin, node.node_name)
        stack.callback(_schedule_agent, admin, None)
        _schedule_agent(admin, {NOWHERE_LABEL: "true"})
        wait_until("the node's agent gone", lambda: deploy.agent_pod(admin, node.node_name)
                   is None and not _agent_answers(node), RETRY_S, interval=0.5)
        stack.callback(node.set_conflist, veth)
        node.set_conflist(conflist)
        claim = kubevirt_creates_claim(admin, "default", VM_NETWORK, vm)["metadata"]["name"]
        stack.callback(kubevirt_deletes_claim, admin, "default", claim)
        source = stack.enter_context(_simulated_source(node, admin, cni_bin, tmp_path, conflist,
                                                       claim, vm))
        prefixes = source.prefixes()
        target = _launcher(node, admin, claim, vm, exits=False)
        stack.callback(_delete_and_wait_stopped, node, admin, target)
        wait_running(admin, target["metadata"]["name"], timeout=RETRY_S)
        # The control: a STATUS after the target's ADD leaves it waiting for the timestamp.
        running_ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1))
        wait_until("a STATUS after the target's ADD", lambda: any(
            line["ts"] >= running_ts for line in verb_lines(node, "STATUS")), SETTLE_S,
            interval=0.2)
        assert len(_pending_migrations(node)) == 1, "the target waits for the timestamp"
        assert _advertised(node, admin, node.node_name) == set()
        # By time, not by count: the node's log rotates (a STATUS every few seconds).
        mark_ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        kubevirt_marks_target_ready(admin, "default", target["metadata"]["name"])
        marked = time.monotonic()
        wait_until("containerd's STATUS to cut the migration over", lambda:
                   _advertised(node, admin, node.node_name) == prefixes
                   and _advertised(node, admin, source.name) == set(), RETRY_S, interval=0.2,
                   detail=lambda: _cut_over_seen(node, admin, source, mark_ts))
        cut_over = time.monotonic() - marked
        # Only a STATUS could cut it over here: no agent answers, and an ADD cuts over only
        # its own container (the target's came before the timestamp). It forgets the pending
        # record after the advertisements are written, and writes its line as the verb ends:
        # wait for both (a STATUS that ended in the mark's second without cutting over has a
        # line too, so the line alone does not say the cut over ended; a busy run saw that).
        wait_until("the STATUS that cut over to forget the pending target",
                   lambda: _pending_migrations(node) == [], SETTLE_S, interval=0.2,
                   detail=lambda: _cut_over_seen(node, admin, source, mark_ts))
        wait_until("the STATUS that cut over in the node's log", lambda: any(
            line["ts"] >= mark_ts for line in verb_lines(node, "STATUS")), SETTLE_S,
            interval=0.2, detail=lambda: _cut_over_seen(node, admin, source, mark_ts))
        polled = [line for line in verb_lines(node, "STATUS") if line["ts"] >= mark_ts]
        assert all(line["outcome"] == "ok" for line in polled), \
            [json.dumps(line)[:300] for line in polled if line["outcome"] != "ok"][:5]
        assert deploy.agent_pod(admin, node.node_name) is None and not _agent_answers(node)
        real_node.figures["cut_over_by_containerds_status"] = {
            "seconds_after_the_timestamp": round(cut_over, 2),
            "statuses_meanwhile": len(polled)}
    assert wait_nothing_left(node, admin, baseline) == {}
    real_node.figures["status_cut_over_test_seconds"] = round(time.monotonic() - started, 1)


# -- helpers ------------------------------------------------------------------------------------


def _eth0(node: Node, netns: str) -> tuple[int, frozenset[str]]:
    """A Pod's eth0 as the kernel has it: (ifindex, global addresses)."""
    (link,) = json.loads(node.namespace.run(["nsenter", f"--net={netns}", "ip", "-j", "link",
                                             "show", "dev", "eth0"]))
    return int(link["ifindex"]), frozenset(pod_addresses(node, netns))


def _ptp_conflist() -> dict[str, Any]:
    nad = yaml.safe_load((EXAMPLES / "nad-publish-after-ptp.yaml").read_text())
    conflist: dict[str, Any] = json.loads(nad["spec"]["config"])
    return conflist


def _scale(admin: Kube, name: str, replicas: int) -> None:
    """Set the replicas by a merge patch of the scale subresource: it carries no
    resourceVersion, so the deployment controller's own writes cannot make it conflict."""
    admin.request("PATCH", f"/apis/apps/v1/namespaces/default/deployments/{name}/scale",
                  {"spec": {"replicas": replicas}}, content_type="application/merge-patch+json")


def _vm_network(veth: dict[str, Any]) -> dict[str, Any]:
    """The node's veth-pod conflist with `allowPersistentIPs`: a VM network on eth0."""
    network = copy.deepcopy(veth)
    network["plugins"][0]["allowPersistentIPs"] = True
    return network


def _launcher(node: Node, admin: Kube, claim: str, vm: str, *, exits: bool) -> dict[str, Any]:
    """A virt-launcher-like Pod of ``vm`` on this node naming ``claim`` for eth0; its container
    exits at once (restartPolicy Never) or runs until deleted."""
    manifest = launcher_pod(unique(f"virt-launcher-{vm}"), "default", node.node_name, vm,
                            claim, interface="eth0")
    manifest["spec"].update(terminationGracePeriodSeconds=1, restartPolicy="Never")
    if exits:  # the project's image: nft is there, and exits 0 after printing its version
        container = {"image": node.image_ref, "command": ["/usr/sbin/nft", "--version"]}
    else:
        container = {"image": pause_image(node)}
    manifest["spec"]["containers"] = [{"name": "compute", "imagePullPolicy": "Never",
                                       **container}]
    return create_pod(admin, manifest)


def _phase(admin: Kube, pod: dict[str, Any]) -> str | None:
    found = get_pod(admin, pod["metadata"]["name"]) or {}
    phase = found.get("status", {}).get("phase")
    return str(phase) if phase is not None else None


def _delete_and_wait_stopped(node: Node, admin: Kube, pod: dict[str, Any]) -> None:
    """Delete a Pod and wait until its sandbox is stopped (its DEL ran with this conflist)."""
    delete_pod(admin, pod["metadata"]["name"])
    wait_until(f"{pod['metadata']['name']}'s sandbox stopped", lambda: not any(
        box.ready for box in sandboxes(node, pod["metadata"]["uid"])), SETTLE_S, interval=0.5)


def _host(address: str) -> str:
    return str(ipaddress.ip_interface(address).ip)


def _host_settings(node: Node) -> dict[str, Any]:
    """The node's host file, as its installer wrote it."""
    settings: dict[str, Any] = json.loads(
        (node.host_path("/etc/vpc-attach") / "host.json").read_text())
    return settings


def _on_host(node: Node, node_path: str) -> Path:
    """The host path behind a path of the node under one of its bound directories."""
    for bound in sorted(BOUND, key=len, reverse=True):
        if node_path == bound or node_path.startswith(bound + "/"):
            return node.host_path(bound) / node_path[len(bound):].lstrip("/")
    raise AssertionError(f"{node_path} is no path the node shares with the host")


def _claimed_on(node: Node) -> dict[str, str]:
    """address -> `namespace/name` of each vpc-attach-ipam record an IPAMClaim owns here."""
    root = _on_host(node, _host_settings(node).get("ipamDataRoot", DEFAULT_IPAM_DATA_ROOT))
    return {address: owner.rsplit("@", 1)[0]
            for address, owner in IpamFiles.read(root).claims().items()}


def _pending_migrations(node: Node) -> list[str]:
    """The migration targets recorded on the node, waiting for KubeVirt's timestamp."""
    lock_dir = _on_host(node, _host_settings(node).get("lockDir", DEFAULT_LOCK_DIR))
    directory = lock_dir / MIGRATION_RECORDS
    return sorted(p.name for p in directory.glob("*.json")) if directory.exists() else []


def _advertised(node: Node, admin: Kube, node_name: str) -> set[str]:
    """What ``node_name``'s advertisement of the VM network announces."""
    name = naming.advertisement_name("21", "21", node_name)
    found = admin.get(f"{BGP_API}/namespaces/{node.cluster.bgp_namespace}/bgpadvertisements/"
                      f"{name}")
    return set((found or {}).get("spec", {}).get("prefixes") or [])


def _cut_over_seen(node: Node, admin: Kube, source: SimulatedSource, since: str) -> str:
    """What a cut-over that did not come shows: the plugin's log since the timestamp (STATUS
    lines, warnings; by time: the log rotates), the records still pending, both nodes'
    advertised prefixes."""
    logged = sorted((line for line in plugin_log(node) if str(line.get("ts", "")) >= since
                     and (line.get("verb") or line.get("level") in ("WARNING", "ERROR",
                                                                    "warning", "error"))),
                    key=lambda line: str(line.get("ts", "")))
    return "\n".join([*(json.dumps(line)[:400] for line in logged[-12:]),
                      f"pending: {_pending_migrations(node)}",
                      f"this node advertises {_advertised(node, admin, node.node_name)}",
                      f"the source advertises {source.prefixes()}"])


def _schedule_agent(admin: Kube, selector: dict[str, str] | None) -> None:
    """The DaemonSet's Pods only on nodes with these labels (None: on every node again)."""
    namespace, name = deploy.DAEMONSET
    admin.request("PATCH", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}",
                  {"spec": {"template": {"spec": {"nodeSelector": selector}}}},
                  content_type="application/merge-patch+json")


def _agent_answers(node: Node) -> bool:
    """Whether anything accepts on the node's agent socket."""
    path = _on_host(node, _host_settings(node).get("agentSocket", DEFAULT_AGENT_SOCKET))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@dataclass
class SimulatedSource:
    """The VM's source node: a namespace of its own, its BGPRouter, the plugin with its name."""

    name: str
    admin: Kube
    node: Node

    def prefixes(self) -> set[str]:
        """What its advertisement of the VM network announces."""
        return _advertised(self.node, self.admin, self.name)


@contextlib.contextmanager
def _simulated_source(node: Node, admin: Kube, cni_bin: Path, directory: Path,
                      conflist: dict[str, Any], claim: str,
                      vm: str) -> Iterator[SimulatedSource]:
    """The VM running on another node, simulated (no kubelet there): its virt-launcher Pod
    (Pending, bound to that node) attached by the test as that node's runtime would, and
    announced; DEL and its objects removed afterwards."""
    # A Node object for it: PodGC deletes a Pod bound to no Node (after 40 s), and the
    # garbage collector an advertisement whose owner Node does not exist.
    with node_objects(admin, 1, prefix="src-node") as (name,):
        source = SimulatedSource(name, admin, node)
        router = create_router(admin, source.name)
        locks, data_root = directory / "src-locks", directory / "src-ipam"
        locks.mkdir()
        data_root.mkdir()
        with node_namespace(api_port(node.cluster.server)) as netns, \
                temporary_netns("vpa-src") as pod_netns:
            plugin = Plugin(cni_bin, locks, prefix=in_node(netns), environ={
                "VPC_ATTACH_NODE_NAME": source.name,
                "VPC_ATTACH_KUBECONFIG": str(node.cluster.plugin_kubeconfig),
                "VPC_ATTACH_IPAM_DATA_ROOT": str(data_root)})
            pod, uid = kubevirt_starts_launcher(admin, "default", source.name, claim, vm,
                                                interface="eth0")
            conf = {"cniVersion": conflist["cniVersion"], "name": conflist["name"],
                    **conflist["plugins"][0]}
            calls = {"container_id": f"ctr-{pod}", "netns": pod_netns,
                     "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
                                 f"K8S_POD_UID={uid}"}
            result = plugin.ok("ADD", conf, **calls)
            try:
                assert len(source.prefixes()) == 2, source.prefixes()
                yield source
            finally:
                plugin.ok("DEL", with_prev(conf, result), **calls)
                admin.delete(f"/api/v1/namespaces/default/pods/{pod}", grace_period_seconds=0)
                admin.delete(f"{BGP_API}/namespaces/{node.cluster.bgp_namespace}/bgprouters/"
                             f"{router}")
                admin.delete(f"{BGP_API}/namespaces/{node.cluster.bgp_namespace}/bgpvrfinstances/"
                             f"{naming.vrf_instance_name('21', source.name)}")
