"""The fault matrix of issue 10 (SPEC §7, §9): every write ADD and DEL make, each API fault,
then success or a later failure — through a fault proxy in front of the real API server; and
the API server paused mid-ADD or for a whole rollback (what it left, GC removes once unused),
GC keeping an L2-only tap's instance, and a node reboot.

After each case: objects that did not exist before a failed ADD are gone; shared objects keep
their spec and other annotations byte for byte; a retried ADD converges, CHECK passes and DEL
leaves nothing (no link, IPAM reservation, annotation or slice); every answer came within the
deadline plus MARGIN_S. What the cases did is counted (`Figures`) and reported at the end of
the module: printed, and written to `fault-matrix-<path>.json` in pytest's base temp dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.kube.client import CREATED_BY_ANNOTATION
from cni_plugin.kube.kinds import PODS
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    CONTAINER_KEYS,
    ENDPOINT_SLICES,
    GROUP,
    ROUTERS,
    VERSION,
    VRF_INSTANCES,
)
from e2e.harness import plugin as plugin_module
from e2e.harness.agentproc import AgentProcess
from e2e.harness.cluster import Cluster
from e2e.harness.faults import Denials, Fault, ProxiedCluster, Rule, start_proxy
from e2e.harness.kernel import links_in, remove_vpc_objects, run_ip, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import Answer, Plugin, base_conf
from e2e.harness.publishing import BGP_NS, create_router
from e2e.harness.report import report
from e2e.harness.tenancy import create_binding, delete_binding
from e2e.harness.wait import wait_until
from tests.ipam_files import IpamFiles

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]

TIMEOUT_S = 6.0  # the node's timeoutSeconds: short, so that deadline cases are fast
# An answer may come this much after the deadline: the deadline starts once the plugin has
# parsed its input, after the interpreter started (~0.3 s in-process, ~0.02 s for the agent's
# thin client, more on a loaded 2-core machine), and the process must still print and exit.
MARGIN_S = 1.5
DELAY_S = TIMEOUT_S + 2  # "beyond the deadline": the answer is held longer than the verb may run
ATT = "7"
NPTV6 = {"publicPrefix": "2001:db8:fa::/48", "ulaPrefix": "fd00:fa::/48"}
FOREIGN_NOTE = {"example.com/owner": "another-component"}
REMOTE_NODE = "worker-elsewhere"
REMOTE_CID = "remote0fault0matrix"
REMOTE_ANNOTATIONS = {
    f"galactic.datum.net/netns.{REMOTE_CID}": "/var/run/netns/remote",
    f"galactic.datum.net/allocated-subnet-ipv6.{REMOTE_CID}": "fd00:99::/96",
    f"galactic.datum.net/node.{REMOTE_CID}": REMOTE_NODE,
}


# The matrix ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Write:
    """One write of ADD, of its rollback, or of DEL, and how a case provokes it."""

    id: str
    title: str
    verb: str  # "ADD", "ADD rollback", "DEL"
    method: str
    resource: str
    nth: int  # the ordinal of this write among the verb's requests of that method/resource
    scenario: str  # fresh | shared | instance | repeat (see `Case.arrange`)
    later: tuple[str, str, str] | None  # the denied later write (op, resource, name pattern)


# Name patterns: {v6}/{v4} the Pod's slices, {adv} the advertisement.
DENY_V6_CREATE = ("CREATE", "endpointslices", "{v6}")
DENY_V4_CREATE = ("CREATE", "endpointslices", "{v4}")
WRITES = (
    Write("vrf-create", "BGPVRFInstance create", "ADD", "POST", "bgpvrfinstances", 1, "fresh",
          DENY_V6_CREATE),
    Write("vrf-update", "BGPVRFInstance update", "ADD", "PUT", "bgpvrfinstances", 1, "instance",
          DENY_V6_CREATE),
    Write("adv-create", "BGPAdvertisement create", "ADD", "POST", "bgpadvertisements", 1,
          "fresh", DENY_V6_CREATE),
    Write("adv-update", "BGPAdvertisement update", "ADD", "PUT", "bgpadvertisements", 1,
          "shared", DENY_V6_CREATE),
    Write("eps-create", "EndpointSlice create", "ADD", "POST", "endpointslices", 1, "fresh",
          DENY_V4_CREATE),
    Write("eps-update", "EndpointSlice update", "ADD", "PUT", "endpointslices", 1, "repeat",
          ("UPDATE", "endpointslices", "{v4}")),
    # The rollback runs because the IPv4 slice's create is denied (`later` is that denial).
    Write("rb-eps-delete", "EndpointSlice delete", "ADD rollback", "DELETE", "endpointslices",
          1, "fresh", DENY_V4_CREATE),
    Write("rb-adv-delete", "BGPAdvertisement delete", "ADD rollback", "DELETE",
          "bgpadvertisements", 1, "fresh", DENY_V4_CREATE),
    Write("rb-adv-update", "BGPAdvertisement update (withdraw)", "ADD rollback", "PUT",
          "bgpadvertisements", 2, "shared", DENY_V4_CREATE),
    Write("rb-vrf-delete", "BGPVRFInstance delete", "ADD rollback", "DELETE", "bgpvrfinstances",
          1, "fresh", DENY_V4_CREATE),
    Write("del-eps-delete", "EndpointSlice delete", "DEL", "DELETE", "endpointslices", 1,
          "fresh", ("DELETE", "bgpadvertisements", "{adv}")),
    Write("del-adv-update", "BGPAdvertisement update (withdraw)", "DEL", "PUT",
          "bgpadvertisements", 1, "shared", None),
    Write("del-adv-delete", "BGPAdvertisement delete", "DEL", "DELETE", "bgpadvertisements", 1,
          "fresh", None),
)
FAULTS = ("forward-then-drop", "reset-before-forward", "503-retry-after", "close-mid-body",
          "delay-beyond-deadline")
DEADLINE_FAULT = "delay-beyond-deadline"


def _rule(fault: str, write: Write) -> Rule:
    """The proxy rule injecting `fault` into `write`."""
    kinds = {"forward-then-drop": Fault.DROP_AFTER_FORWARD,
             "reset-before-forward": Fault.RESET_BEFORE_FORWARD,
             "503-retry-after": Fault.RESPOND, "close-mid-body": Fault.CLOSE_MID_BODY,
             DEADLINE_FAULT: Fault.DELAY_ANSWER}
    return Rule(kinds[fault], method=write.method, resource=write.resource, nth=write.nth,
                status=503, retry_after=1.0, delay=DELAY_S)


def _cases() -> Iterator[Any]:
    for write in WRITES:
        for fault in FAULTS:
            thens = ["success"]
            if fault == DEADLINE_FAULT:
                thens = ["deadline"]  # the fault itself ends the verb
            elif write.verb == "ADD rollback":
                thens = ["rollback"]  # the later failure is what runs the rollback
            elif write.later is not None:
                thens = ["success", "later-failure"]
            for then in thens:
                yield pytest.param(write, fault, then, id=f"{write.id}-{fault}-{then}")


# Figures ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Figures:
    """What the module's cases did, counted as they ran."""

    cases: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    plugin_calls: int = 0
    answer_seconds: list[float] = dataclasses.field(default_factory=list)
    deadline_overruns: list[str] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.monotonic)

    def timed(self, what: str, seconds: float) -> None:
        """One plugin call and how long its answer took."""
        self.plugin_calls += 1
        self.answer_seconds.append(seconds)
        if seconds > TIMEOUT_S + MARGIN_S:
            self.deadline_overruns.append(f"{what}: {seconds:.2f} s")

    def summary(self) -> dict[str, Any]:
        """The figures quoted in the issue's closing note."""
        slowest = max(self.answer_seconds, default=0.0)
        return {
            "path": "agent" if plugin_module.VIA_AGENT else "in-process",
            "cases_run": len(self.cases),
            "faults_injected": sum(c["faults_injected"] for c in self.cases),
            "objects_leaked": sum(len(c["leaked"]) for c in self.cases),
            "shared_objects_changed": sum(len(c["changed"]) for c in self.cases),
            "deadline_overruns": len(self.deadline_overruns),
            "max_overrun_s": round(max(0.0, slowest - TIMEOUT_S), 3),
            "slowest_answer_s": round(slowest, 3),
            "deadline_s": TIMEOUT_S,
            "margin_s": MARGIN_S,
            "plugin_calls": self.plugin_calls,
            "rollbacks_reported_incomplete": sum(c["rollback_incomplete"] for c in self.cases),
            "duration_s": round(time.monotonic() - self.started, 1),
            "overruns": self.deadline_overruns,
            "cases": self.cases,
        }


# Fixtures -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Matrix:
    """What the module's cases share: one cluster, its proxy, one node, one Pod namespace."""

    cluster: Cluster
    kube: Kube
    proxied: ProxiedCluster
    denials: Denials
    node: str
    router: str
    namespace: str
    figures: Figures
    vrf_ids: Iterator[int]


@pytest.fixture(scope="module")
def matrix(cluster: Cluster, kube: Kube, tmp_path_factory: pytest.TempPathFactory,
           pytestconfig: pytest.Config) -> Iterator[Matrix]:
    """The proxy, the admission policy, this node's router and the Pods' namespace."""
    namespace = f"fault-matrix-{secrets.token_hex(3)}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": namespace}})
    wait_until("the namespace's default ServiceAccount",
               lambda: kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
               is not None)
    node = f"worker-{secrets.token_hex(3)}"
    router = create_router(kube, node)
    proxied = start_proxy(cluster, tmp_path_factory.mktemp("fault-proxy"))
    denials = Denials(kube, "fault-matrix", namespace)
    figures = Figures()
    try:
        denials.install()
        yield Matrix(cluster, kube, proxied, denials, node, router, namespace, figures,
                     itertools.count(3000))
    finally:
        proxied.stop()
        denials.remove()
        kube.delete(ROUTERS.path(BGP_NS, router))
        kube.delete(f"/api/v1/namespaces/{namespace}")
        _report(figures, tmp_path_factory.getbasetemp(), pytestconfig)


def _report(figures: Figures, base: Path, config: pytest.Config) -> None:
    summary = figures.summary()
    headline = {k: v for k, v in summary.items() if k not in ("cases", "overruns")}
    report(config, "fault matrix figures", base / f"fault-matrix-{summary['path']}.json",
           summary, headline)


@pytest.fixture
def case(matrix: Matrix, plugin: Plugin, tmp_path: Path) -> Iterator[Case]:
    """One case: a fresh VPC, Pod and netns on this node, the plugin pointed at the proxy."""
    plugin.environ.update({"VPC_ATTACH_NODE_NAME": matrix.node,
                           "VPC_ATTACH_KUBECONFIG": str(matrix.proxied.kubeconfig),
                           "VPC_ATTACH_TIMEOUT_SECONDS": str(TIMEOUT_S)})
    with temporary_netns("vpa-fm") as netns:
        subject = Case(matrix, plugin, tmp_path, netns)
        try:
            yield subject
        finally:
            matrix.proxied.proxy.clear()
            subject.clean_up()


# One case -----------------------------------------------------------------------------------

class Case:
    """A container of a fresh VPC on this node: its calls, and what exists of it."""

    def __init__(self, matrix: Matrix, plugin: Plugin, tmp_path: Path, netns: str) -> None:
        self.matrix = matrix
        self.kube = matrix.kube
        self.plugin = plugin
        self.netns = netns
        self.vpc = plugin_module.random_vpc()
        self.pod = f"fm-{secrets.token_hex(4)}"
        self.container_id = f"fm-{secrets.token_hex(8)}"
        self.ipam_dir = tmp_path / "ipam"
        self.uid = ""
        # vpc-attach-ipam: a repeated ADD gets the same allocation (host-local refuses it)
        ipam = {"type": "vpc-attach-ipam", "dataDir": str(self.ipam_dir),
                "ipv6_subnet": "fd00:fa::/48", "ipv4_subnet": "10.250.0.0/24"}
        self.conf = base_conf(self.vpc, ATT, ipam=ipam,
                              publish={"bgp": True, "endpointSlice": True,
                                       "endpointSliceFamilies": ["IPv6", "IPv4"]})
        self.names = {"v6": slice_name(self.pod, self.vpc, ATT, "IPv6"),
                      "v4": slice_name(self.pod, self.vpc, ATT, "IPv4"),
                      "adv": naming.advertisement_name(self.vpc, ATT, matrix.node),
                      "vrf": naming.vrf_instance_name(self.vpc, matrix.node)}
        self.record: dict[str, Any] = {"faults_injected": 0, "leaked": [], "changed": [],
                                       "late": [], "rollback_incomplete": False}
        self.cleanups: list[Callable[[], object]] = []  # for what a test adds to the case
        binding = create_binding(self.kube, self.vpc)  # tenancy is not what these cases test
        self.cleanups.append(lambda: delete_binding(self.kube, binding))

    # Arranging --------------------------------------------------------------------------

    def arrange(self, scenario: str) -> None:
        """The Pod, and what exists before its ADD: nothing (fresh; repeat, whose first ADD is
        the caller's), the VPC's instance made by another component without our route target
        (instance), or that instance with ours and the attachment's advertisement already
        used by a container on another node (shared)."""
        self.uid = str(self.kube.create(PODS.path(self.matrix.namespace), {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": self.pod},
            "spec": {"nodeName": self.matrix.node, "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "registry.invalid/pause:1"}]}},
        )["metadata"]["uid"])
        rt = naming.route_target(65000, self.vpc)
        if scenario in ("instance", "shared"):
            targets = [{"value": "65000:4242"}] + ([{"value": rt}] if scenario == "shared" else [])
            self.kube.create(VRF_INSTANCES.path(BGP_NS), {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
                "metadata": {"name": self.names["vrf"], "annotations": FOREIGN_NOTE},
                "spec": {"routerRef": {"name": self.matrix.router},
                         "vrfID": next(self.matrix.vrf_ids), "nptv6": NPTV6,
                         "importRouteTargets": targets, "exportRouteTargets": list(targets)}})
        if scenario == "shared":
            self.kube.create(ADVERTISEMENTS.path(BGP_NS), {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPAdvertisement",
                "metadata": {"name": self.names["adv"],
                             "annotations": {**REMOTE_ANNOTATIONS, **FOREIGN_NOTE}},
                "spec": {"routerRef": {"name": f"router-{REMOTE_NODE}"},
                         "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
                         "prefixes": ["fd00:99::/96"], "communities": [rt], "vrfID": 4000,
                         "function": "End.DT46", "localPreference": 150}})

    def denial(self, pattern: tuple[str, str, str]) -> tuple[str, str, str]:
        """A (op, resource, name pattern) made concrete for this case."""
        op, resource, name = pattern
        return op, resource, name.format(**self.names)

    # Calling the plugin -----------------------------------------------------------------

    def cni_args(self) -> str:
        """CNI_ARGS as containerd sends them."""
        return (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.matrix.namespace};"
                f"K8S_POD_NAME={self.pod};K8S_POD_INFRA_CONTAINER_ID={self.container_id};"
                f"K8S_POD_UID={self.uid}")

    def call(self, verb: str, prev: dict[str, Any] | None = None, *,
             conf: dict[str, Any] | None = None, **kw: Any) -> Answer:
        """One timed call (counted in the figures); the case's container and network unless
        given others."""
        conf = conf or self.conf
        if prev is not None:
            conf = {**conf, "prevResult": prev}
        kw.setdefault("container_id", self.container_id)
        began = time.monotonic()
        answer = self.plugin.call(verb, conf, netns=self.netns, CNI_ARGS=self.cni_args(), **kw)
        self.timed(f"{verb} {kw['container_id']}", time.monotonic() - began)
        return answer

    def timed(self, what: str, seconds: float) -> None:
        """Count a call; remember it if it answered after the deadline plus MARGIN_S."""
        self.matrix.figures.timed(what, seconds)
        if seconds > TIMEOUT_S + MARGIN_S:
            self.record["late"].append(f"{what}: {seconds:.2f} s")

    def ok(self, verb: str, prev: dict[str, Any] | None = None, **kw: Any) -> Any:
        """A call that must succeed; its answer."""
        answer = self.call(verb, prev, **kw)
        assert answer.status == 0, f"{verb} failed: {answer.stdout} {answer.stderr[-2000:]}"
        return answer.body

    # What exists ------------------------------------------------------------------------

    def objects(self) -> dict[str, dict[str, Any] | None]:
        """The case's API objects as the API server has them (read directly, not proxied)."""
        return {
            "vrf": self.kube.get(VRF_INSTANCES.path(BGP_NS, self.names["vrf"])),
            "adv": self.kube.get(ADVERTISEMENTS.path(BGP_NS, self.names["adv"])),
            "v6": self.kube.get(ENDPOINT_SLICES.path(self.matrix.namespace, self.names["v6"])),
            "v4": self.kube.get(ENDPOINT_SLICES.path(self.matrix.namespace, self.names["v4"])),
        }

    def kernel_and_ipam(self) -> list[str]:
        """This container's links and IPAM reservations, as `ip` and vpc-attach-ipam's records
        show."""
        found = _ipam_state(self.ipam_dir)
        host = naming.host_link_name(self.vpc, ATT)
        found += [f"link {name}" for name in links_in() if name == host]
        found += [f"link {line.split(':')[1].strip()}" for line in
                  run_ip("-o", "link", "show").splitlines() if f"/{self.container_id}/" in line]
        if Path(self.netns).exists():  # gone after a node reboot
            found += [f"pod link {name}" for name in links_in(self.netns) - {"lo"}]
        return found

    def settled(self) -> list[str]:
        """kernel_and_ipam once a node agent's reaper has deleted the links a DEL retired."""
        if plugin_module.VIA_AGENT:
            with contextlib.suppress(TimeoutError):  # what is still there is reported below
                wait_until("retired links to be deleted",
                           lambda: not any("link" in x for x in self.kernel_and_ipam()), 10)
        return self.kernel_and_ipam()

    # Checking ---------------------------------------------------------------------------

    def leaked(self, where: str, found: list[str]) -> None:
        """Record what was left and should not have been."""
        self.record["leaked"] += [f"{where}: {item}" for item in found]

    def changed(self, where: str, what: str) -> None:
        """Record a shared object that changed and should not have."""
        self.record["changed"].append(f"{where}: {what}")

    def check_failed_add(self, before: dict[str, dict[str, Any] | None],
                         answer: Answer) -> None:
        """A failed ADD left nothing it created and changed nothing it found (unless its
        rollback said it could not finish: then DEL must remove the rest, see check_gone)."""
        details = str((answer.body or {}).get("details", ""))
        if "rollback incomplete" in details:
            self.record["rollback_incomplete"] = True
            return
        now = self.objects()
        for key, obj in now.items():
            old = before[key]
            if obj is not None and old is None:
                self.leaked("after the failed ADD", [f"{key} {obj['metadata']['name']}"])
            elif obj is None and old is not None:
                self.changed("after the failed ADD", f"{key} deleted")
            elif obj is not None and old is not None and _content(obj) != _content(old):
                self.changed("after the failed ADD", f"{key} {_diff(old, obj)}")
        if before["v6"] is None:  # not a repeated ADD: no kernel or IPAM state either
            self.leaked("after the failed ADD", self.kernel_and_ipam())

    def check_success(self, before: dict[str, dict[str, Any] | None]) -> None:
        """After a successful ADD, what was shared keeps everything that was not ours."""
        now = self.objects()
        cid = naming.annotation_cid(self.container_id)
        for key in ("vrf", "adv"):
            old, new = before[key], now[key]
            if old is None or new is None:
                continue
            if _not_ours(_annotations(new), cid) != _not_ours(_annotations(old), cid):
                self.changed("after the ADD", f"{key} annotations {_diff(old, new)}")
            if key == "vrf" and not _extends(old["spec"], new["spec"]):
                self.changed("after the ADD", f"vrf spec {_diff(old, new)}")

    def check_gone(self, where: str, baseline: dict[str, dict[str, Any] | None],
                   instance_by_design: bool) -> None:
        """After a DEL: nothing of this container is left anywhere; a shared advertisement has
        exactly its other containers' annotations and prefixes again. The VPC's instance on this
        node stays after an ADD succeeded (SPEC §6: DEL never deletes it)."""
        now = self.objects()
        for key in ("v6", "v4"):
            if now[key] is not None:
                self.leaked(where, [f"EndpointSlice {self.names[key]}"])
        adv, old_adv = now["adv"], baseline["adv"]
        if old_adv is None and adv is not None:
            self.leaked(where, [f"BGPAdvertisement {self.names['adv']}"])
        elif old_adv is not None and adv is None:
            self.changed(where, "the shared advertisement was deleted")
        elif old_adv is not None and adv is not None:
            if _annotations(adv) != _annotations(old_adv):
                self.changed(where, f"advertisement annotations {_diff(old_adv, adv)}")
            if adv["spec"].get("prefixes") != old_adv["spec"].get("prefixes"):
                self.changed(where, f"advertisement prefixes {adv['spec'].get('prefixes')}")
        if baseline["vrf"] is None and now["vrf"] is not None and not instance_by_design:
            self.leaked(where, [f"BGPVRFInstance {self.names['vrf']} (nothing deletes it)"])
        self.leaked(where, self.settled())

    def assert_clean(self) -> None:
        """Fail the case if anything was recorded as left or changed."""
        assert not self.record["leaked"], f"left behind: {self.record['leaked']}"
        assert not self.record["changed"], f"shared objects changed: {self.record['changed']}"
        assert not self.record["late"], f"answered after the deadline: {self.record['late']}"

    def clean_up(self) -> None:
        """Remove what the test made (and anything a failed case left)."""
        for cleanup in self.cleanups:
            cleanup()
        for key, resource, namespace in (("v6", ENDPOINT_SLICES, self.matrix.namespace),
                                         ("v4", ENDPOINT_SLICES, self.matrix.namespace),
                                         ("adv", ADVERTISEMENTS, BGP_NS),
                                         ("vrf", VRF_INSTANCES, BGP_NS)):
            self.kube.delete(resource.path(namespace, self.names[key]))
        self.kube.delete(PODS.path(self.matrix.namespace, self.pod), grace_period_seconds=0)
        owned = [line.split(":")[1].strip().split("@")[0] for line in
                 run_ip("-o", "link", "show").splitlines() if f"/{self.container_id}/" in line]
        for link in owned:
            run_ip("link", "del", link, check=False)
        remove_vpc_objects([self.vpc])


def _ipam_state(data_dir: Path) -> list[str]:
    """vpc-attach-ipam's records and index entries under data_dir, read from outside."""
    files = IpamFiles.read(data_dir)
    return [f"IPAM record {key}" for key in files.records] + \
        [f"IPAM index entry {key}" for key in files.index]


def _trace(case: Case) -> str:
    """The proxy's last requests, for a failure message."""
    return "; ".join(f"{s.method} {s.resource}/{s.name or ''} -> {s.status}"
                     f"{' (' + s.fault.value + ')' if s.fault else ''}"
                     for s in case.matrix.proxied.proxy.seen()[-25:])


def _extends(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether an instance's spec is the old one with route targets only appended."""
    for key in set(old) | set(new):
        if key.endswith("RouteTargets"):
            if new.get(key, [])[:len(old.get(key, []))] != old.get(key, []):
                return False
        elif old.get(key) != new.get(key):
            return False
    return True


def _not_ours(annotations: dict[str, str], cid: str) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if not any(k == p + cid for p in CONTAINER_KEYS)}


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def _content(obj: dict[str, Any]) -> str:
    """What "byte for byte" compares: spec (or a slice's endpoints), labels and annotations."""
    meta = obj["metadata"]
    body = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    return json.dumps({"body": body, "labels": meta.get("labels"),
                       "annotations": meta.get("annotations")}, sort_keys=True)


def _diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    a, b = json.loads(_content(old)), json.loads(_content(new))
    changes = []
    for part in ("body", "labels", "annotations"):
        x, y = a[part] or {}, b[part] or {}
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                changes.append(f"{part}.{key}: {x.get(key)!r} -> {y.get(key)!r}")
    return "; ".join(changes)[:600]


# The matrix test ----------------------------------------------------------------------------

EXPECTED = {  # (verb kind, then) -> the faulted verb's answer: 0, or the CNI error code
    ("ADD", "success"): 0, ("ADD", "later-failure"): 104, ("ADD", "deadline"): 11,
    ("ADD rollback", "rollback"): 104, ("ADD rollback", "deadline"): 104,
    ("DEL", "success"): 0, ("DEL", "later-failure"): 104, ("DEL", "deadline"): 11,
}


@pytest.mark.parametrize(("write", "fault", "then"), list(_cases()))
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
    rule = _rule(fault, write)
    verb = "DEL" if write.verb == "DEL" else "ADD"
    try:
        with proxy.rules(rule):
            faulted = case.call(verb, result if verb == "DEL" else None)
    finally:
        if denied:
            case.matrix.denials.deny()
    case.record.update(id=f"{write.id}-{fault}-{then}", write=write.title, verb=write.verb,
                       fault=fault, then=then, faults_injected=rule.fired,
                       answer=faulted.code or 0)
    case.matrix.figures.cases.append(case.record)
    assert rule.fired == 1, f"the fault was not injected: {rule}: {_trace(case)}"
    assert (faulted.code or 0) == EXPECTED[(write.verb, then)], \
        f"{faulted.stdout} {_trace(case)}"

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
        assert landed is not None and _annotations(landed)[CREATED_BY_ANNOTATION].startswith(
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
    assert rule.fired == 1, _trace(case)
    assert answer.code == 11, answer.stdout
    assert f"rollback incomplete: BGPVRFInstance {BGP_NS}/{case.names['vrf']}" in details, \
        answer.stdout
    wait_until("the held requests to finish", lambda: proxy.in_flight() == 0, timeout=40)
    left = case.objects()["vrf"]
    assert left is not None and _annotations(left)[CREATED_BY_ANNOTATION].startswith(
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
    assert kept is not None and _content(kept) == _content(used) and \
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
    assert created is not None and _annotations(created)[CREATED_BY_ANNOTATION].startswith(
        f"{tap_id}/eth0/")
    assert case.kube.get(ADVERTISEMENTS.path(BGP_NS, naming.advertisement_name(
        case.vpc, "9", case.matrix.node))) is None, "nothing to advertise"
    _gc(case, tap_conf, tap_id)
    _gc(case, case.conf)  # another network of the VPC; the tap is on this node
    kept = case.objects()["vrf"]
    assert kept is not None and _content(kept) == _content(created) and \
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
    if vrf is None or _content(vrf) != _content(old_vrf):
        case.changed(where, f"vrf {_diff(old_vrf, vrf) if vrf else 'deleted'}")
    case.check_gone(where, baseline, instance_by_design=True)  # the shared advertisement too
    case.leaked(where, _ipam_state(case.ipam_dir) +
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
