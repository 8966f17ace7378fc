"""API refusals become CNI errors in one place (publish.api_boundary → kube.client.api_failure),
naming the object; the agent's watch resumes from the last resourceVersion it saw."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation, Request
from cni_plugin.kube.client import ApiError, KubeClient, Resource, Target, api_failure
from cni_plugin.kube.config import load_kubeconfig
from cni_plugin.kube.kinds import NAMESPACES, PODS
from cni_plugin.kube.session import ClusterSession, ColdCluster, ColdSession, VerbCluster
from cni_plugin.kube.watch import WatchCache
from cni_plugin.publish.check import published_differences
from cni_plugin.publish.resources import ADVERTISEMENTS, ENDPOINT_SLICES
from netconf.errors import PUBLISH_FAILURE, TRY_AGAIN_LATER, CniError
from netconf.result import Result


def refusal(status: int, method: str, target: Target | str) -> ApiError:
    path = target.path() if isinstance(target, Target) else target
    return ApiError(status, "Forbidden" if status == 403 else "Nope", "denied", method, path,
                    target if isinstance(target, Target) else None)


def test_the_error_names_the_kind_namespace_and_name_of_the_object() -> None:
    adv = Target(ADVERTISEMENTS, "galactic-system", "3e-3e")
    assert refusal(403, "PUT", adv).doing() == "update BGPAdvertisement galactic-system/3e-3e"
    assert refusal(403, "POST", Target(ENDPOINT_SLICES, "team-a")).doing() == \
        "create EndpointSlice team-a"
    assert refusal(403, "GET", Target(PODS)).doing() == "list Pod"
    assert refusal(403, "GET", Target(NAMESPACES, "ignored", "team-a")).doing() == \
        "get Namespace team-a"
    assert refusal(403, "GET", "/version").doing() == "GET /version"


@pytest.mark.parametrize(("status", "code"), [(401, TRY_AGAIN_LATER), (403, PUBLISH_FAILURE),
                                              (404, PUBLISH_FAILURE), (422, PUBLISH_FAILURE)])
def test_each_refusal_gets_the_code_the_spec_gives(status: int, code: int) -> None:
    err = api_failure(refusal(status, "DELETE", Target(ADVERTISEMENTS, "ns", "a")), "withdraw")
    assert err.code == code
    assert err.msg.startswith("failed to withdraw: delete BGPAdvertisement ns/a")
    assert ("ClusterRole" in err.msg) == (status == 403)


class RefusingClient(KubeClient):
    """Every request refused with 403, as an API server without the RBAC rules would."""

    def request(self, method: str, target: Target | str, deadline: Deadline, *,
                body: Any = None, query: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        raise refusal(403, method, target)


class RefusingSession(ColdSession):
    """A session whose client is a RefusingClient."""

    def _connect(self) -> KubeClient:
        return RefusingClient(load_kubeconfig(self.kubeconfig))


class RefusingCluster(ColdCluster):
    """A ClusterSource lending RefusingClients."""

    def session(self, kubeconfig: str) -> ClusterSession:
        return RefusingSession(kubeconfig)


def test_check_answers_a_refused_read_as_code_104_not_an_internal_error(
        tmp_path: Path, kubeconfig: str) -> None:
    environ = {"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/p",
               "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
               "CNI_ARGS": "K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web",
               "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent.json"),
               "VPC_ATTACH_NODE_NAME": "node-1", "VPC_ATTACH_KUBECONFIG": kubeconfig}
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "vpc-attach", "vpc": "10",
            "vpcattachment": "10", "ipam": {"type": "host-local"}}
    inv = Invocation.parse(Request(environ=environ, stdin=json.dumps(conf).encode()))
    prev = Result.from_wire({"cniVersion": "1.1.0", "ips": [{"address": "fd00::5/64"}]})
    with pytest.raises(CniError) as caught, VerbCluster(RefusingCluster(), kubeconfig) as cluster:
        published_differences(inv, cluster, Addressing.from_result(prev))
    assert caught.value.code == PUBLISH_FAILURE
    assert "BGPVRFInstance" in caught.value.msg and "ClusterRole" in caught.value.msg


class ScriptedWatch(KubeClient):
    """A client whose watch plays back the given events and records the query it was asked."""

    def __init__(self, kubeconfig: str, events: list[dict[str, Any]]) -> None:
        super().__init__(load_kubeconfig(kubeconfig))
        self.events = events
        self.queries: list[dict[str, str]] = []

    def watch(self, resource: Resource, query: Mapping[str, str], timeout: float, *,
              namespace: str | None = None) -> Iterator[dict[str, Any]]:
        self.queries.append(dict(query))
        yield from self.events


def test_a_watch_resumes_from_the_last_version_it_saw_bookmarks_included(kubeconfig: str) -> None:
    pod = {"metadata": {"namespace": "team-a", "name": "web", "resourceVersion": "5"}}
    client = ScriptedWatch(kubeconfig, [{"type": "ADDED", "object": pod},
                            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}])
    cache = WatchCache(client.creds, PODS, "spec.nodeName=node-1")  # not started
    assert cache._watch(client, "1") == "9"
    assert client.queries[0]["resourceVersion"] == "1"
    assert client.queries[0]["allowWatchBookmarks"] == "true"
    assert cache._objects["team-a/web"] == pod


def test_a_watch_error_event_makes_the_cache_list_again(kubeconfig: str) -> None:
    client = ScriptedWatch(kubeconfig, [{"type": "ERROR",
                                         "object": {"message": "too old resource version"}}])
    cache = WatchCache(client.creds, PODS, "spec.nodeName=node-1")
    with pytest.raises(ConnectionError, match="too old"):
        cache._watch(client, "1")
