"""The upgrade test's scene on a real node (SPEC §18, `e2e/test_upgrade.py`): the node started
on the previous release, what each release attaches (veth Pods in two VPCs with the same
subnets, a VM stand-in's tap with its IPAMClaim, an attachment the runtime then forgets), the
live traffic between them, a roll of the DaemonSet under it with Pods created meanwhile, what a
roll left (snapshots compared part by part), the agent protocol between the releases, removing
what a release made down to the node as it was, and an agent killed in the middle of an ADD.

KubeVirt and Multus do not run here: the VM is a stand-in — a virt-launcher-like Pod started by
kubelet, its IPAMClaim made as kubevirt's ipam-extensions makes it, its tap network attached by
the node's own `/opt/cni/bin/vpc-attach` called as Multus calls it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from cni_plugin.core import naming
from e2e.harness.faults import Fault, ProxiedCluster, Rule, start_proxy
from e2e.harness.image import Release
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.standins import (
    NETWORKS_ANNOTATION,
    kubevirt_creates_claim,
    kubevirt_deletes_claim,
)
from e2e.harness.liveconn import LiveTraffic, Traffic, echo_server
from e2e.harness.tenancy import create_binding, delete_binding
from e2e.harness.wait import wait_until
from e2e.node import deploy
from e2e.node.node import EXAMPLES, Node, kernel_has_vrf
from e2e.node.node import down as node_down
from e2e.node.observe import delete_pod, get_pod, plugin_log, sandbox_failures, verb_lines
from e2e.node.roll import (
    AddStream,
    Attached,
    agent_verbs,
    attachment_pod,
    cached_result,
    call,
    doctor,
    kill_agent,
    other_build,
    plugin_stanza,
    refused_frame,
    refusing_agent,
    running,
    start,
    valid_attachments,
)
from e2e.node.state import (
    LOCK_DIR,
    POLICY_RECORDS,
    Comparison,
    Snapshot,
    compare,
    nft_without_handles,
    not_attachment_state,
    snapshot,
)
from netconf.base62 import decode_base62

log = logging.getLogger(__name__)


VPC_A, VPC_B, VPC_VM = "upA", "upB", "upV"  # base62 VPC ids: one pool, two VPCs; the VM's
NETWORK = "upgrade"  # the node's conflist
VM_NETWORK = "upgrade-vm"
PORT = 7400
GALACTIC_NAMESPACE = "galactic-system"  # the node's BGP namespace
LOG_CLOCK_SLACK_S = 1.0  # log lines are stamped at the end of the call, in milliseconds
FLOW_KINDS = ("connection", "udp probe", "tcp probe")
SEVERITY = ("skip", "ok", "warn", "fail")  # doctor's statuses, least to most
SETTLE_S = 120.0  # the kubelet deleting Pods, GC and the agent freeing a claim
HOLD_S = 30.0  # how long the fault proxy holds the killed ADD's request: long past the kill

# -- the node ----------------------------------------------------------------------------------


def node_conflist() -> dict[str, Any]:
    """The veth-pod example with `vpcFromPod`: each Pod's annotation picks its VPC attachment
    (one pool for every VPC: their subnets overlap); `table` isolation on a kernel without
    VRF."""
    nad = yaml.safe_load((EXAMPLES / "nad-veth-pod.yaml").read_text())
    conflist: dict[str, Any] = json.loads(nad["spec"]["config"])
    conflist["name"] = NETWORK
    stanza = next(p for p in conflist["plugins"] if p["type"] == "vpc-attach")
    del stanza["vpc"], stanza["vpcattachment"]
    stanza["vpcFromPod"] = True
    stanza["isolation"] = isolation()
    return conflist


@functools.cache
def isolation() -> str:
    """`vrf` where this kernel has VRF, else `table`."""
    return "vrf" if kernel_has_vrf() else "table"


def vm_network() -> dict[str, Any]:
    """The VM's network as Multus hands it to vpc-attach: a tap with a pool and
    allowPersistentIPs (its IPAMClaim keeps the addresses)."""
    return {"cniVersion": "1.1.0", "name": VM_NETWORK, "type": "vpc-attach", "vpc": VPC_VM,
            "vpcattachment": "1", "attachment": "tap", "mtu": 1400,
            "isolation": isolation(),
            "allowPersistentIPs": True,
            "publish": {"bgp": True, "endpointSlice": True},
            "ipam": {"type": "vpc-attach-ipam", "ipv6_subnet": "fd00:61:ff01::/48",
                     "ipv4_subnet": "10.61.0.0/24"}}


@dataclass
class Upgrade:
    """The module's node, both releases, and the figures the module reports."""

    node: Node
    previous: Release
    current: Release
    proxied: ProxiedCluster
    admin: Kube
    baseline: Snapshot
    scratch: Path  # the test's own directory (the node's mount namespace sees it too)
    figures: dict[str, Any] = field(default_factory=dict)



@contextlib.contextmanager
def upgrade_node(base: Path, previous: Release, current: Release,
                 report: Callable[[dict[str, Any]], None]) -> Iterator[Upgrade]:
    """A node running the previous release, with the VPCBindings of the scene; at the end,
    whatever a failed phase left collected, the node down, and `report` given the figures
    (with the links the node left on the host under `left_on_host`)."""
    conflist = base / "conflist.json"
    conflist.write_text(json.dumps(node_conflist()))
    proxied: list[ProxiedCluster] = []

    def through_proxy(cluster: Any) -> str:
        proxied.append(start_proxy(cluster, base))
        return proxied[0].proxy.url

    started = time.monotonic()
    try:
        node = Node.up(base / "state", conflist=conflist, plugin_server=through_proxy,
                       release=previous)
    except BaseException:
        node_down(base / "state")
        for made in proxied:
            made.stop()
        raise
    figures: dict[str, Any] = {"previous": previous.commit, "current": current.commit,
                               "node_up_s": round(time.monotonic() - started, 1)}
    links_before = host_links()
    try:
        with node.admin() as admin:
            bindings = [create_binding(admin, vpc, uses=uses) for vpc, uses in
                        ((VPC_A, ("veth",)), (VPC_B, ("veth",)), (VPC_VM, ("tap",)))]
            scene = Upgrade(node, previous, current, proxied[0], admin,
                            snapshot(node, admin), base, figures)
            try:
                yield scene
            finally:
                figures["teardown"] = collect_everything(node)
            for name in bindings:
                delete_binding(admin, name)
    finally:
        figures["down_problems"] = node.down()
        proxied[0].stop()
        figures["left_on_host"] = sorted(host_links() - links_before)
        report(figures)


def collect_everything(node: Node) -> dict[str, Any]:
    """Whatever a failed phase left: GC of both networks with nothing valid (the node's
    sandboxes get their DEL from `down`; the VM's tap and the orphans have no sandbox), the
    orphans' netns removed; what GC answered."""
    answers = {}
    for conf in (plugin_stanza(node_conflist()), vm_network()):
        answers[conf["name"]] = call(node, "GC", valid_attachments(conf, [])).status
    for name in node.namespace.run(["ip", "netns", "list"]).split():
        if "-orphan-" in name:
            node.namespace.run(["ip", "netns", "delete", name])
    return answers


def host_links() -> set[str]:
    """The host's link names (the node shares the host's network namespace)."""
    listed = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True,
                            timeout=30, check=True, stdin=subprocess.DEVNULL).stdout
    return {link["ifname"] for link in json.loads(listed)}


# -- what each release makes -------------------------------------------------------------------


@dataclass
class World:
    """The attachments one release made, and the traffic between them."""

    made_by: str
    pods: dict[str, Attached]  # A1, A2 (VPC A), B1, B2 (VPC B), V (the VM's launcher)
    vm_result: dict[str, Any]  # the tap's ADD result (net1 of V)
    claim: str
    orphan: Attached  # an attachment whose sandbox the runtime then forgets
    orphan_result: dict[str, Any]
    servers: list[Any] = field(default_factory=list)
    traffic: list[LiveTraffic] = field(default_factory=list)

    @property
    def sides(self) -> list[Any]:
        return [pod.side() for pod in self.pods.values()]

    def needles(self) -> list[str]:
        """What identifies these attachments in a snapshot: container IDs and addresses."""
        ids = [pod.sandbox_id for pod in self.pods.values()] + [self.orphan.sandbox_id]
        addresses = [a for pod in self.pods.values() for a in pod.addresses]
        addresses += [ip["address"].split("/")[0] for ip in self.vm_result.get("ips", [])]
        addresses += [ip["address"].split("/")[0] for ip in self.orphan_result.get("ips", [])]
        return ids + addresses


def make_world(up: Upgrade, made_by: str, first_attachment: int) -> World:
    """Veth Pods A1, A2 in VPC A and B1, B2 in VPC B, the VM's launcher V with its tap and
    IPAMClaim, and an orphan; connections from A2 to A1 and from B2 to B1."""
    node, admin = up.node, up.admin
    started = time.monotonic()
    tag = secrets.token_hex(2)
    plan = {"A1": VPC_A, "A2": VPC_A, "B1": VPC_B, "B2": VPC_B}
    for number, (role, vpc) in enumerate(plan.items(), first_attachment):
        admin.create("/api/v1/namespaces/default/pods", attachment_pod(
            f"{made_by}-{role.lower()}-{tag}", node, vpc, str(number)))
    pods = {role: running(admin, node, f"{made_by}-{role.lower()}-{tag}") for role in plan}
    claim = kubevirt_creates_claim(admin, "default", VM_NETWORK,
                                   vm=f"vm-{made_by}-{tag}")["metadata"]["name"]
    element = [{"name": VM_NETWORK, "namespace": "default", "ipam-claim-reference": claim}]
    pods["V"] = start(admin, node, attachment_pod(
        f"{made_by}-launcher-{tag}", node, VPC_A, str(first_attachment + 4),
        {NETWORKS_ANNOTATION: json.dumps(element)}))
    vm = pods["V"]
    vm_result = call(node, "ADD", vm_network(), container_id=vm.sandbox_id, netns=vm.netns,
                     ifname="net1", cni_args=vm.cni_args()).ok()
    orphan, orphan_result = make_orphan(up, made_by, tag, first_attachment + 5)
    world = World(made_by, pods, vm_result, claim, orphan, orphan_result)
    for server, client in (("A1", "A2"), ("B1", "B2")):
        world.servers.append(echo_server(enter_pod(node), pods[server].netns, PORT))
        world.traffic.append(LiveTraffic(enter_pod(node), pods[client].netns,
                                         pods[server].addresses, PORT))
    log.info("the %s release's attachments made, traffic running, in %.1f s", made_by,
             time.monotonic() - started)
    return world


def make_orphan(up: Upgrade, made_by: str, tag: str, attachment: int
                ) -> tuple[Attached, dict[str, Any]]:
    """An attachment of a Pod bound to another node, in a netns of the test's own, made by the
    node's executable: a sandbox the runtime will not list as valid (GC removes it)."""
    node, admin = up.node, up.admin
    name = f"{made_by}-orphan-{tag}"
    manifest = attachment_pod(name, node, VPC_A, str(attachment))
    manifest["spec"]["nodeName"] = "elsewhere"  # never started by this node's kubelet
    pod = admin.create("/api/v1/namespaces/default/pods", manifest)
    netns = f"/var/run/netns/{name}"  # where the agent container sees netns mounts
    node.namespace.run(["ip", "netns", "add", name])
    orphan = Attached(pod, f"orphan{secrets.token_hex(8)}", netns)
    result = call(node, "ADD", plugin_stanza(node_conflist()), container_id=orphan.sandbox_id,
                  netns=netns, ifname="eth0", cni_args=orphan.cni_args()).ok()
    return orphan, result


def enter_pod(node: Node) -> Any:
    """(netns, argv) -> argv run in that Pod netns, from the node's mount namespace."""
    return lambda netns, argv: node.namespace.enter(["nsenter", f"--net={netns}", *argv])


def stop_traffic(world: World) -> Traffic:
    """End the connections and servers; what every flow saw."""
    seen = Traffic()
    for client in world.traffic:
        seen.flows += client.stop().flows
    for server in world.servers:
        server.stop()
    world.traffic, world.servers = [], []
    return seen


# -- rolling -------------------------------------------------------------------------------------


@dataclass
class Roll:
    """What a roll from one release to the other did to the world it rolled under."""

    before: Snapshot
    after: Snapshot
    comparison: Comparison
    stream: list[str]  # the Pods created while it rolled
    adds: list[dict[str, Any]]  # their ADD summary lines (every attempt)
    sandbox_failures: dict[str, list[str]]
    seconds: float
    doctor: dict[str, Any]
    began: float  # wall clock (time.time()) when the new packaging was applied
    installed: float  # wall clock when the new DaemonSet Pod's installer finished
    protocol: dict[str, Any]  # the other release's executable and a refusal, after the roll
    doctor_before: dict[str, Any]  # the releasing release's doctor, before the roll

    def doctor_changes(self) -> dict[str, tuple[str, str]]:
        """Checks both doctors ran whose status differs (check: (before, after))."""
        def statuses(report: dict[str, Any]) -> dict[str, str]:
            worst: dict[str, str] = {}
            for finding in report.get("checks", []):
                known = worst.get(finding["check"], "skip")
                worst[finding["check"]] = max(known, finding["status"], key=SEVERITY.index)
            return worst
        before, after = statuses(self.doctor_before), statuses(self.doctor)
        return {check: (before[check], after[check]) for check in before.keys() & after.keys()
                if before[check] != after[check]}

    def failed_adds(self) -> list[dict[str, Any]]:
        """ADD summary lines that answered an error."""
        return [line for line in self.adds if line.get("outcome") != "ok"]

    def refused_credentials_in_the_window(self) -> list[dict[str, Any]]:
        """Failed ADDs whose credentials the API server refused between the start of the roll
        and the moment the new Pod's installer had written its token: the host then held
        only the replaced Pod's own token, which dies with that Pod."""
        return [line for line in self.failed_adds()
                if "rejected the plugin's credentials" in line.get("error", "")
                and self.began <= _wall(line["ts"]) <= self.installed + LOG_CLOCK_SLACK_S]


def _wall(timestamp: str) -> float:
    """A log line's `ts` (UTC, milliseconds, `Z`) as time.time() counts."""
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _finished(pod: dict[str, Any], container: str) -> float:
    """When the Pod's init container `container` finished (wall clock)."""
    status = next(s for s in pod["status"]["initContainerStatuses"] if s["name"] == container)
    return _wall(status["state"]["terminated"]["finishedAt"])


def roll(up: Upgrade, world: World, to: Release, stream_prefix: str, first: int) -> Roll:
    """Snapshot, roll the DaemonSet to `to` while a Pod is created every STREAM_PERIOD_S, wait
    for those Pods, snapshot again."""
    before = settled_snapshot(up, world)
    doctor_before = doctor(up.node)
    started, began = time.monotonic(), time.time()
    with AddStream(up.admin, up.node, stream_prefix, VPC_A, first) as stream:
        agent = up.node.roll_to(up.admin, to)
    seconds = time.monotonic() - started
    log.info("rolled to %s in %.1f s; %d Pods created meanwhile", to.image.ref, seconds,
             len(stream.names))
    assert stream.error is None, f"creating Pods during the roll failed: {stream.error}"
    for name in stream.names:
        running(up.admin, up.node, name)
    log.info("the Pods created during the roll run, %.1f s after it began",
             time.monotonic() - started)
    after = snapshot(up.node, up.admin, world.sides)
    adds = [line for name in stream.names for line in verb_lines(up.node, "ADD")
            if line.get("pod") == f"default/{name}"]
    failures = {name: sandbox_failures(up.admin, name) for name in stream.names}
    return Roll(before, after, compare(before, after), stream.names, adds,
                {k: v for k, v in failures.items() if v}, seconds, doctor(up.node), began,
                _finished(agent, "install"), protocol_across(up, world), doctor_before)


def protocol_across(up: Upgrade, world: World) -> dict[str, Any]:
    """After a roll: the other release's executable (still staged) is served by this
    release's agent; the agent refuses another protocol version; and behind an agent that
    refuses, either executable runs the verb itself."""
    node, pod = up.node, world.pods["A1"]
    conf = {**plugin_stanza(node_conflist()),
            "prevResult": cached_result(node, NETWORK, pod.sandbox_id, "eth0")}
    check = partial(call, node, "CHECK", conf, container_id=pod.sandbox_id, netns=pod.netns,
                    ifname="eth0", cni_args=pod.cni_args())
    other, served = other_build(node), agent_verbs(node, "CHECK")
    answered = check(executable=other).status
    wait_until("the agent counted the other release's CHECK",
               lambda: agent_verbs(node, "CHECK") > served, SETTLE_S)
    refusal = refused_frame(node, b"vpa9" + (0).to_bytes(4, "big"))
    with refusing_agent(up.scratch) as (path, seen):
        fallbacks = {"this release's": check(agent_socket=path).status,
                     "the other release's": check(executable=other, agent_socket=path).status}
    return {"other release's executable via the agent": answered,
            "agent's answer to protocol vpa9": refusal.decode(errors="replace"),
            "in-process behind a refusing agent": fallbacks,
            "requests the refusing agent got": [first.decode(errors="replace") for first in seen]}


def settled_snapshot(up: Upgrade, world: World) -> Snapshot:
    """The snapshot once the kernel finished duplicate address detection on every address
    (it clears `tentative` by itself a moment after ADD: not the roll's doing)."""
    taken: list[Snapshot] = []

    def settled() -> bool:
        taken.append(snapshot(up.node, up.admin, world.sides))
        return not taken[-1].tentative()

    wait_until("duplicate address detection done", settled, SETTLE_S, interval=0.5)
    return taken[-1]


def roll_figures(done: Roll, traffic: Traffic) -> dict[str, Any]:
    """The figures the closing note quotes."""
    durations = [line.get("durationMs", 0) for line in done.adds]
    return {
        "roll_s": round(done.seconds, 1),
        "longest_gap_s": {kind: traffic.longest_gap_s(kind) for kind in FLOW_KINDS},
        "flows": [flow.__dict__ for flow in traffic.flows],
        "adds": {"pods": len(done.stream), "attempts": len(done.adds),
                 "failed": done.failed_adds(),
                 "refused credentials in the window": len(
                     done.refused_credentials_in_the_window()),
                 "window_s": round(done.installed - done.began, 1),
                 "slowest_ms": max(durations, default=None),
                 "sandbox_failures": done.sandbox_failures},
        "snapshot": done.comparison.report(),
        "doctor_ok": {"before": done.doctor_before.get("ok"), "after": done.doctor.get("ok"),
                      "changed checks": done.doctor_changes()},
        "protocol": done.protocol,
    }


# -- removing what a release made ----------------------------------------------------------------


def remove_world(up: Upgrade, world: World, stream: list[str]) -> dict[str, Any]:
    """CHECK every attachment of `world` with the node's current release, then DEL (kubelet
    deleting the Pods, the VM's tap as Multus would), GC of both networks with what the runtime
    still runs, the claim deleted; what each step answered."""
    node, admin = up.node, up.admin
    checks = {}
    stanza = plugin_stanza(node_conflist())
    for role, pod in world.pods.items():
        prev = cached_result(node, NETWORK, pod.sandbox_id, "eth0")
        checks[role] = call(node, "CHECK", {**stanza, "prevResult": prev},
                            container_id=pod.sandbox_id, netns=pod.netns, ifname="eth0",
                            cni_args=pod.cni_args()).status
    vm = world.pods["V"]
    checks["V/net1"] = call(node, "CHECK", {**vm_network(), "prevResult": world.vm_result},
                            container_id=vm.sandbox_id, netns=vm.netns, ifname="net1",
                            cni_args=vm.cni_args()).status
    checks["orphan"] = call(node, "CHECK", {**stanza, "prevResult": world.orphan_result},
                            container_id=world.orphan.sandbox_id, netns=world.orphan.netns,
                            ifname="eth0", cni_args=world.orphan.cni_args()).status
    for name in [pod.name for pod in world.pods.values()] + stream:
        admin.delete(f"/api/v1/namespaces/default/pods/{name}")
    names = [pod.name for pod in world.pods.values()] + stream
    wait_until("the Pods gone (their DELs done)",
               lambda: all(get_pod(admin, name) is None for name in names), SETTLE_S)
    gc_began = time.time() - LOG_CLOCK_SLACK_S
    gc_node = call(node, "GC", valid_attachments(stanza, []))
    gc_vm = call(node, "GC", valid_attachments(vm_network(), []))
    gc_found = [line["msg"] for line in plugin_log(node)  # what GC removed, in its words
                if str(line.get("msg", "")).startswith("GC:") and _wall(line["ts"]) >= gc_began]
    admin.delete(f"/api/v1/namespaces/default/pods/{world.orphan.name}")
    node.namespace.run(["ip", "netns", "delete", world.orphan.netns.rsplit("/", 1)[1]])
    freed_uid = kubevirt_deletes_claim(admin, "default", world.claim)
    return {"checks": checks, "gc": {"node network": gc_node.status, "vm network": gc_vm.status},
            "gc found": gc_found, "orphan": world.orphan.sandbox_id, "claim_uid": freed_uid}


def left_of(up: Upgrade, needles: list[str], *, by_previous: bool = False) -> dict[str, Any]:
    """Until nothing mentioning `needles` (container IDs, addresses) is left on the node or in
    the API, nor anything beyond the node's baseline (or SETTLE_S): what still is, and what
    is left by design, named (`by_design`; `by_previous`: the previous release removed them)."""
    left: dict[str, Any] = {}

    def clean() -> bool:
        now = snapshot(up.node, up.admin)
        beyond = compare(up.baseline, now).added
        left["mentioning"] = [k for k in sorted(now.keys_of(*needles))
                              if not by_design(k, now, by_previous)]
        left["beyond baseline"] = [key for key in beyond if not by_design(key, now, by_previous)]
        left["by_design"] = [key for key in beyond if by_design(key, now, by_previous)]
        left["nft rules as in the baseline"] = \
            nft_without_handles(up.baseline) == nft_without_handles(now)
        return not left["mentioning"] and not left["beyond baseline"] and \
            left["nft rules as in the baseline"]

    with contextlib.suppress(TimeoutError):
        wait_until("nothing of the removed attachments left", clean, SETTLE_S, interval=0.5)
    return left


def by_design(key: str, now: Snapshot, by_previous: bool = False) -> bool:
    """Left on purpose, by either release, and named:
    - flock files, pool cursors, the policy keeper's status: no attachment's state
      (`not_attachment_state`);
    - `by_previous`: the policy record (lockDir/policy/<container>-<interface>.json) of an
      attachment of this release that the previous release deleted: 041aa67 predates policy
      (SPEC §17) and knows no such file; this release's GC of the network removes it once
      the node rolls forward again (`agent_killed_mid_add` shows it);
    - `inet vpc_attach`'s objects: compared without their handles (the previous release
      rewrites the table at every start: same rules, new handles);
    - the BGPVRFInstance of a VPC with no attachment left on the node: DEL never deletes one
      (SPEC §6), and GC of a `vpcFromPod` network deletes those of the VPCs its attachments'
      records name, which DEL removed with the VPC's last attachment (both releases: a gap of
      GC, not of the upgrade)."""
    if not_attachment_state(key) or key.startswith("nft "):
        return True
    if by_previous and key.startswith(f"file {LOCK_DIR}/{POLICY_RECORDS}/"):
        return True
    prefix = f"api BGPVRFInstance {GALACTIC_NAMESPACE}/"
    if not key.startswith(prefix):
        return False
    vpc = next((v for v in (VPC_A, VPC_B, VPC_VM) if key.startswith(f"{prefix}{vpc_hex(v)}-")),
               None)
    vpc_links = f"link G{naming.pad_base62(vpc, naming.VPC_WIDTH)}" if vpc else ""
    return bool(vpc) and not any(part.startswith(vpc_links) for part in now.parts)


def vpc_hex(vpc: str) -> str:
    """hex(vpc) as object names carry it (SPEC §6)."""
    return format(decode_base62(vpc), "x")



@dataclass
class Phase:
    """One release's world and the roll to the other release under it."""

    world: World
    done: Roll
    traffic: Traffic


def world_rolled(up: Upgrade, made_by: str, to: Release, first: int, key: str) -> Phase:
    """`made_by`'s world, the DaemonSet rolled to `to` under it, the traffic stopped; its
    figures under `key`."""
    world = make_world(up, made_by, first)
    done = roll(up, world, to, f"during-{key}", first + 100)
    traffic = stop_traffic(world)
    up.figures[key] = roll_figures(done, traffic)
    return Phase(world, done, traffic)


def world_removed(up: Upgrade, phase: Phase, key: str, *, by_previous: bool = False
                  ) -> dict[str, Any]:
    """The phase's attachments checked, deleted and collected by the release now running
    (`by_previous`: the previous one); what each step answered and what was left, under
    `key` of the figures."""
    removed = remove_world(up, phase.world, phase.done.stream)
    removed["left"] = left_of(up, phase.world.needles(), by_previous=by_previous)
    up.figures[key] = removed
    return removed


def agent_killed_mid_add(up: Upgrade) -> dict[str, Any]:
    """The roll to this release begins while the previous release's agent serves an ADD (held
    by the fault proxy at its EndpointSlice: kernel and IPAM work done); the agent, draining
    after SIGTERM, is SIGKILLed as the kubelet does past the grace period; the kubelet's retry
    runs on the new release. What the killed ADD's sandbox left once the Pod runs, and what
    the Pod left once deleted and collected."""
    node, admin = up.node, up.admin
    name, attachment = f"killed-{secrets.token_hex(2)}", "400"
    held = Rule(Fault.DELAY_FORWARD, method="POST", resource="endpointslices", delay=HOLD_S)
    with up.proxied.proxy.rules(held):
        admin.create("/api/v1/namespaces/default/pods",
                     attachment_pod(name, node, VPC_A, attachment))
        wait_until("the ADD held at its EndpointSlice", lambda: held.matched >= 1, SETTLE_S)
        killed_sandbox = recorded_container(node, VPC_A, attachment)
        rolling = RollInBackground(node, admin, up.current).start()
        wait_until("the previous release's DaemonSet Pod terminating",
                   lambda: agent_terminating(admin, node), SETTLE_S)
        killed = kill_agent(node)
    rolling.join()
    pod = running(admin, node, name)
    leaked = {key for key in snapshot(node, admin).keys_of(killed_sandbox)
              if not shared_instance(key)}
    delete_pod(admin, name)
    stale = policy_records(node)  # the rolled-back VM's: the previous release's DEL left it
    stale_formats = {name: json.loads((policy_directory(node) / name).read_text()).get(
        "formatVersion") for name in stale}  # this release's, read by its GC below
    call(node, "GC", valid_attachments(plugin_stanza(node_conflist()), []))
    call(node, "GC", valid_attachments(vm_network(), []))
    calls = [line for line in verb_lines(node) if line.get("pod") == f"default/{name}"]
    found = {"killed_pids": killed, "killed_sandbox": killed_sandbox,
             "retried_sandbox": pod.sandbox_id, "calls": calls,
             "failed DELs of the killed sandbox": [
                 line for line in calls if line["verb"] == "DEL" and line["outcome"] != "ok"
                 and line["containerID"] == killed_sandbox],
             "left by the killed sandbox": sorted(leaked),
             "left after": left_of(up, [pod.sandbox_id, killed_sandbox, *pod.addresses]),
             "stale policy records collected by GC": sorted(stale - policy_records(node)),
             "formatVersion of the stale policy records": stale_formats}
    up.figures["killed mid-ADD"] = found
    return found


def policy_records(node: Node) -> set[str]:
    """The policy records (SPEC §17) in the node's lockDir, by file name (the keeper's status
    aside)."""
    return {path.name for path in policy_directory(node).glob("*.json")
            if path.name != "status.json"}


def policy_directory(node: Node) -> Path:
    """lockDir/policy on the node, as the host sees it."""
    return node.host_path("/run") / LOCK_DIR.removeprefix("/run/") / POLICY_RECORDS


def shared_instance(key: str) -> bool:
    """A VPC's BGPVRFInstance on the node: shared by the VPC's attachments and kept (SPEC §6);
    its created-by mark names whichever ADD created it, a killed one included."""
    return key.startswith(f"api BGPVRFInstance {GALACTIC_NAMESPACE}/")


def recorded_container(node: Node, vpc: str, attachment: str) -> str:
    """The container whose ADD recorded (vpc, attachment) as its `vpcFromPod` choice."""
    records = node.host_path("/run") / "vpc-attach/locks/attachments"
    for path in records.glob("*.json"):
        chosen = json.loads(path.read_text())
        if (chosen.get("vpc"), chosen.get("vpcattachment")) == (vpc, attachment):
            return path.name.split("@", 1)[0]
    raise AssertionError(f"no ADD recorded {vpc}/{attachment} in {records}")


def agent_terminating(admin: Kube, node: Node) -> bool:
    """Whether the DaemonSet's Pod on the node is being deleted (the roll began)."""
    pods = admin.list(f"/api/v1/namespaces/{deploy.DAEMONSET[0]}/pods", labels=deploy.POD_LABEL)
    return any(p["spec"].get("nodeName") == node.node_name
               and p["metadata"].get("deletionTimestamp") for p in pods)


class RollInBackground:
    """`Node.roll_to` on a thread of its own; `join` waits for it and raises what it raised."""

    def __init__(self, node: Node, admin: Kube, to: Release) -> None:
        self.node, self.admin, self.to = node, admin, to
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="roll", daemon=True)

    def start(self) -> RollInBackground:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self.node.roll_to(self.admin, self.to)
        except BaseException as exc:  # raised again in join
            self.error = exc

    def join(self) -> None:
        self.thread.join(timeout=deploy.ROLL_S + 60.0)
        assert not self.thread.is_alive(), "the roll did not finish"
        if self.error is not None:
            raise self.error
