"""The fault matrix of issue 10 (SPEC §7, §9): every write ADD and DEL make, each API fault,
then success or a later failure — through a fault proxy in front of the real API server; and
the API server paused mid-ADD or for a whole rollback (what it left, GC removes once unused),
GC keeping an L2-only tap's instance, and a node reboot.

After each case: objects that did not exist before a failed ADD are gone; shared objects keep
their spec and other annotations byte for byte; a retried ADD converges, CHECK passes and DEL
leaves nothing (no link, IPAM reservation, annotation or slice); every answer came within the
deadline plus its margin (`late_after`). The deadline cases run with the short deadline
(`TIMEOUT_S`); every other call with a roomy one (`ROOMY_TIMEOUT_S`), as its deadline is not
what it tests. The matrix and a case are the scene of
`e2e.harness.faults.matrix`.
What the cases did is counted (`Figures`) and reported at the end of the module: printed, and
written to `fault-matrix-<path>.json` in pytest's base temp dir.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.kube.client import CREATED_BY_ANNOTATION
from cni_plugin.kube.kinds import PODS
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    ENDPOINT_SLICES,
    GROUP,
    VERSION,
    VRF_INSTANCES,
)
from e2e.harness import plugin as plugin_module
from e2e.harness.agentproc import AgentProcess
from e2e.harness.cluster import Cluster
from e2e.harness.faults import Fault, Rule
from e2e.harness.faults.matrix import (
    ATT,
    FOREIGN_NOTE,
    ROOMY_TIMEOUT_S,
    TIMEOUT_S,
    Case,
    Figures,
    Matrix,
    Write,
    annotations_of,
    cases,
    content,
    diff,
    fault_case,
    fault_matrix,
    ipam_state,
    rule_for,
    trace,
)
from e2e.harness.kernel import links_in, run_ip
from e2e.harness.kube import Kube
from e2e.harness.plugin import Answer, Plugin, base_conf
from e2e.harness.publishing import BGP_NS
from e2e.harness.report import report
from e2e.harness.wait import wait_until

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]


@pytest.fixture(scope="module")
def matrix(cluster: Cluster, kube: Kube, tmp_path_factory: pytest.TempPathFactory,
           pytestconfig: pytest.Config) -> Iterator[Matrix]:
    """The proxy, the admission policy, this node's router and the Pods' namespace; the
    module's figures reported at its end."""
    with fault_matrix(cluster, kube, tmp_path_factory.mktemp("fault-proxy")) as shared:
        try:
            yield shared
        finally:
            _report(shared.figures, tmp_path_factory.getbasetemp(), pytestconfig)


@pytest.fixture
def case(matrix: Matrix, plugin: Plugin, tmp_path: Path) -> Iterator[Case]:
    """One case: a fresh VPC, Pod and netns on this node, the plugin pointed at the proxy."""
    with fault_case(matrix, plugin, tmp_path) as subject:
        yield subject


# The matrix test ----------------------------------------------------------------------------

EXPECTED = {  # (verb kind, then) -> the faulted verb's answer: 0, or the CNI error code
    ("ADD", "success"): 0, ("ADD", "later-failure"): 104, ("ADD", "deadline"): 11,
    ("ADD rollback", "rollback"): 104, ("ADD rollback", "deadline"): 104,
    ("DEL", "success"): 0, ("DEL", "later-failure"): 104, ("DEL", "deadline"): 11,
}


@pytest.mark.parametrize(("write", "fault", "then"), list(cases()))
def test_fault_matrix(case: Case, write: Write, fault: str, then: str) -> None:
    proxy = case.matrix.proxied.proxy
    case.arrange(write.scenario)
    baseline = case.objects()
    result = None
    if write.verb == "DEL" or write.scenario == "repeat":
        result = case.ok("ADD")
    denied = []
    if then in ("later-failure", "rollback") or (then == "deadline" and
                                                  write.verb == "ADD rollback"):
        assert write.later is not None
        denied = [case.denial(write.later)]
    case.matrix.denials.deny(*denied)
    before = case.objects()
    rule = rule_for(fault, write)
    verb = "DEL" if write.verb == "DEL" else "ADD"
    try:
        with proxy.rules(rule):
            faulted = case.call(verb, result if verb == "DEL" else None,
                                VPC_ATTACH_TIMEOUT_SECONDS=str(
                                    TIMEOUT_S if then == "deadline" else ROOMY_TIMEOUT_S))
    finally:
        if denied:
            case.matrix.denials.deny()
    case.record.update(id=f"{write.id}-{fault}-{then}", write=write.title, verb=write.verb,
                       fault=fault, then=then, faults_injected=rule.fired,
                       answer=faulted.code or 0)
    case.matrix.figures.cases.append(case.record)
    assert rule.fired == 1, f"the fault was not injected: {rule}: {trace(case)}"
    assert (faulted.code or 0) == EXPECTED[(write.verb, then)], \
        f"{faulted.stdout} {trace(case)}"

    if write.verb == "DEL":
        if faulted.status == 0:
            case.check_gone("after the faulted DEL", baseline, instance_by_design=True)
        else:
            case.ok("DEL", result)  # the runtime retries a failed DEL
            case.check_gone("after the retried DEL", baseline, instance_by_design=True)
        case.assert_clean()
        return

    if faulted.status == 0:
        case.check_success(before)
        added = faulted.body
    else:
        case.check_failed_add(before, faulted)
        case.ok("DEL", result)  # a runtime's DEL after a failed ADD
        case.check_gone("after DEL of the failed ADD", baseline,
                        instance_by_design=write.scenario == "repeat")
        added = case.ok("ADD")  # the runtime's next try
    case.ok("CHECK", added)
    case.ok("DEL", added)
    case.check_gone("after the final DEL", baseline, instance_by_design=True)
    case.assert_clean()


# The API server gone mid-ADD -----------------------------------------------------------------

@pytest.mark.parametrize("where", ["first-read-after-the-kernel", "advertisement-create"])
def test_api_server_paused_mid_add_answers_11_in_time_and_leaves_nothing(
        case: Case, where: str) -> None:
    """kube-apiserver is SIGSTOPped as the ADD sends a request (after its kernel work): the
    first read of publishing, or the advertisement's create — the VPC's instance exists then
    (an earlier ADD made it), and the create, held by the paused server, lands after the
    answer. The answer is code 11 within the deadline; after the server resumes, DEL leaves
    nothing."""
    case.arrange("fresh")
    if where == "advertisement-create":
        target = [{"value": naming.route_target(65000, case.vpc)}]
        case.kube.create(VRF_INSTANCES.path(BGP_NS), {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
            "metadata": {"name": case.names["vrf"]},
            "spec": {"routerRef": {"name": case.matrix.router},
                     "vrfID": next(case.matrix.vrf_ids), "importRouteTargets": target,
                     "exportRouteTargets": target}})
    baseline = case.objects()
    cluster, proxy = case.matrix.cluster, case.matrix.proxied.proxy
    method, resource = ("GET", "bgpvrfinstances") if where == "first-read-after-the-kernel" \
        else ("POST", "bgpadvertisements")
    rule = Rule(Fault.FORWARD, method=method, resource=resource,
                hook=lambda: cluster.pause("kube-apiserver"))
    try:
        with proxy.rules(rule):
            answer = case.call("ADD")
    finally:
        if rule.fired:
            cluster.resume("kube-apiserver")
    case.record.update(id=f"api-server-paused-{where}", write=f"({where})", verb="ADD",
                       fault="kube-apiserver SIGSTOP", then="resume, DEL",
                       faults_injected=rule.fired, answer=answer.code or 0)
    case.matrix.figures.cases.append(case.record)
    assert rule.fired == 1
    assert answer.code == 11, answer.stdout
    # The request the paused server held is answered once it runs again.
    wait_until("the held request to finish", lambda: proxy.in_flight() == 0, timeout=40)
    if where == "advertisement-create":
        landed = case.objects()["adv"]
        assert landed is not None and annotations_of(landed)[CREATED_BY_ANNOTATION].startswith(
            f"{case.container_id}/"), "the held create landed after the answer"
    case.ok("DEL")
    case.check_gone("after resume and DEL", baseline, instance_by_design=False)
    case.assert_clean()  # the answer's time included


def test_etcd_killed_mid_del_answers_11_in_time_and_a_retried_del_finishes(case: Case) -> None:
    """etcd is SIGKILLed as DEL deletes the first EndpointSlice, and restarted after the
    answer (its data kept): the answer is code 11 within the deadline; the runtime's next DEL
    leaves nothing."""
    case.arrange("fresh")
    baseline = case.objects()
    added = case.ok("ADD")
    cluster = case.matrix.cluster
    rule = Rule(Fault.FORWARD, method="DELETE", resource="endpointslices",
                hook=lambda: cluster.kill("etcd"))
    try:
        with case.matrix.proxied.proxy.rules(rule):
            answer = case.call("DEL", added)
    finally:
        if rule.fired:
            cluster.restart("etcd")
    case.record.update(id="etcd-killed-mid-del", write="EndpointSlice delete", verb="DEL",
                       fault="etcd SIGKILL, restarted after the answer", then="retried DEL",
                       faults_injected=rule.fired, answer=answer.code or 0)
    case.matrix.figures.cases.append(case.record)
    assert rule.fired == 1
    assert answer.code == 11, answer.stdout
    wait_until("the API server to be ready again",
               lambda: case.kube.get_text("/readyz")[0] == 200, timeout=60)
    case.ok("DEL", added)
    case.check_gone("after the retried DEL", baseline, instance_by_design=True)
    case.assert_clean()


# A rollback that cannot reach the API server, and GC of the VPC's instance --------------------

def test_rollback_without_api_server_leaves_the_instance_and_gc_reclaims_it_once_unused(
        case: Case) -> None:
    """kube-apiserver is SIGSTOPped right after the ADD created the VPC's instance (as it asks
    for the advertisement) and stays stopped for the whole rollback: code 11 in time, the
    details name the instance the rollback could not remove, and it is left (DEL never deletes
    instances). While another container's advertisement uses it, GC keeps it byte for byte,
    and a GC whose delete finds it changed keeps it too; once unused, GC deletes it."""
    case.arrange("fresh")
    baseline = case.objects()
    cluster, proxy = case.matrix.cluster, case.matrix.proxied.proxy
    rule = Rule(Fault.FORWARD, method="GET", resource="bgpadvertisements",
                hook=lambda: cluster.pause("kube-apiserver"))
    try:
        with proxy.rules(rule):
            answer = case.call("ADD")
    finally:
        if rule.fired:
            cluster.resume("kube-apiserver")
    details = str((answer.body or {}).get("details", ""))
    case.record.update(id="api-server-paused-whole-rollback", write="(the rollback's reads)",
                       verb="ADD rollback", fault="kube-apiserver SIGSTOP",
                       then="resume, DEL, GC", faults_injected=rule.fired,
                       answer=answer.code or 0, rollback_incomplete="rollback incomplete" in
                       details)
    case.matrix.figures.cases.append(case.record)
    assert rule.fired == 1, trace(case)
    assert answer.code == 11, answer.stdout
    assert f"rollback incomplete: BGPVRFInstance {BGP_NS}/{case.names['vrf']}" in details, \
        answer.stdout
    wait_until("the held requests to finish", lambda: proxy.in_flight() == 0, timeout=40)
    left = case.objects()["vrf"]
    assert left is not None and annotations_of(left)[CREATED_BY_ANNOTATION].startswith(
        f"{case.container_id}/eth0/"), "the instance this ADD created is left"
    case.ok("DEL")  # the runtime's DEL after the failed ADD: it never deletes instances
    assert case.objects()["vrf"] == left

    # Another container of the VPC on this node, publish-only: its advertisement uses it.
    other = f"fm-{secrets.token_hex(8)}"
    other_conf = {**case.conf, "name": f"{case.conf['name']}-pub", "vpcattachment": "8",
                  "attachment": "existing", "publish": {"bgp": True, "endpointSlice": False}}
    other_conf.pop("ipam")
    other_adv = naming.advertisement_name(case.vpc, "8", case.matrix.node)
    case.cleanups.append(functools.partial(case.kube.delete,
                                           ADVERTISEMENTS.path(BGP_NS, other_adv)))
    prev = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": case.netns}],
            "ips": [{"address": "fd00:fb::5/64", "interface": 0}]}
    answer = case.call("ADD", prev, container_id=other, conf=other_conf)
    assert answer.status == 0, answer.stdout
    used = case.objects()["vrf"]
    assert used is not None and used["metadata"]["uid"] == left["metadata"]["uid"]
    adv = case.kube.get(ADVERTISEMENTS.path(BGP_NS, other_adv))
    assert adv is not None and adv["spec"]["vrfID"] == used["spec"]["vrfID"]
    _gc(case, case.conf)
    _gc(case, other_conf, other)  # the runtime lists its own live container as valid
    kept = case.objects()["vrf"]
    assert kept is not None and content(kept) == content(used) and \
        kept["metadata"]["resourceVersion"] == used["metadata"]["resourceVersion"], \
        "GC kept the instance an advertisement uses, byte for byte"

    case.ok("DEL", prev, container_id=other, conf=other_conf)
    assert case.kube.get(ADVERTISEMENTS.path(BGP_NS, other_adv)) is None
    # A writer changes the instance as GC deletes it: the delete's preconditions keep it.
    touch = Rule(Fault.FORWARD, method="DELETE", resource="bgpvrfinstances",
                 hook=lambda: _touch(case.kube, case.names["vrf"]))
    with proxy.rules(touch):
        _gc(case, case.conf)
    assert touch.fired == 1
    assert case.objects()["vrf"] is not None, "a concurrent change wins over GC"
    _gc(case, case.conf, other)  # valid: another container, not the one that created it
    case.check_gone("after GC of the unused instance", baseline, instance_by_design=False)
    case.assert_clean()


def test_gc_keeps_the_instance_of_a_valid_layer_2_tap(case: Case) -> None:
    """An L2-only tap publishes the VPC's instance and no advertisement: GC keeps the
    instance while the tap is a valid attachment, and while the tap is on this node even when
    another network of the VPC is collected with nothing valid; after the tap's DEL, GC
    deletes it."""
    tap_id = f"fm-tap-{secrets.token_hex(6)}"
    tap_conf = base_conf(case.vpc, "9", attachment="tap",
                         publish={"bgp": True, "endpointSlice": False},
                         name=f"{case.conf['name']}-tap")
    tap = naming.host_link_name(case.vpc, "9")
    case.arrange("fresh")
    baseline = case.objects()
    result = case.call("ADD", container_id=tap_id, conf=tap_conf)
    assert result.status == 0 and result.body["ips"] == [], result.stdout
    created = case.objects()["vrf"]
    assert created is not None and annotations_of(created)[CREATED_BY_ANNOTATION].startswith(
        f"{tap_id}/eth0/")
    assert case.kube.get(ADVERTISEMENTS.path(BGP_NS, naming.advertisement_name(
        case.vpc, "9", case.matrix.node))) is None, "nothing to advertise"
    _gc(case, tap_conf, tap_id)
    _gc(case, case.conf)  # another network of the VPC; the tap is on this node
    kept = case.objects()["vrf"]
    assert kept is not None and content(kept) == content(created) and \
        kept["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert tap in links_in()

    case.ok("DEL", result.body, container_id=tap_id, conf=tap_conf)
    wait_until("the tap to be deleted", lambda: tap not in links_in(), timeout=10)
    _gc(case, tap_conf)
    case.check_gone("after the tap's DEL and GC", baseline, instance_by_design=False)
    case.assert_clean()


def _gc(case: Case, conf: dict[str, Any], *valid: str) -> None:
    """GC of conf's network with these containers' eth0 valid; it must succeed in time."""
    attachments = [{"containerID": container, "ifname": "eth0"} for container in valid]
    began = time.monotonic()
    answer = case.plugin.call("GC", {**conf, "cni.dev/valid-attachments": attachments})
    case.timed("GC", time.monotonic() - began)
    assert answer.status == 0, answer.stdout


def _touch(kube: Kube, name: str) -> None:
    """Change an instance as another writer would (an annotation of its own)."""
    current = kube.get(VRF_INSTANCES.path(BGP_NS, name))
    assert current is not None
    current["metadata"].setdefault("annotations", {}).update(FOREIGN_NOTE)
    kube.put(VRF_INSTANCES.path(BGP_NS, name), current)


# A node reboot -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Member:
    """One container of the rebooted node: its attachment, Pod and netns."""

    att: str
    container: str
    pod: str
    uid: str
    netns: str


def test_node_reboot_del_and_gc_release_every_ip_annotation_and_slice(
        case: Case, tmp_path: Path) -> None:
    """Three containers of one VPC on this node, each with an attachment of its own (one node
    holds one container per attachment); a container on another node shares the first one's
    advertisement. The node dies — when an agent serves it, mid-ADD of the third: the agent is
    killed (SIGKILL) as that ADD creates its EndpointSlice — and comes back with every netns and
    link gone. DEL of each (netns gone; the third without prevResult) and GC of each network
    with no valid attachment release every IP reservation, annotation and slice; the shared
    advertisement and the VPC's instance are as they were."""
    case.arrange("shared")
    baseline = case.objects()
    agent = None
    if plugin_module.VIA_AGENT:  # an agent of its own, to kill
        (tmp_path / "agent").mkdir()
        agent = AgentProcess(tmp_path / "agent").start()
        case.plugin.environ["VPC_ATTACH_AGENT_SOCKET"] = str(agent.socket)
    members = [Member(ATT, case.container_id, case.pod, case.uid, case.netns)]
    for att in ("8", "9"):
        pod = f"fm-{secrets.token_hex(4)}"
        members.append(Member(att, f"fm-{secrets.token_hex(8)}", pod, _pod(case, pod), _netns()))
        case.cleanups += [
            functools.partial(case.kube.delete, PODS.path(case.matrix.namespace, pod)),
            functools.partial(case.kube.delete, ADVERTISEMENTS.path(
                BGP_NS, naming.advertisement_name(case.vpc, att, case.matrix.node)))]
        case.cleanups += [functools.partial(case.kube.delete, ENDPOINT_SLICES.path(
            case.matrix.namespace, slice_name(pod, case.vpc, att, family)))
            for family in ("IPv6", "IPv4")]
    results: dict[str, Any] = {}
    kill = Rule(Fault.FORWARD, method="POST", resource="endpointslices",
                hook=agent.kill if agent is not None else None)
    try:
        for member in members:
            dies = agent is not None and member is members[-1]
            with case.matrix.proxied.proxy.rules(*([kill] if dies else [])):
                answer = _call_as(case, "ADD", member)
            if dies:
                assert kill.fired == 1 and answer.code == 11, answer.stdout
            else:
                assert answer.status == 0, answer.stdout
                results[member.container] = answer.body
        # The reboot: every netns gone (each veth pair with it), and no agent survived.
        for member in members:
            run_ip("netns", "del", Path(member.netns).name, check=False)
        for link in _links_of(case, members):
            run_ip("link", "del", link, check=False)
        if agent is not None:
            agent.kill()
            agent.start()  # the DaemonSet restarts it
        for member in members:
            answer = _call_as(case, "DEL", member, results.get(member.container))
            assert answer.status == 0, answer.stdout
        for member in members:
            began = time.monotonic()
            answer = case.plugin.call("GC", {**_member_conf(case, member.att),
                                             "cni.dev/valid-attachments": []})
            case.timed("GC", time.monotonic() - began)
            assert answer.status == 0, answer.stdout
    finally:
        case.record.update(id="node-reboot", write="(3 ADDs, 3 DELs, 3 GCs)", verb="DEL, GC",
                           fault="netns and links gone" + (", agent SIGKILLed mid-ADD"
                                                           if agent is not None else ""),
                           then="DEL, GC", faults_injected=1 + kill.fired, answer=0)
        case.matrix.figures.cases.append(case.record)
        if agent is not None:
            agent.stop()
        for member in members[1:]:
            run_ip("netns", "del", Path(member.netns).name, check=False)

    where = "after the reboot's DEL and GC"
    for member in members:
        for family in ("IPv6", "IPv4"):
            name = slice_name(member.pod, case.vpc, member.att, family)
            if case.kube.get(ENDPOINT_SLICES.path(case.matrix.namespace, name)) is not None:
                case.leaked(where, [f"EndpointSlice {name}"])
        adv_name = naming.advertisement_name(case.vpc, member.att, case.matrix.node)
        if member.att != ATT and case.kube.get(ADVERTISEMENTS.path(BGP_NS, adv_name)) is not None:
            case.leaked(where, [f"BGPAdvertisement of attachment {member.att}"])
    old_vrf, vrf = baseline["vrf"], case.objects()["vrf"]
    assert old_vrf is not None
    if vrf is None or content(vrf) != content(old_vrf):
        case.changed(where, f"vrf {diff(old_vrf, vrf) if vrf else 'deleted'}")
    case.check_gone(where, baseline, instance_by_design=True)  # the shared advertisement too
    case.leaked(where, ipam_state(case.ipam_dir) +
                [f"link {link}" for link in _links_of(case, members)])
    case.assert_clean()


def _member_conf(case: Case, att: str) -> dict[str, Any]:
    """The case's stanza for another attachment: its own pools and IPAM state (its own network)."""
    if att == ATT:
        return case.conf
    ipam = {**case.conf["ipam"], "dataDir": str(case.ipam_dir / att),
            "ipv6_subnet": f"fd00:fa:{int(att)}::/48", "ipv4_subnet": f"10.250.{int(att)}.0/24"}
    return {**case.conf, "name": f"{case.conf['name']}-{att}", "vpcattachment": att,
            "ipam": ipam}


def _pod(case: Case, name: str) -> str:
    return str(case.kube.create(PODS.path(case.matrix.namespace), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": case.matrix.node, "automountServiceAccountToken": False,
                 "containers": [{"name": "main", "image": "registry.invalid/pause:1"}]}},
    )["metadata"]["uid"])


def _netns() -> str:
    name = f"vpa-fm-{secrets.token_hex(4)}"
    run_ip("netns", "add", name)
    return f"/var/run/netns/{name}"


def _links_of(case: Case, members: list[Member]) -> list[str]:
    """Host links of the case's VPC, and links any of its containers own (retired ones too)."""
    prefix = "G" + naming.pad_base62(case.vpc, naming.VPC_WIDTH)
    found = []
    for line in run_ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(prefix) or any(f"/{m.container}/" in line for m in members):
            found.append(name)
    return found


def _call_as(case: Case, verb: str, member: Member,
             prev: dict[str, Any] | None = None) -> Answer:
    conf = _member_conf(case, member.att)
    if prev is not None:
        conf = {**conf, "prevResult": prev}
    args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={case.matrix.namespace};K8S_POD_NAME={member.pod};"
            f"K8S_POD_INFRA_CONTAINER_ID={member.container};K8S_POD_UID={member.uid}")
    began = time.monotonic()
    answer = case.plugin.call(verb, conf, container_id=member.container, netns=member.netns,
                              CNI_ARGS=args)
    case.timed(f"{verb} {member.container}", time.monotonic() - began)
    return answer


def _report(figures: Figures, base: Path, config: pytest.Config) -> None:
    summary = figures.summary()
    headline = {k: v for k, v in summary.items() if k not in ("cases", "overruns")}
    report(config, "fault matrix figures", base / f"fault-matrix-{summary['path']}.json",
           summary, headline)
