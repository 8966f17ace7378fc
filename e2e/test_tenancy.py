"""Tenant boundaries on the real control plane (SPEC §14): an ADD proceeds only when a
VPCBinding admits the Pod's namespace to the VPC attachment, denied ADDs change nothing
anywhere and leave a `VPCAttachDenied` Event, running attachments outlive their binding, the
audit and off modes, Pods choosing their attachment by annotation (one network config for
every tenant), and what the check costs in API requests, in-process and through the agent."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.kube.kinds import BINDINGS, PODS
from cni_plugin.publish.endpointslice import slice_name
from cni_plugin.tenancy.choice import ANNOTATION
from e2e.harness import plugin as plugin_module
from e2e.harness.agentproc import AgentProcess
from e2e.harness.faults import start_proxy
from e2e.harness.kernel import links_in, remove_vpc_objects, temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.plugin import Answer, Plugin, base_conf, with_prev
from e2e.harness.publishing import (
    Node,
    advertisement,
    create_pod,
    endpoint_slice,
    make_node,
    vrf_instance,
)
from e2e.harness.rbac import identity_without
from e2e.harness.report import report
from e2e.harness.tenancy import bound, create_binding, delete_binding, namespace
from e2e.harness.wait import wait_until
from tests.ipam_files import IpamFiles

pytestmark = [pytest.mark.root, pytest.mark.cluster]
DENIED = "VPCAttachDenied"
FIGURES: dict[str, Any] = {}


@pytest.fixture
def tenant_vpc() -> Iterator[str]:
    """A VPC of the test's own, with no binding (unlike the `vpc` fixture's)."""
    value = plugin_module.random_vpc()
    yield value
    remove_vpc_objects([value])


@pytest.fixture(scope="module", autouse=True)
def _figures(pytestconfig: pytest.Config,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    if FIGURES:
        path = "agent" if plugin_module.VIA_AGENT else "in-process"
        report(pytestconfig, "tenancy figures",
               tmp_path_factory.getbasetemp() / f"tenancy-{path}.json", FIGURES)


def _conf(vpc: str, att: str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A full ADD: vpc-attach-ipam, a BGPAdvertisement, the VPC's instance and a slice."""
    ipam = {"type": "vpc-attach-ipam", "dataDir": str(tmp_path / "ipam"),
            "ipv6_subnet": "fd00:b1::/48", "ipv4_subnet": "10.177.0.0/16"}
    conf = base_conf(vpc, att, ipam=ipam, **extra)
    conf.pop("publish")
    return conf


def _from_pod_conf(tmp_path: Path) -> dict[str, Any]:
    """One config for every Pod: each chooses its attachment by annotation (`vpcFromPod`)."""
    conf = _conf("1", "1", tmp_path)
    del conf["vpc"], conf["vpcattachment"]
    conf["vpcFromPod"] = True
    return conf


def _denied_events(kube: Kube, pod: str, ns: str) -> list[dict[str, Any]]:
    return [event for event in kube.list(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")
            if (event.get("regarding") or {}).get("name") == pod and event["reason"] == DENIED]


def _wait_denied_event(kube: Kube, pod: str, ns: str) -> dict[str, Any]:
    wait_until(f"a {DENIED} Event on {ns}/{pod}", lambda: bool(_denied_events(kube, pod, ns)), 30)
    return _denied_events(kube, pod, ns)[0]


def _nothing_made(kube: Kube, node: Node, vpc: str, att: str, pod: str, ns: str,
                  tmp_path: Path) -> None:
    assert naming.host_link_name(vpc, att) not in links_in(), "no link"
    assert IpamFiles.read(tmp_path / "ipam").records == {}, "no IPAM allocation"
    assert advertisement(kube, naming.advertisement_name(vpc, att, node.name)) is None
    assert vrf_instance(kube, naming.vrf_instance_name(vpc, node.name)) is None
    assert endpoint_slice(kube, slice_name(pod, vpc, att, "IPv6"), ns) is None


def _until_the_node_sees(plugin: Plugin, node: Node, vpc: str, ns: str, pod: str,
                         denied: bool) -> None:
    """Wait until the plugin decides as the bindings now say: a probe ADD that makes nothing
    whatever the answer (`existing`, publishing off) is refused, or admitted (the agent's
    watch follows the API server a moment later)."""
    probe = base_conf(vpc, "1", attachment="existing",
                      prevResult={"cniVersion": "1.1.0", "interfaces": [], "ips": []})

    def decided() -> bool:
        answer = plugin.call("ADD", probe, container_id=f"probe-{secrets.token_hex(3)}",
                             netns="/proc/self/ns/net", CNI_ARGS=node.cni_args(pod, None, ns))
        return (answer.code == 106) == denied and (denied or answer.status == 0)

    wait_until("the plugin to follow the bindings", decided, 30, interval=0.2)


def _add(plugin: Plugin, node: Node, conf: dict[str, Any], pod: str, ns: str, netns: str,
         container: str, **extra: str) -> Answer:
    return plugin.call("ADD", conf, container_id=container, netns=netns,
                       CNI_ARGS=node.cni_args(pod, None, ns), **extra)


@pytest.mark.both_paths
def test_a_namespace_without_a_binding_is_denied_before_anything_is_made(
        kube: Kube, cluster: Any, plugin: Plugin, netns: str, tenant_vpc: str,
        tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    with namespace(kube, {"team": "blue"}) as ns:
        pod = f"t-{secrets.token_hex(3)}"
        create_pod(kube, pod, node.name, ns)
        conf = _conf(tenant_vpc, "5", tmp_path)
        # Bindings of the VPC that do not admit: another namespace label, another attachment.
        with bound(kube, tenant_vpc, selector={"matchLabels": {"team": "red"}}) as red, \
                bound(kube, tenant_vpc, attachments=["6"]) as six:
            answer = _add(plugin, node, conf, pod, ns, netns, "t-denied")
            assert answer.code == 106, answer.stdout
            msg, details = answer.body["msg"], answer.body["details"]
            assert ns in msg and f"VPC {tenant_vpc}" in msg and "attachment 5" in msg
            assert f"{red}: namespace not selected" in details
            assert f"{six}: attachment not listed" in details
            _nothing_made(kube, node, tenant_vpc, "5", pod, ns, tmp_path)
            event = _wait_denied_event(kube, pod, ns)
            assert event["type"] == "Warning" and red in event["note"]
            # A DEL after the denied ADD (the runtime cleans up) removes nothing shared.
            plugin.ok("DEL", conf, container_id="t-denied", netns=netns,
                      CNI_ARGS=node.cni_args(pod, None, ns))
        FIGURES["denied_add"] = {"msg": msg, "details": details, "event": event["note"]}


@pytest.mark.both_paths
def test_a_binding_admits_and_its_removal_stops_only_new_attachments(
        kube: Kube, cluster: Any, plugin: Plugin, tenant_vpc: str, tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    with namespace(kube, {"team": "blue"}) as ns, temporary_netns("vpa-ten") as first, \
            temporary_netns("vpa-ten") as second:
        pods = [f"t-{secrets.token_hex(3)}" for _ in range(2)]
        for pod in pods:
            create_pod(kube, pod, node.name, ns)
        conf = _conf(tenant_vpc, "7", tmp_path)
        assert _add(plugin, node, conf, pods[0], ns, first, "t-1").code == 106
        name = create_binding(kube, tenant_vpc, attachments=["7"],
                              selector={"matchExpressions": [
                                  {"key": "team", "operator": "In", "values": ["blue"]}]},
                              uses=("veth", "existing"))
        try:
            # Admitted at once: a denial from the agent's cache is confirmed with the API.
            answer = _add(plugin, node, conf, pods[0], ns, first, "t-1")
            assert answer.status == 0, answer.stdout
        finally:
            delete_binding(kube, name)
        _until_the_node_sees(plugin, node, tenant_vpc, ns, pods[0], denied=True)
        plugin.ok("CHECK", with_prev(conf, answer.body), container_id="t-1", netns=first,
                  CNI_ARGS=node.cni_args(pods[0], None, ns))
        other = {**conf, "vpcattachment": "8"}
        assert _add(plugin, node, other, pods[1], ns, second, "t-2").code == 106
        assert naming.host_link_name(tenant_vpc, "8") not in links_in()
        plugin.ok("DEL", with_prev(conf, answer.body), container_id="t-1", netns=first,
                  CNI_ARGS=node.cni_args(pods[0], None, ns))
        assert naming.host_link_name(tenant_vpc, "7") not in links_in()
        assert advertisement(kube, naming.advertisement_name(tenant_vpc, "7", node.name)) is None


@pytest.mark.both_paths
@pytest.mark.parametrize("mode", ["audit", "off"])
def test_audit_allows_and_reports_and_off_does_not_look(
        mode: str, kube: Kube, cluster: Any, plugin: Plugin, netns: str, tenant_vpc: str,
        tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    plugin.environ["VPC_ATTACH_TENANCY"] = mode
    with namespace(kube) as ns:
        pod = f"t-{secrets.token_hex(3)}"
        create_pod(kube, pod, node.name, ns)
        conf = _conf(tenant_vpc, "3", tmp_path)
        result = plugin.ok("ADD", conf, container_id="t-mode", netns=netns,
                           CNI_ARGS=node.cni_args(pod, None, ns))
        assert naming.host_link_name(tenant_vpc, "3") in links_in()
        if mode == "audit":
            event = _wait_denied_event(kube, pod, ns)
            assert event["note"].startswith("allowed by tenancy: audit") and ns in event["note"]
        else:  # an ADD that succeeded has its Event written; none of them is a denial
            assert _denied_events(kube, pod, ns) == []
        plugin.ok("DEL", with_prev(conf, result), container_id="t-mode", netns=netns,
                  CNI_ARGS=node.cni_args(pod, None, ns))


@pytest.mark.both_paths
def test_enforce_denies_an_add_that_names_no_pod_namespace(
        kube: Kube, cluster: Any, plugin: Plugin, netns: str, tenant_vpc: str,
        tmp_path: Path) -> None:
    make_node(kube, cluster, plugin)
    with bound(kube, tenant_vpc):
        answer = plugin.call("ADD", _conf(tenant_vpc, "4", tmp_path), container_id="t-nons",
                             netns=netns)
    assert answer.code == 106 and "K8S_POD_NAMESPACE" in answer.body["msg"]
    assert naming.host_link_name(tenant_vpc, "4") not in links_in()


def _annotated_pod(kube: Kube, node: Node, ns: str, value: str | None) -> str:
    name = f"t-{secrets.token_hex(3)}"
    annotations = {ANNOTATION: value} if value is not None else {}
    kube.create(PODS.path(ns), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": node.name, "automountServiceAccountToken": False,
                 "containers": [{"name": "main", "image": "registry.invalid/pause:1"}]}})
    return name


@pytest.mark.both_paths
def test_pods_of_two_namespaces_choose_their_attachments_within_their_bindings(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path) -> None:
    """One network config (`vpcFromPod`) for both tenants: each Pod gets the attachment its
    annotation names, an annotation never reaches beyond its namespace's bindings, and DEL
    removes what ADD made after the annotation changed."""
    node = make_node(kube, cluster, plugin)
    vpcs = [plugin_module.random_vpc() for _ in range(2)]
    shared = _from_pod_conf(tmp_path)
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, vpcs)
        spaces = [stack.enter_context(namespace(kube, {"tenant": t})) for t in ("a", "b")]
        for vpc, tenant in zip(vpcs, ("a", "b"), strict=True):
            stack.enter_context(bound(kube, vpc, selector={"matchLabels": {"tenant": tenant}}))
        nets = [stack.enter_context(temporary_netns("vpa-ten")) for _ in range(3)]
        pods = [_annotated_pod(kube, node, ns, f"{vpc}/2") for ns, vpc in zip(spaces, vpcs,
                                                                                strict=True)]
        results = []
        for n, (ns, pod) in enumerate(zip(spaces, pods, strict=True)):
            answer = _add(plugin, node, shared, pod, ns, nets[n], f"fp-{n}")
            assert answer.status == 0, answer.stdout
            results.append(answer.body)
        assert {naming.host_link_name(vpc, "2") for vpc in vpcs} <= links_in()
        # Tenant b's Pod naming tenant a's VPC: the annotation does not widen b's bindings.
        intruder = _annotated_pod(kube, node, spaces[1], f"{vpcs[0]}/9")
        answer = _add(plugin, node, shared, intruder, spaces[1], nets[2], "fp-x")
        assert answer.code == 106 and vpcs[0] in answer.body["msg"], answer.stdout
        assert naming.host_link_name(vpcs[0], "9") not in links_in()
        # The annotation changes and vanishes; CHECK and DEL use what ADD recorded.
        pod_path = PODS.path(spaces[0], pods[0])
        kube.request("PATCH", pod_path, {"metadata": {"annotations": {
            ANNOTATION: f"{vpcs[1]}/3"}}}, content_type="application/merge-patch+json")
        plugin.ok("CHECK", with_prev(shared, results[0]), container_id="fp-0", netns=nets[0],
                  CNI_ARGS=node.cni_args(pods[0], None, spaces[0]))
        for n, (ns, pod) in enumerate(zip(spaces, pods, strict=True)):
            plugin.ok("DEL", shared, container_id=f"fp-{n}", netns=nets[n],
                      CNI_ARGS=node.cni_args(pod, None, ns))
        assert not {naming.host_link_name(vpc, "2") for vpc in vpcs} & links_in()
        assert all(advertisement(kube, naming.advertisement_name(vpc, "2", node.name)) is None
                   for vpc in vpcs)


@pytest.mark.both_paths
@pytest.mark.parametrize("value", [None, "no-slash", "a/b/c", "/7", "zzzzzzzzzzzz/1"])
def test_a_missing_or_malformed_annotation_is_code_7_naming_it(
        value: str | None, kube: Kube, cluster: Any, plugin: Plugin, netns: str,
        tmp_path: Path) -> None:
    node = make_node(kube, cluster, plugin)
    shared = _from_pod_conf(tmp_path)
    pod = _annotated_pod(kube, node, "default", value)
    answer = _add(plugin, node, shared, pod, "default", netns, "fp-bad")
    assert answer.code == 7, answer.stdout
    assert ANNOTATION in answer.body["msg"] or "zzzz" in answer.body["msg"]
    assert IpamFiles.read(tmp_path / "ipam").records == {}, "nothing allocated"


def test_the_check_costs_no_request_through_the_agent_and_two_without(
        kube: Kube, cluster: Any, plugin: Plugin, tenant_vpc: str, tmp_path: Path) -> None:
    """Seen by a proxy between the plugin and the API server: in-process, the check is one
    LIST of VPCBindings and one GET of the namespace; through the agent, an ADD under
    `enforce` makes exactly the requests it makes under `off` (the watches answer)."""
    proxied = start_proxy(cluster, tmp_path)
    try:
        node = make_node(kube, cluster, plugin)
        plugin.environ["VPC_ATTACH_KUBECONFIG"] = str(proxied.kubeconfig)
        with namespace(kube) as ns, bound(kube, tenant_vpc):
            pods = [f"t-{secrets.token_hex(3)}" for _ in range(4)]
            uids = [create_pod(kube, pod, node.name, ns) for pod in pods]
            runs: dict[str, list[str]] = {}
            seen = _requests(proxied, plugin, node, tenant_vpc, ns, pods[0], uids[0], "0",
                             tmp_path, env={"VPC_ATTACH_AGENT_SOCKET": "/nonexistent/a.sock"})
            checks = [s for s in seen if s.startswith(("GET vpcbindings", "GET namespaces"))]
            assert checks == ["GET vpcbindings", f"GET namespaces/{ns}"], seen
            runs["in-process, enforce"] = seen
            (tmp_path / "agent").mkdir()
            with AgentProcess(tmp_path / "agent") as agent:
                env = {"VPC_ATTACH_AGENT_SOCKET": str(agent.socket)}
                # The first ADD through the agent starts its watches.
                _requests(proxied, plugin, node, tenant_vpc, ns, pods[1], uids[1], "1",
                          tmp_path, env=env)
                for n, mode in ((2, "off"), (3, "enforce")):
                    runs[f"agent, {mode}"] = _requests(
                        proxied, plugin, node, tenant_vpc, ns, pods[n], uids[n], str(n),
                        tmp_path, env={**env, "VPC_ATTACH_TENANCY": mode})
            kinds = {k: sorted(r.split("/")[0] for r in v) for k, v in runs.items()}
            assert kinds["agent, enforce"] == kinds["agent, off"], runs
            assert not [s for s in runs["agent, enforce"]
                        if s.startswith(("GET vpcbindings", "GET namespaces"))]
            FIGURES["api_requests_of_an_add"] = {k: {"count": len(v), "requests": v}
                                                 for k, v in runs.items()}
    finally:
        proxied.stop()


def _requests(proxied: Any, plugin: Plugin, node: Node, vpc: str, ns: str, pod: str, uid: str,
              att: str, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """The API requests (watches and Events aside) of one ADD of a fresh attachment; its DEL
    follows, outside the count."""
    conf = _conf(vpc, att, tmp_path)
    with temporary_netns("vpa-ten") as netns:
        mark = len(proxied.proxy.seen())
        result = plugin.ok("ADD", conf, container_id=f"cnt-{att}", netns=netns,
                           CNI_ARGS=node.cni_args(pod, uid, ns), **env)
        # The proxy records a request once it relayed the answer: wait for the last one.
        wait_until("the proxy to record the ADD's requests",
                   lambda: proxied.proxy.in_flight() == 0, 10, interval=0.05)
        seen = [f"{s.method} {s.resource}{'/' + s.name if s.name else ''}"
                for s in proxied.proxy.seen()[mark:]
                if "watch=1" not in s.path and s.resource not in ("events", None)]
        plugin.ok("DEL", with_prev(conf, result), container_id=f"cnt-{att}", netns=netns,
                  CNI_ARGS=node.cni_args(pod, uid, ns), **env)
    return seen


def test_the_crd_rejects_a_changed_vpc_and_malformed_specs(kube: Kube) -> None:
    from e2e.harness.kube import ApiError
    from e2e.harness.tenancy import binding_body
    name = create_binding(kube, "7")
    try:
        with pytest.raises(ApiError) as changed:
            kube.apply(binding_body(name, "8"))
        assert "immutable" in str(changed.value)
    finally:
        delete_binding(kube, name)
    for spec in ({"attachments": ["*", "1"]}, {"uses": ("veth", "bridge")},
                 {"selector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}):
        with pytest.raises(ApiError):
            kube.create(BINDINGS.path(), binding_body(f"bad-{secrets.token_hex(3)}", "7",
                                                      **spec), dry_run=True)
    body = binding_body("no-selector", "7")
    del body["spec"]["namespaceSelector"]
    with pytest.raises(ApiError):
        kube.create(BINDINGS.path(), body, dry_run=True)


@pytest.mark.both_paths
def test_an_identity_that_cannot_read_bindings_fails_status_and_add_before_any_change(
        kube: Kube, cluster: Any, plugin: Plugin, netns: str, tenant_vpc: str,
        tmp_path: Path) -> None:
    """Under `enforce` an unreadable VPCBinding list is STATUS code 50 (every ADD would fail)
    and ADD code 104 naming the refusal, with nothing made."""
    node = make_node(kube, cluster, plugin)
    conf = _conf(tenant_vpc, "2", tmp_path)
    with namespace(kube) as ns, bound(kube, tenant_vpc), identity_without(
            kube, cluster, tmp_path, {("vpc-attach.datum.net", "vpcbindings")}) as kubeconfig:
        pod = f"t-{secrets.token_hex(3)}"
        create_pod(kube, pod, node.name, ns)
        env = {"VPC_ATTACH_KUBECONFIG": str(kubeconfig)}
        status = plugin.call("STATUS", conf, **env)
        assert status.code == 50 and "vpcbindings" in status.body["msg"].lower(), status.stdout
        answer = _add(plugin, node, conf, pod, ns, netns, "t-rbac", **env)
        assert answer.code in (11, 104), answer.stdout  # refused in-process; the agent's watch
        assert "vpcbinding" in answer.body["msg"].lower(), answer.stdout
        assert naming.host_link_name(tenant_vpc, "2") not in links_in()
        assert IpamFiles.read(tmp_path / "ipam").records == {}
        assert plugin.call("STATUS", conf, VPC_ATTACH_TENANCY="audit", **env).status == 0


@pytest.mark.both_paths
def test_gc_of_a_shared_network_collects_the_attachments_its_records_name(
        kube: Kube, cluster: Any, plugin: Plugin, tmp_path: Path) -> None:
    """GC of a `vpcFromPod` network: every attachment ADD recorded for it on this node is
    looked at, the ones of containers the runtime no longer lists are removed with their
    records, the valid one stays."""
    node = make_node(kube, cluster, plugin)
    vpcs = [plugin_module.random_vpc() for _ in range(2)]
    shared = _from_pod_conf(tmp_path)
    with contextlib.ExitStack() as stack:
        stack.callback(remove_vpc_objects, vpcs)
        ns = stack.enter_context(namespace(kube))
        for vpc in vpcs:
            stack.enter_context(bound(kube, vpc))
        nets = [stack.enter_context(temporary_netns("vpa-ten")) for _ in range(2)]
        pods = [_annotated_pod(kube, node, ns, f"{vpc}/4") for vpc in vpcs]
        for n, pod in enumerate(pods):
            assert _add(plugin, node, shared, pod, ns, nets[n], f"gc-{n}").status == 0
        records = plugin.lock_dir / "attachments"
        assert sorted(p.name for p in records.iterdir()) == ["gc-0@eth0.json", "gc-1@eth0.json"]
        valid = [{"containerID": "gc-0", "ifname": "eth0"}]
        plugin.ok("GC", {**shared, "cni.dev/valid-attachments": valid})
        assert naming.host_link_name(vpcs[0], "4") in links_in(), "the valid one stays"
        assert naming.host_link_name(vpcs[1], "4") not in links_in()
        assert sorted(p.name for p in records.iterdir()) == ["gc-0@eth0.json"]
        plugin.ok("DEL", shared, container_id="gc-0", netns=nets[0],
                  CNI_ARGS=node.cni_args(pods[0], None, ns))
        assert naming.host_link_name(vpcs[0], "4") not in links_in()
