"""Whether the cluster's BGPVRFInstance CRD took the VPC's route target: galactic's own CRD
accepts at most 9 digits on each side of the colon, the CRDs vpc-attach ships accept 10
(SPEC §8), and a VPC's route target takes the low 32 bits of its id (up to 10 digits). A 422
whose causes name the route-target fields is the CRD's answer, told as code 7 naming its
limit: to the dry run ADD sends first for a wide route target (`instance.ask_crd_first`,
nothing made yet), or to the instance's own write (the CRD replaced since; the rollback
undoes what the ADD made)."""

from __future__ import annotations

from cni_plugin.kube.client import ApiError
from netconf.errors import INVALID_CONFIG, CniError

GALACTIC_DIGITS = 9  # galactic's BGPVRFInstance CRD: '[0-9]{1,9}:[0-9]{1,9}'
UNPROCESSABLE = 422  # validation refused the object (an admission policy's denial too)
ROUTE_TARGET_FIELDS = ("spec.importRouteTargets", "spec.exportRouteTargets")


def fits_galactic_crd(target: str) -> bool:
    """Whether an "ASN:NN" route target has at most 9 digits on each side."""
    asn, _, number = target.partition(":")
    return len(asn) <= GALACTIC_DIGITS and len(number) <= GALACTIC_DIGITS


def refuses_route_target(exc: ApiError) -> bool:
    """Whether a refused write of the instance was the CRD refusing its route targets: a 422
    whose causes name those fields (an admission policy's 422 names none)."""
    return exc.status == UNPROCESSABLE and any(
        field.startswith(ROUTE_TARGET_FIELDS) for field in exc.fields)


def does_not_fit(vpc: str, target: str, exc: ApiError) -> CniError:
    """Code 7 naming `vpc`, its route target and, for galactic's CRD, the limit."""
    said = f"the API server said: {exc.message}"
    if fits_galactic_crd(target):
        return CniError(INVALID_CONFIG, f"invalid vpc {vpc!r}: this cluster's BGPVRFInstance "
                        f"CRD refuses its route target {target}", said)
    return CniError(
        INVALID_CONFIG,
        f"invalid vpc {vpc!r}: its route target {target} does not fit this cluster's "
        f"BGPVRFInstance CRD, which accepts at most {GALACTIC_DIGITS} digits on each side of "
        f"the colon (galactic's CRD)",
        f"install vpc-attach's CRDs (packaging/crds: up to 10 digits a side), or use a VPC "
        f"whose low 32 bits are below 10^9 with an ASN below 10^9; {said}")
