"""Which IPAMClaim a Pod's network-selection elements name for an attachment (SPEC §16), without
a cluster: the annotation read as the Network Plumbing WG's client reads it, the element for
this attachment matched as Multus names interfaces and OVN-Kubernetes matches networks. The
same against the real API server: e2e/test_ipamclaims.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.kube.networks import (
    NETWORKS_ANNOTATION,
    NetworkName,
    NetworkSelection,
    SelectionError,
    parse_network_selections,
)
from cni_plugin.kubevirt.selection import ClaimReference, claim_name_for, find_claim_reference
from netconf.errors import INVALID_CONFIG, CniError

BLUE = NetworkName("vms", "blue")


def pod(annotation: str | None, namespace: str = "vms") -> dict[str, Any]:
    annotations = {} if annotation is None else {NETWORKS_ANNOTATION: annotation}
    return {"metadata": {"namespace": namespace, "name": "virt-launcher-vm-a-x7k2p",
                         "annotations": annotations}}


def reference(annotation: str | None, network: NetworkName | None = BLUE,
              interface: str = "net1") -> ClaimReference | None:
    return find_claim_reference(pod(annotation), network=network, interface=interface)


# The annotation ------------------------------------------------------------------------------

def test_the_element_kubevirts_webhook_wrote_names_the_claim_in_the_pods_namespace() -> None:
    # As ipam-extensions' webhook marshals the element: namespace filled in, interface the
    # hashed name virt-controller asked for.
    annotation = json.dumps([{"name": "blue", "namespace": "vms", "interface": "pod16367aacb67",
                              "ipam-claim-reference": "vm-a.blue"}])
    assert reference(annotation, interface="pod16367aacb67") == ClaimReference("vms", "vm-a.blue")


def test_an_element_without_a_namespace_selects_the_network_in_the_pods() -> None:
    annotation = '[{"name": "blue", "ipam-claim-reference": "vm-a.blue"}]'
    assert reference(annotation) == ClaimReference("vms", "vm-a.blue")
    assert reference(annotation, network=NetworkName("default", "blue")) is None


def test_the_short_form_selects_networks_but_names_no_claim() -> None:
    assert parse_network_selections(" blue@net1 , infra/red ", "vms") == (
        NetworkSelection(BLUE, "net1", None, 0),
        NetworkSelection(NetworkName("infra", "red"), None, None, 1))
    assert reference("blue@net1, infra/red") is None


def test_a_pod_without_the_annotation_names_no_claim() -> None:
    assert reference(None) is None
    assert reference("") is None
    assert reference("[]") is None


@pytest.mark.parametrize("value, why", [
    ("blue/red/green", "more than one '/'"),
    ("blue@a@b", "more than one '@'"),
    ("Blue", "not a lower-case DNS label"),
    ("vms/-blue", "not a lower-case DNS label"),
    ("blue,,red", "names no network"),
    ("[{\"name\": \"blue\"", "not JSON"),
    ('{"name": "blue"}', "a list"),
    ("[null]", "not an object"),
    ('[{"namespace": "vms"}]', "names no network"),
    ('[{"name": 7}]', "name is not a string"),
    ('[{"name": "blue", "ipam-claim-reference": "VM_A"}]', "not an object name"),
])
def test_a_malformed_annotation_is_code_7_naming_the_pod(value: str, why: str) -> None:
    with pytest.raises(CniError) as caught:
        reference(value)
    assert caught.value.code == INVALID_CONFIG
    assert "Pod vms/virt-launcher-vm-a-x7k2p" in caught.value.msg and why in caught.value.msg
    assert caught.value.details == value


def test_json_keys_match_regardless_of_case_and_null_is_empty_as_in_go() -> None:
    annotation = '[{"Name": "blue", "namespace": null, "IPAM-Claim-Reference": "vm-a.blue"}]'
    assert reference(annotation) == ClaimReference("vms", "vm-a.blue")


# Which element is this attachment's ----------------------------------------------------------

TWO_INTERFACES = json.dumps([
    {"name": "blue", "interface": "poda", "ipam-claim-reference": "vm-a.one"},
    {"name": "blue", "interface": "podb", "ipam-claim-reference": "vm-a.two"}])
TWO_UNNAMED = json.dumps([{"name": "blue", "ipam-claim-reference": "vm-a.one"},
                          {"name": "blue", "ipam-claim-reference": "vm-a.two"}])


def test_two_elements_of_one_network_are_told_apart_by_the_interface_they_ask_for() -> None:
    assert reference(TWO_INTERFACES, interface="poda") == ClaimReference("vms", "vm-a.one")
    assert reference(TWO_INTERFACES, interface="podb") == ClaimReference("vms", "vm-a.two")


def test_elements_asking_for_no_interface_get_multus_default_names_by_position() -> None:
    assert reference(TWO_UNNAMED, interface="net1") == ClaimReference("vms", "vm-a.one")
    assert reference(TWO_UNNAMED, interface="net2") == ClaimReference("vms", "vm-a.two")


def test_elements_that_cannot_be_told_apart_and_name_different_claims_are_code_7() -> None:
    with pytest.raises(CniError) as caught:
        reference(TWO_UNNAMED, interface="eth1")
    assert caught.value.code == INVALID_CONFIG
    assert "2 elements select vms/blue for interface eth1" in caught.value.msg
    assert "'vm-a.one', 'vm-a.two'" in caught.value.msg


def test_one_claim_and_one_element_without_are_ambiguous_too() -> None:
    annotation = '[{"name": "blue"}, {"name": "blue", "ipam-claim-reference": "vm-a.blue"}]'
    with pytest.raises(CniError, match=re.escape("none, 'vm-a.blue'")):
        reference(annotation, interface="eth1")


def test_the_only_element_of_the_network_decides_whatever_the_interface_is_called() -> None:
    # As in OVN-Kubernetes, which matches on the network alone: a runtime other than Multus
    # may name the interface as it likes.
    annotation = '[{"name": "red"}, {"name": "blue", "ipam-claim-reference": "vm-a.blue"}]'
    assert reference(annotation, interface="eth1") == ClaimReference("vms", "vm-a.blue")


def test_an_element_asking_for_another_interface_is_not_this_attachment() -> None:
    annotation = '[{"name": "blue", "interface": "podb", "ipam-claim-reference": "vm-a.blue"}]'
    assert reference(annotation, interface="poda") is None


# The plugin is not told its NetworkAttachmentDefinition (network None): the interface alone
# decides, and the claim's spec.network is checked instead (cni_plugin/kubevirt/steps.py).


def test_without_the_network_the_element_whose_interface_is_this_one_names_the_claim() -> None:
    annotation = ('[{"name": "red", "ipam-claim-reference": "vm-a.red"}, '
                  '{"name": "blue", "interface": "pod1", "ipam-claim-reference": "vm-a.blue"}]')
    assert reference(annotation, None, "net1") == ClaimReference("vms", "vm-a.red")
    assert reference(annotation, None, "pod1") == ClaimReference("vms", "vm-a.blue")
    assert reference(annotation, None, "net2") is None, "pod1 is element 2's own name"


def test_without_the_network_an_interface_of_no_element_names_no_claim() -> None:
    # A runtime other than Multus naming the interface as it likes: nothing to match on.
    annotation = '[{"name": "blue", "ipam-claim-reference": "vm-a.blue"}]'
    assert reference(annotation, None, "eth1") is None


def test_without_the_network_two_elements_asking_for_one_interface_are_code_7() -> None:
    annotation = ('[{"name": "red", "interface": "eth1", "ipam-claim-reference": "vm-a.red"}, '
                  '{"name": "blue", "interface": "eth1", "ipam-claim-reference": "vm-a.blue"}]')
    with pytest.raises(CniError) as caught:
        reference(annotation, None, "eth1")
    assert caught.value.code == INVALID_CONFIG
    assert "2 elements ask for interface eth1 and name different IPAMClaims" in caught.value.msg


LABELS = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?", fullmatch=True)
CLAIMS = st.one_of(st.none(), st.from_regex(r"[a-z0-9]{1,5}(\.[a-z0-9]{1,5}){0,2}",
                                            fullmatch=True))


@st.composite
def elements(draw: st.DrawFn) -> dict[str, Any]:
    element: dict[str, Any] = {"name": draw(st.sampled_from(["blue", "red"]))}
    for key, values in (("namespace", st.sampled_from(["vms", "infra"])),
                        ("interface", LABELS), ("ipam-claim-reference", CLAIMS)):
        value = draw(st.one_of(st.none(), values))
        if value is not None:
            element[key] = value
    return element


@given(st.lists(elements(), max_size=6))
def test_json_elements_read_back_as_written_with_the_pods_namespace_filled_in(
        written: list[dict[str, Any]]) -> None:
    read = parse_network_selections(json.dumps(written), "vms")
    assert [(s.network, s.interface, s.claim) for s in read] == [
        (NetworkName(e.get("namespace", "vms"), e["name"]), e.get("interface"),
         e.get("ipam-claim-reference")) for e in written]


@given(st.lists(st.tuples(st.one_of(st.none(), LABELS), LABELS, st.one_of(st.none(), LABELS)),
                min_size=1, max_size=5))
def test_short_form_items_read_back_as_written(
        items: list[tuple[str | None, str, str | None]]) -> None:
    text = " , ".join(f"{ns + '/' if ns else ''}{name}{'@' + iface if iface else ''}"
                      for ns, name, iface in items)
    read = parse_network_selections(text, "vms")
    assert [(s.network, s.interface, s.claim) for s in read] == [
        (NetworkName(ns or "vms", name), iface, None) for ns, name, iface in items]


@given(st.lists(elements(), max_size=6), st.sampled_from(["net1", "net2", "net3", "eth1"]))
def test_a_claim_found_is_named_by_an_element_of_this_network(
        written: list[dict[str, Any]], interface: str) -> None:
    selections = parse_network_selections(json.dumps(written), "vms")
    try:
        found = claim_name_for(selections, BLUE, interface)
    except SelectionError:
        return
    if found is not None:
        assert any(s.claim == found and s.network == BLUE for s in selections)


@given(st.lists(elements(), max_size=6))
def test_every_element_asking_for_its_own_interface_gets_its_own_claim(
        written: list[dict[str, Any]]) -> None:
    for index, element in enumerate(written):  # distinct interfaces: nothing to tell apart
        element["interface"] = f"pod{index}"
    selections = parse_network_selections(json.dumps(written), "vms")
    for selection in selections:
        assert claim_name_for(selections, selection.network, f"pod{selection.position}") \
            == selection.claim
