"""Which Event an answered ADD gets: from its validated invocation, or read leniently from the
request when it did not parse (the writing itself is tested against the real API server in
e2e/test_events.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.agent.events import ATTACHED, DENIED, FAILED, PodEvent, pod_event
from cni_plugin.core.request import Invocation, Request
from cni_plugin.dispatch import Outcome
from cni_plugin.kube.events import NOTE_LIMIT
from netconf.errors import CniError

ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-0;K8S_POD_UID=u-1"
STANZA: dict[str, Any] = {"cniVersion": "1.1.0", "name": "vpc21", "type": "vpc-attach",
                          "vpc": "jU", "vpcattachment": "G"}


def request(tmp_path: Path, stanza: dict[str, Any] | bytes = STANZA, args: str = ARGS,
            extra: dict[str, str] | None = None) -> Request:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/run/netns/p",
           "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin", "CNI_ARGS": args,
           "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "host.json"),
           "VPC_ATTACH_NODE_NAME": "worker-1", "VPC_ATTACH_KUBECONFIG": "/k", **(extra or {})}
    body = stanza if isinstance(stanza, bytes) else json.dumps(stanza).encode()
    return Request(env, body)


def pod_event_of(received: Request, status: int, payload: dict[str, Any] | None
                 ) -> PodEvent | None:
    """The Event of an ADD answered (status, payload), with the invocation the dispatcher
    would have carried: the parsed request, or None when it does not parse."""
    try:
        invocation: Invocation | None = Invocation.parse(received)
    except CniError:
        invocation = None
    code = int((payload or {}).get("code", 0)) if status else 0
    message = str((payload or {}).get("msg", "")) if status else ""
    return pod_event(Outcome(received, invocation, status, payload, code, message))


def test_a_successful_add_is_a_normal_event_naming_interface_vpc_and_addresses(
        tmp_path: Path) -> None:
    result = {"cniVersion": "1.1.0", "ips": [{"address": "fd00::2/96"},
                                              {"address": "10.0.0.2/32"}]}
    event = pod_event_of(request(tmp_path), 0, result)
    assert event is not None
    assert (event.reason, event.type, event.namespace, event.pod, event.uid) == \
        (ATTACHED, "Normal", "team-a", "web-0", "u-1")
    assert (event.node, event.kubeconfig) == ("worker-1", "/k")
    assert event.note == "VPC jU attachment G attached as net1: fd00::2/96, 10.0.0.2/32"


def test_a_failed_add_is_a_warning_with_the_cni_code_even_when_the_config_is_broken(
        tmp_path: Path) -> None:
    error = {"cniVersion": "1.1.0", "code": 6, "msg": "cannot decode network config"}
    event = pod_event_of(request(tmp_path, b"{not json"), 1, error)
    assert event is not None and (event.reason, event.type) == (FAILED, "Warning")
    assert event.note == "VPC ? attachment ? on net1: ADD failed with CNI error 6: " \
        "cannot decode network config"


def test_an_add_no_binding_admitted_is_a_denial_with_the_bindings_considered(
        tmp_path: Path) -> None:
    error = {"cniVersion": "1.1.0", "code": 106, "msg": "namespace 'team-a' may not attach to "
             "VPC jU attachment G (veth): no VPCBinding admits it",
             "details": "VPCBindings of VPC jU: blue: namespace not selected"}
    event = pod_event_of(request(tmp_path), 1, error)
    assert event is not None and (event.reason, event.type) == (DENIED, "Warning")
    assert event.note == f"{error['msg']} ({error['details']})"


def test_config_args_win_and_stanza_host_settings_only_where_the_node_allows(
        tmp_path: Path) -> None:
    stanza = {**STANZA, "nodeName": "from-stanza", "kubeconfig": "/tenant/admin.kubeconfig",
              "args": {"cni": {"K8S_POD_NAME": "web-1", "K8S_POD_UID": "u-2"}}}
    allowed = pod_event_of(request(tmp_path, stanza,
                                   extra={"VPC_ATTACH_STANZA_HOST_SETTINGS": "allow"}),
                           0, {"ips": []})
    assert allowed is not None and (allowed.pod, allowed.uid, allowed.node) == \
        ("web-1", "u-2", "from-stanza")
    # Refused (the ADD answered code 7): the Event says so with the node's own identity.
    error = {"code": 7, "msg": "config key 'nodeName' is a host setting"}
    refused = pod_event_of(request(tmp_path, stanza), 1, error)
    assert refused is not None and (refused.node, refused.kubeconfig) == ("worker-1", "/k")
    assert refused.reason == FAILED and "host setting" in refused.note


@pytest.mark.parametrize(("args", "environ"), [
    ("K8S_POD_NAME=web-0", {}),  # no namespace
    (ARGS, {"VPC_ATTACH_KUBECONFIG": ""}),  # no kubeconfig
    (ARGS, {"VPC_ATTACH_NODE_NAME": ""}),  # no node name
])
def test_no_event_without_a_pod_or_a_cluster_to_write_to(tmp_path: Path, args: str,
                                                         environ: dict[str, str]) -> None:
    assert pod_event_of(request(tmp_path, args=args, extra=environ), 0, {"ips": []}) is None


def test_an_unreadable_host_file_means_no_event(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text("{broken")
    assert pod_event_of(request(tmp_path, extra={"VPC_ATTACH_KUBECONFIG": ""}), 0, {}) is None


def test_a_long_message_is_cut_to_the_api_servers_limit(tmp_path: Path) -> None:
    error = {"code": 104, "msg": "é" * 2000}
    event = pod_event_of(request(tmp_path), 1, error)
    assert event is not None and len(event.note.encode()) <= NOTE_LIMIT
    assert event.note.endswith("...")


def test_repeats_share_a_key_and_a_different_failure_does_not(tmp_path: Path) -> None:
    first = pod_event_of(request(tmp_path), 1, {"code": 7, "msg": "bad mtu"})
    again = pod_event_of(request(tmp_path), 1, {"code": 7, "msg": "bad mtu"})
    other = pod_event_of(request(tmp_path), 1, {"code": 11, "msg": "API down"})
    assert first is not None and again is not None and other is not None
    assert first.key == again.key != other.key
