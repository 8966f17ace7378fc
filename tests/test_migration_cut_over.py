"""A live migration's target record and cut-over (SPEC §16, issue 32 item 4), without a
cluster: the record round-trips, the source's containers are told from other Pods' by their
prefixes, and a cut-over against an in-memory API announces the target, withdraws only the
source and flips the slices, idempotently (an agent restarted mid-way runs it again). The
same through the plugin and galactic-router on two nodes:
e2e/test_live_migration_with_pods_and_timestamp_written_as_kubevirt_would.py."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, KubeClient, Resource, Target
from cni_plugin.kubevirt import migration
from cni_plugin.kubevirt.migration import (
    READY_ANNOTATION,
    MigrationSource,
    PendingTarget,
    api_complete_ready,
    api_cut_over,
    pending_targets,
    remove_pending,
    source_containers,
    target_ready,
    write_pending,
)
from cni_plugin.publish.resources import (
    ADVERTISEMENTS,
    CONTAINER_ID_ANNOTATION,
    ENDPOINT_SLICES,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NETNS_KEY,
    NODE_KEY,
    SUBNET_V4_KEY,
    SUBNET_V6_KEY,
)

V6, V4 = "fd00:63::1:0:0/96", "10.63.0.2"
PREFIXES = {V6, f"{V4}/32"}


class Api:
    """Objects by (plural, namespace, name); conditional writes check resourceVersion."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.version = 0

    def put(self, resource: Resource, obj: dict[str, Any]) -> None:
        self.version += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.version)
        meta.setdefault("uid", f"uid-{meta['name']}")
        self.objects[(resource.plural, meta["namespace"], meta["name"])] = copy.deepcopy(obj)

    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            deadline: Deadline) -> dict[str, Any] | None:
        found = self.objects.get((resource.plural, namespace or "", name))
        return copy.deepcopy(found) if found is not None else None

    def create(self, resource: Resource, body: dict[str, Any], *,
               namespace: str | None = None, deadline: Deadline) -> Any:
        if (resource.plural, namespace or "", body["metadata"]["name"]) in self.objects:
            raise ApiError(409, "AlreadyExists", "exists", "POST", resource.plural,
                           Target(resource, namespace, body["metadata"]["name"]))
        self.put(resource, copy.deepcopy(body))
        return body

    def put_unless_changed(self, resource: Resource, body: dict[str, Any], *,
                           deadline: Deadline) -> bool:
        meta = body["metadata"]
        current = self.objects.get((resource.plural, meta["namespace"], meta["name"]))
        if current is None or current["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            return False
        self.put(resource, copy.deepcopy(body))
        return True

    def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
               deadline: Deadline, uid: str | None = None,
               resource_version: str | None = None) -> bool:
        key = (resource.plural, namespace or "", name)
        current = self.objects.get(key)
        if current is None or (resource_version and
                               current["metadata"]["resourceVersion"] != resource_version):
            return False
        del self.objects[key]
        return True


def container(cid: str, node: str, *subnets: tuple[str, str]) -> dict[str, str]:
    values = {NETNS_KEY + cid: f"/var/run/netns/{cid}", NODE_KEY + cid: node}
    for key, value in subnets:
        values[key + cid] = value
    return values


def advertisement(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    from cni_plugin.publish.bgp.spec import prefixes_of
    return {"metadata": {"name": name, "namespace": "galactic-system",
                         "annotations": annotations},
            "spec": {"routerRef": {"name": "router-1"}, "prefixes": prefixes_of(annotations)}}


def endpoint_slice(name: str, owner: str, ready: bool, *,
                   managed_by: str = MANAGED_BY) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "vms",
                         "labels": {MANAGED_BY_LABEL: managed_by},
                         "annotations": {CONTAINER_ID_ANNOTATION: owner}},
            "endpoints": [{"addresses": ["x"], "conditions": {"ready": ready,
                                                              "serving": ready}}]}


def pending(**changes: Any) -> PendingTarget:
    fields: dict[str, Any] = dict(
        network="vms-1", container_id="ctr-target", ifname="net1", pod_namespace="vms",
        pod_name="target", pod_uid="uid-target", node="node-2",
        bgp_namespace="galactic-system", advertisement="ad-node-2",
        annotations=container("ctr-target", "node-2", (SUBNET_V6_KEY, V6), (SUBNET_V4_KEY, V4)),
        spec={"routerRef": {"name": "router-2"}, "vrfID": 1}, owner_references=[],
        created_by="ctr-target/net1/abc", slices=["target-ipv6"],
        source=MigrationSource("vms", "source", "node-1"),
        source_advertisement="ad-node-1", source_slices=["source-ipv6"])
    fields.update(changes)
    return PendingTarget(**fields)


def scene() -> Api:
    api = Api()
    other = container("ctr-other", "node-1", (SUBNET_V6_KEY, "fd00:63::2:0:0/96"))
    source = container("ctr-source", "node-1", (SUBNET_V6_KEY, V6), (SUBNET_V4_KEY, V4))
    api.put(ADVERTISEMENTS, advertisement("ad-node-1", {**other, **source}))
    api.put(ENDPOINT_SLICES, endpoint_slice("target-ipv6", "ctr-target", False))
    api.put(ENDPOINT_SLICES, endpoint_slice("source-ipv6", "ctr-source", True))
    return api


def client(api: Api) -> KubeClient:
    return cast(KubeClient, api)


def ready(obj: dict[str, Any] | None) -> bool:
    assert obj is not None
    return bool(obj["endpoints"][0]["conditions"]["ready"])


def test_the_ready_timestamp_is_the_annotations_presence() -> None:
    assert target_ready({"metadata": {"annotations": {READY_ANNOTATION: "2026-12-06"}}})
    assert not target_ready({"metadata": {"annotations": {READY_ANNOTATION: ""}}})
    assert not target_ready({"metadata": {}})
    assert not target_ready(None)


def test_the_source_is_the_container_advertising_only_the_claims_addresses() -> None:
    annotations = {**container("ctr-source", "node-1", (SUBNET_V6_KEY, V6), (SUBNET_V4_KEY, V4)),
                   **container("ctr-more", "node-1", (SUBNET_V6_KEY, V6),
                               (SUBNET_V4_KEY, "10.63.0.9")),
                   **container("ctr-elsewhere", "node-3", (SUBNET_V6_KEY, V6)),
                   **container("ctr-l2", "node-1")}
    assert source_containers(annotations, "node-1", PREFIXES) == {"ctr-source"}


def test_a_cut_over_announces_the_target_then_withdraws_only_the_source() -> None:
    api = scene()
    api_cut_over(client(api), pending(), Deadline(5))
    target_ad = api.get(ADVERTISEMENTS, "ad-node-2", namespace="galactic-system",
                        deadline=Deadline(5))
    assert target_ad is not None and set(target_ad["spec"]["prefixes"]) == PREFIXES
    assert target_ad["spec"]["routerRef"] == {"name": "router-2"}
    assert target_ad["metadata"]["annotations"]["vpc-attach.datum.net/created-by"] == \
        "ctr-target/net1/abc"
    source_ad = api.get(ADVERTISEMENTS, "ad-node-1", namespace="galactic-system",
                        deadline=Deadline(5))
    assert source_ad is not None and source_ad["spec"]["prefixes"] == ["fd00:63::2:0:0/96"]
    assert NODE_KEY + "ctr-other" in source_ad["metadata"]["annotations"]
    assert ready(api.get(ENDPOINT_SLICES, "target-ipv6", namespace="vms", deadline=Deadline(5)))
    assert not ready(api.get(ENDPOINT_SLICES, "source-ipv6", namespace="vms",
                             deadline=Deadline(5)))


def test_a_slice_of_that_name_not_managed_by_vpc_attach_is_left_alone() -> None:
    api = scene()
    api.put(ENDPOINT_SLICES, endpoint_slice("source-ipv6", "ctr-source", True,
                                            managed_by="someone-else"))
    api_cut_over(client(api), pending(), Deadline(5))
    assert ready(api.get(ENDPOINT_SLICES, "source-ipv6", namespace="vms", deadline=Deadline(5)))


def test_a_cut_over_run_again_changes_nothing_more() -> None:
    api = scene()
    api_cut_over(client(api), pending(), Deadline(5))
    before = copy.deepcopy(api.objects)
    api_cut_over(client(api), pending(), Deadline(5))
    assert api.objects == before


def test_a_target_advertisement_created_meanwhile_is_merged_into() -> None:
    api = scene()
    api.put(ADVERTISEMENTS, advertisement("ad-node-2", container(
        "ctr-neighbour", "node-2", (SUBNET_V6_KEY, "fd00:63::3:0:0/96"))))
    api_cut_over(client(api), pending(), Deadline(5))
    found = api.get(ADVERTISEMENTS, "ad-node-2", namespace="galactic-system",
                    deadline=Deadline(5))
    assert found is not None
    assert set(found["spec"]["prefixes"]) == PREFIXES | {"fd00:63::3:0:0/96"}
    assert found["spec"]["routerRef"] == {"name": "router-1"}  # as created: never changed


def test_the_source_nodes_advertisement_goes_when_the_source_was_its_last_container() -> None:
    api = Api()
    api.put(ADVERTISEMENTS, advertisement("ad-node-1", container(
        "ctr-source", "node-1", (SUBNET_V6_KEY, V6), (SUBNET_V4_KEY, V4))))
    api_cut_over(client(api), pending(slices=[], source_slices=[]), Deadline(5))
    assert ("bgpadvertisements", "galactic-system", "ad-node-1") not in api.objects
    assert ("bgpadvertisements", "galactic-system", "ad-node-2") in api.objects


def test_records_are_written_read_and_removed(tmp_path: Path) -> None:
    record = pending()
    write_pending(str(tmp_path), record)
    (tmp_path / migration.RECORDS_DIR / "junk.json").write_text("{")
    assert pending_targets(str(tmp_path)) == [record]
    remove_pending(str(tmp_path), "ctr-target", "net1")
    remove_pending(str(tmp_path), "ctr-target", "net1")  # gone already: nothing to do
    assert pending_targets(str(tmp_path)) == []


def test_only_a_ready_pod_of_the_same_uid_is_cut_over(tmp_path: Path) -> None:
    api = scene()
    write_pending(str(tmp_path), pending())
    pods: dict[str, dict[str, Any]] = {"target": {"metadata": {"uid": "uid-target"}}}

    def complete() -> list[PendingTarget]:
        return api_complete_ready(client(api), str(tmp_path), Deadline(5),
                                  lambda _namespace, name: pods.get(name))

    assert complete() == []
    pods["target"] = {"metadata": {"uid": "uid-recreated",
                                   "annotations": {READY_ANNOTATION: "now"}}}
    assert complete() == []
    pods["target"]["metadata"]["uid"] = "uid-target"
    assert [p.pod_name for p in complete()] == ["target"]
    assert pending_targets(str(tmp_path)) == []


_text = st.text(st.characters(codec="utf-8"), max_size=12)


@given(_text, _text, st.dictionaries(_text, _text, max_size=4), st.lists(_text, max_size=3))
def test_a_record_reads_back_as_written(container_id: str, node: str,
                                        annotations: dict[str, str], slices: list[str]) -> None:
    record = pending(container_id=container_id, node=node, annotations=annotations,
                     slices=slices, source=MigrationSource("ns", node, node))
    assert PendingTarget.from_json(record.to_json()) == record


class Pods:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))


class Warm:
    """What the agent's cut-overs use of its WarmCluster."""

    def __init__(self, api: Api) -> None:
        self.api, self.pods = api, Pods()

    def watch_pods(self, kubeconfig: str, node: str) -> Pods:
        return self.pods

    def client(self, kubeconfig: str) -> KubeClient:
        return client(self.api)

    def release(self, kubeconfig: str, kube: KubeClient) -> None:
        pass


def test_the_agent_cuts_over_when_its_pod_watch_sees_the_ready_timestamp(
        tmp_path: Path) -> None:
    from cni_plugin.kubevirt.cutovers import MigrationCutovers
    api, lock_dir = scene(), str(tmp_path)
    warm = Warm(api)
    write_pending(lock_dir, pending())
    cutovers = MigrationCutovers(warm, "kubeconfig", "node-2")
    cutovers.expect(lock_dir)  # looks at once: the Pod is not marked yet
    target = {"metadata": {"namespace": "vms", "name": "target", "uid": "uid-target",
                           "annotations": {READY_ANNOTATION: "2026-12-06 10:00:00 +0000 UTC"}}}
    warm.pods.pods[("vms", "target")] = target
    cutovers.pod_changed(target)
    waited, deadline = threading.Event(), time.monotonic() + 10  # a thread of its own does it
    while pending_targets(lock_dir) and time.monotonic() < deadline:
        waited.wait(0.01)
    assert pending_targets(lock_dir) == []
    assert ready(api.get(ENDPOINT_SLICES, "target-ipv6", namespace="vms", deadline=Deadline(5)))
    assert ("bgpadvertisements", "galactic-system", "ad-node-2") in api.objects
