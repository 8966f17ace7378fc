"""The VPCBinding decision (SPEC §14) without a cluster: label selectors as Kubernetes defines
them, bindings adding up like RBAC rules, the details of a denial, the Pod's annotation, and
the on-node record DEL reads (the same paths on the real control plane: e2e/test_tenancy.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core import naming
from cni_plugin.core.request import Invocation, Request
from cni_plugin.tenancy import choice
from cni_plugin.tenancy.bindings import MalformedBinding, Selector, decide
from netconf.base62 import ATTACHMENT_LIMIT, VPC_LIMIT, encode_base62
from netconf.errors import INVALID_CONFIG, CniError
from netconf.host import resolve_host_settings

KEYS = st.sampled_from(["team", "tier", "env"])
VALUES = st.sampled_from(["a", "b", "c"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=3)
OPERATORS = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"])


@st.composite
def expressions(draw: st.DrawFn) -> dict[str, Any]:
    operator = draw(OPERATORS)
    item: dict[str, Any] = {"key": draw(KEYS), "operator": operator}
    if operator in ("In", "NotIn"):
        item["values"] = draw(st.lists(VALUES, min_size=1, max_size=3))
    return item


SELECTORS = st.fixed_dictionaries({}, optional={
    "matchLabels": st.dictionaries(KEYS, VALUES, max_size=2),
    "matchExpressions": st.lists(expressions(), max_size=3)})


def reference_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes' LabelSelector semantics, written out plainly."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for item in selector.get("matchExpressions") or []:
        key, operator, values = item["key"], item["operator"], item.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": not (key in labels and labels[key] in values),
              "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not ok:
            return False
    return True


@given(SELECTORS, LABELS)
def test_a_selector_matches_as_kubernetes_defines_it(selector: dict[str, Any],
                                                    labels: dict[str, str]) -> None:
    assert Selector.parse(selector).matches(labels) == reference_match(selector, labels)


@given(LABELS)
def test_the_empty_selector_selects_every_namespace(labels: dict[str, str]) -> None:
    assert Selector.parse({}).matches(labels)


@pytest.mark.parametrize("selector", [None, [], {"matchLabels": {"a": 1}},
                                      {"matchExpressions": [{"key": "a", "operator": "In"}]},
                                      {"matchExpressions": [{"key": "a", "operator": "Is"}]},
                                      {"matchExpressions": [{"key": "a", "operator": "Exists",
                                                             "values": ["x"]}]}])
def test_a_malformed_selector_is_refused(selector: Any) -> None:
    with pytest.raises(MalformedBinding):
        Selector.parse(selector)


def binding(name: str, vpc: str, attachments: list[str], selector: dict[str, Any],
            uses: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"vpc": vpc, "attachments": attachments,
                                                  "namespaceSelector": selector,
                                                  "allowedUses": uses}}


ATTACHMENTS = st.integers(0, ATTACHMENT_LIMIT - 1).map(encode_base62)
VPCS = st.integers(0, VPC_LIMIT - 1).map(encode_base62)
USES = st.sampled_from(["veth", "tap", "existing"])
BINDINGS = st.lists(st.builds(binding, st.text("abc", min_size=1, max_size=4), VPCS,
                              st.one_of(st.just(["*"]), st.lists(ATTACHMENTS, min_size=1,
                                                                 max_size=3)),
                              SELECTORS, st.lists(USES, min_size=1, max_size=3)), max_size=4)


def admits(obj: dict[str, Any], vpc: str, att: str, labels: dict[str, str], kind: str) -> bool:
    spec = obj["spec"]
    return naming.pad_base62(spec["vpc"], 9) == naming.pad_base62(vpc, 9) and \
        (spec["attachments"] == ["*"] or any(naming.pad_base62(a, 3) == naming.pad_base62(
            att, 3) for a in spec["attachments"])) and \
        reference_match(spec["namespaceSelector"], labels) and kind in spec["allowedUses"]


@given(BINDINGS, VPCS, ATTACHMENTS, LABELS, USES)
def test_bindings_add_up_and_no_binding_means_no(objects: list[dict[str, Any]], vpc: str,
                                                 att: str, labels: dict[str, str],
                                                 kind: str) -> None:
    decision = decide(objects, vpc, att, labels, kind)
    assert decision.admitted == any(admits(o, vpc, att, labels, kind) for o in objects)
    if decision.admitted:
        assert any(o["metadata"]["name"] == decision.by and admits(o, vpc, att, labels, kind)
                   for o in objects)


@given(BINDINGS, VPCS, ATTACHMENTS, USES)
def test_an_unknown_namespace_is_never_admitted(objects: list[dict[str, Any]], vpc: str,
                                                att: str, kind: str) -> None:
    assert not decide(objects, vpc, att, None, kind).admitted


def test_a_denial_lists_the_vpcs_bindings_and_why_each_did_not_admit() -> None:
    objects = [binding("red", "10", ["*"], {"matchLabels": {"team": "red"}}, ["veth"]),
               binding("six", "10", ["6"], {}, ["veth"]),
               binding("taps", "10", ["*"], {}, ["tap"]),
               binding("other", "11", ["*"], {}, ["veth"]),
               {"metadata": {"name": "broken"}, "spec": {"vpc": "10"}}]
    decision = decide(objects, "10", "5", {"team": "blue"}, "veth")
    assert not decision.admitted
    details = decision.details("10", len(objects))
    assert "red: namespace not selected" in details
    assert "six: attachment not listed" in details
    assert "taps: allows tap, not veth" in details
    assert "broken" in details and "ignored" in details
    assert "other" not in details, "another VPC's bindings are not listed"
    assert "no VPCBinding names VPC 12" in decide(objects, "12", "1", {}, "veth").details(
        "12", 5)


def test_a_binding_names_its_ids_in_any_padding() -> None:
    assert decide([binding("b", "00a", ["001"], {}, ["veth"])], "a", "1", {}, "veth").admitted


@given(VPCS, ATTACHMENTS)
def test_the_annotation_round_trips(vpc: str, att: str) -> None:
    pod = {"metadata": {"annotations": {choice.ANNOTATION: f"{vpc}/{att}"}}}
    assert choice.from_annotation(pod, "ns/p") == (vpc, att)


@pytest.mark.parametrize("annotations", [{}, {choice.ANNOTATION: "12"},
                                         {choice.ANNOTATION: "1/2/3"},
                                         {choice.ANNOTATION: "/2"}, {choice.ANNOTATION: "1/"},
                                         {choice.ANNOTATION: "TFemW/c-7"},
                                         {choice.ANNOTATION: "TFe-W/7"},
                                         {choice.ANNOTATION: "1/zzzz"}])
def test_a_missing_or_malformed_annotation_is_code_7_naming_it(
        annotations: dict[str, str]) -> None:
    with pytest.raises(CniError) as refused:
        choice.from_annotation({"metadata": {"annotations": annotations}}, "ns/p")
    assert refused.value.code == INVALID_CONFIG and choice.ANNOTATION in refused.value.msg


@given(VPCS, ATTACHMENTS)
def test_a_host_link_name_gives_back_its_vpc_and_attachment(vpc: str, att: str) -> None:
    assert naming.parse_host_link_name(naming.host_link_name(vpc, att)) == (vpc, att)


def _invocation(tmp_path: Path, command: str, container: str = "c1",
                prev: dict[str, Any] | None = None) -> Invocation:
    conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": "tenants", "type": "vpc-attach",
                            "vpcFromPod": True, "attachment": "existing"}
    if prev is not None:
        conf["prevResult"] = prev
    environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": container, "CNI_IFNAME": "eth0",
               "CNI_NETNS": "/proc/self/ns/net", "CNI_PATH": "/nonexistent",
               "VPC_ATTACH_LOCK_DIR": str(tmp_path), "VPC_ATTACH_HOST_CONFIG": "/nonexistent"}
    return Invocation.parse(Request(environ, json.dumps(conf).encode()))


def test_del_reads_the_record_not_the_annotation(tmp_path: Path) -> None:
    from cni_plugin.tenancy import resolve_recorded
    add = _invocation(tmp_path, "ADD")
    chosen = type(add)(**{**add.__dict__, "conf": add.conf.choosing("Z9", "3")})
    choice.write_record(chosen)
    found = resolve_recorded(_invocation(tmp_path, "DEL"))
    assert found is not None and (found.conf.vpc, found.conf.vpcattachment) == ("Z9", "3")
    assert choice.records_of(str(tmp_path), "tenants") == [("c1", "eth0", "Z9", "3")]
    choice.remove_record(chosen)
    assert resolve_recorded(_invocation(tmp_path, "DEL")) is None, "nothing recorded: nothing made"
    # Without a record (a node that lost /run), our host link in prevResult says it.
    prev = {"cniVersion": "1.1.0", "interfaces": [{"name": naming.host_link_name("Z9", "3")}]}
    found = resolve_recorded(_invocation(tmp_path, "DEL", prev=prev))
    assert found is not None and (found.conf.vpc, found.conf.vpcattachment) == ("Z9", "3")


def test_vpc_and_vpcfrompod_exclude_each_other() -> None:
    from netconf.config import parse_netconf
    base = {"cniVersion": "1.1.0", "name": "n", "type": "vpc-attach", "attachment": "existing"}
    with pytest.raises(CniError, match="vpc"):
        parse_netconf({**base, "vpcFromPod": True, "vpc": "1"})
    with pytest.raises(CniError, match="missing config key 'vpcattachment'"):
        parse_netconf({**base, "vpc": "1"})
    assert parse_netconf({**base, "vpcFromPod": True}).vpc == ""


@pytest.mark.parametrize(("environ", "mode"), [
    ({}, "off"), ({"VPC_ATTACH_KUBECONFIG": "/k"}, "enforce"),
    ({"VPC_ATTACH_KUBECONFIG": "/k", "VPC_ATTACH_TENANCY": "audit"}, "audit"),
    ({"VPC_ATTACH_TENANCY": "enforce"}, "off")])
def test_tenancy_is_enforced_wherever_the_node_has_a_kubeconfig(environ: dict[str, str],
                                                                mode: str) -> None:
    host = resolve_host_settings({}, {"VPC_ATTACH_HOST_CONFIG": "/nonexistent", **environ})
    assert host.tenancy_mode == mode


def test_an_unknown_tenancy_mode_is_code_7() -> None:
    with pytest.raises(CniError) as refused:
        resolve_host_settings({}, {"VPC_ATTACH_HOST_CONFIG": "/nonexistent",
                                   "VPC_ATTACH_TENANCY": "lenient"})
    assert refused.value.code == INVALID_CONFIG and "tenancy" in refused.value.msg
