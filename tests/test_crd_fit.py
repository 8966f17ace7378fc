"""Which route targets galactic's own BGPVRFInstance CRD accepts: its CEL rule, as shipped
in datum-cloud/network's config/crd, against the route targets vpc-attach computes; its
refusal of the instance's write told apart from an admission policy's; and the dry run ADD
sends first only for a wide route target (once per agent)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.kube.client import ApiError, Resource, _api_error
from cni_plugin.kube.session import ColdSession
from cni_plugin.publish.bgp import instance
from cni_plugin.publish.bgp.crd_fit import fits_galactic_crd, refuses_route_target
from cni_plugin.publish.context import PublishContext, Router
from netconf.base62 import encode_base62
from netconf.errors import INVALID_CONFIG, CniError

# network.datumapis.com_bgpvrfinstances.yaml (galactic's pinned datum-cloud/network).
GALACTIC_RULE = re.compile(
    r"^([0-9]{1,9}[.][0-9]{1,9}[.][0-9]{1,9}[.][0-9]{1,9}|[0-9]{1,9}):[0-9]{1,9}$")


@given(st.integers(min_value=1, max_value=2**32 - 1), st.integers(min_value=0,
                                                                  max_value=2**48 - 1))
def test_a_route_target_fits_exactly_when_galactics_rule_accepts_it(asn: int, vpc: int) -> None:
    target = naming.route_target(asn, encode_base62(vpc))
    assert fits_galactic_crd(target) == bool(GALACTIC_RULE.match(target))


def test_the_first_vpc_that_does_not_fit() -> None:
    assert fits_galactic_crd(naming.route_target(65000, encode_base62(999_999_999)))
    assert not fits_galactic_crd(naming.route_target(65000, encode_base62(1_000_000_000)))
    assert not fits_galactic_crd(naming.route_target(4_200_000_000, encode_base62(62)))


# A 422 as kube-apiserver words galactic's CEL rule refusing the route targets, and as it
# words a ValidatingAdmissionPolicy's denial (no causes).
CRD_REFUSAL = {
    "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
    "message": 'BGPVRFInstance.network.datumapis.com "3e-worker-1" is invalid: '
               "spec.importRouteTargets[0]: Invalid value: \"object\": ...",
    "details": {"causes": [
        {"reason": "FieldValueInvalid", "field": "spec.importRouteTargets[0]"},
        {"reason": "FieldValueInvalid", "field": "spec.exportRouteTargets[0]"}]}}
POLICY_DENIAL = {
    "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
    "message": "ValidatingAdmissionPolicy 'deny-vrf' with binding 'deny-vrf' denied request",
    "details": {"name": "3e-worker-1", "kind": "bgpvrfinstances"}}
PATH = "/apis/network.datumapis.com/v1alpha1/namespaces/galactic-system/bgpvrfinstances"


def refused(status: dict[str, object]) -> ApiError:
    return _api_error(422, json.dumps(status).encode(), "POST", PATH, None)


def test_only_a_422_naming_the_route_target_fields_is_the_crd_refusing_them() -> None:
    assert refused(CRD_REFUSAL).fields == ("spec.importRouteTargets[0]",
                                           "spec.exportRouteTargets[0]")
    assert refuses_route_target(refused(CRD_REFUSAL))
    assert not refuses_route_target(refused(POLICY_DENIAL))
    other_field = {**CRD_REFUSAL, "details": {"causes": [{"field": "spec.vrfID"}]}}
    assert not refuses_route_target(refused(other_field))
    assert _api_error(422, b"[1]", "POST", PATH, None).fields == ()
    assert _api_error(422, b"not json", "POST", PATH, None).fields == ()


@pytest.mark.parametrize(("status", "code"), [(CRD_REFUSAL, INVALID_CONFIG),
                                              (POLICY_DENIAL, None)])
def test_a_refused_instance_write_is_code_7_only_when_the_crd_refused_its_route_target(
        monkeypatch: pytest.MonkeyPatch, status: dict[str, object], code: int | None) -> None:
    """The CRD's refusal names the VPC, its route target and galactic's limit; an admission
    policy's denial stays the API's refusal (code 104 at the boundary)."""
    def settle(*_: object) -> int:
        raise refused(status)

    monkeypatch.setattr(instance, "_settle_instance", settle)
    vpc = encode_base62(4_000_000_062)
    ctx = cast(PublishContext, SimpleNamespace(inv=SimpleNamespace(conf=SimpleNamespace(vpc=vpc))))
    with pytest.raises((CniError, ApiError)) as caught:
        instance.ensure_vrf_instance(ctx, Router("r", 65000, None, None), cast(Rollback, None),
                                     Deadline(5))
    if code is None:
        assert isinstance(caught.value, ApiError)
        return
    assert isinstance(caught.value, CniError) and caught.value.code == code
    assert caught.value.msg == (
        f"invalid vpc {vpc!r}: its route target 65000:4000000062 does not fit this cluster's "
        "BGPVRFInstance CRD, which accepts at most 9 digits on each side of the colon "
        "(galactic's CRD)")
    assert "packaging/crds" in (caught.value.details or "")


# Asked before anything is made ----------------------------------------------------------------

WIDE, NARROW = encode_base62(4_000_000_062), encode_base62(999_000_062)


class DryRuns:
    """A client that records each create and answers it with `answer` (an ApiError raised)."""

    def __init__(self, answer: ApiError | None = None) -> None:
        self.answer = answer
        self.creates: list[tuple[dict[str, Any], bool]] = []

    def create(self, resource: Resource, body: dict[str, Any], *, namespace: str,
               deadline: Deadline, dry_run: bool = False) -> dict[str, Any]:
        self.creates.append((body, dry_run))
        if self.answer is not None:
            raise self.answer
        return body


def asking(vpc: str, client: DryRuns, session: ColdSession) -> PublishContext:
    inv = SimpleNamespace(conf=SimpleNamespace(vpc=vpc), namespace="galactic-system")
    ctx = cast(PublishContext, SimpleNamespace(inv=inv, client=client, session=session,
                                               namespace="galactic-system",
                                               instance_name=f"i-{vpc}"))
    return ctx


class Remembering(ColdSession):
    """A session that outlives its verb, as the agent's does."""

    def __init__(self) -> None:
        super().__init__("unused")
        self.fitting: set[str] = set()

    def route_target_fits(self, target: str) -> bool:
        return target in self.fitting

    def remember_route_target_fits(self, target: str) -> None:
        self.fitting.add(target)


ROUTER = Router("r", 65000, None, None)


def test_a_route_target_that_fits_galactics_crd_asks_nothing() -> None:
    client = DryRuns()
    instance.ask_crd_first(asking(NARROW, client, Remembering()), ROUTER, Deadline(5))
    assert client.creates == []


def test_a_wide_route_target_is_asked_once_by_a_dry_run_of_the_instance_as_add_makes_it(
) -> None:
    client, session = DryRuns(), Remembering()
    instance.ask_crd_first(asking(WIDE, client, session), ROUTER, Deadline(5))
    [(body, dry_run)] = client.creates
    assert dry_run and body["metadata"]["name"] == f"i-{WIDE}"
    assert body["spec"]["importRouteTargets"] == body["spec"]["exportRouteTargets"] == [
        {"value": "65000:4000000062"}]
    assert session.fitting == {"65000:4000000062"}
    instance.ask_crd_first(asking(WIDE, client, session), ROUTER, Deadline(5))
    assert len(client.creates) == 1, "remembered where the session outlives the verb"


def test_an_existing_instance_was_validated_before_its_409() -> None:
    client, session = DryRuns(_api_error(409, b"{}", "POST", PATH, None)), Remembering()
    instance.ask_crd_first(asking(WIDE, client, session), ROUTER, Deadline(5))
    assert session.fitting == {"65000:4000000062"}


def test_the_crds_refusal_is_code_7_before_anything_and_a_policys_denial_is_left_to_the_write(
) -> None:
    session = Remembering()
    with pytest.raises(CniError) as caught:
        instance.ask_crd_first(asking(WIDE, DryRuns(refused(CRD_REFUSAL)), session), ROUTER,
                               Deadline(5))
    assert caught.value.code == INVALID_CONFIG and "at most 9 digits" in caught.value.msg
    instance.ask_crd_first(asking(WIDE, DryRuns(refused(POLICY_DENIAL)), session), ROUTER,
                           Deadline(5))
    assert session.fitting == set(), "not known to fit: asked again next time"
