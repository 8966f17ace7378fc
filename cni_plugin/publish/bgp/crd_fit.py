"""Whether the cluster's BGPVRFInstance CRD can hold the VPC's route target, asked before
anything is made: galactic's own CRD accepts at most 9 digits on each side of the colon, the
CRDs vpc-attach ships accept 10 (SPEC §8), and a VPC's route target takes the low 32 bits of
its id (up to 10 digits). Only a route target wider than 9 digits is asked about, and only
until the VPC's instance exists on the node: a server-side dry run of its create, so the
cluster's own CRD answers, whichever it is."""

from __future__ import annotations

from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, Target
from cni_plugin.publish.context import PublishContext, Router
from cni_plugin.publish.resources import GROUP, VERSION, VRF_INSTANCES
from netconf.errors import INVALID_CONFIG, CniError

GALACTIC_DIGITS = 9  # galactic's BGPVRFInstance CRD: '[0-9]{1,9}:[0-9]{1,9}'
UNPROCESSABLE = 422  # the CRD's validation refused the object
CONFLICT = 409


def fits_galactic_crd(target: str) -> bool:
    """Whether an "ASN:NN" route target has at most 9 digits on each side."""
    asn, _, number = target.partition(":")
    return len(asn) <= GALACTIC_DIGITS and len(number) <= GALACTIC_DIGITS


def _dry_run_body(ctx: PublishContext, router: Router, target: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BGPVRFInstance",
            "metadata": {"name": ctx.instance_name, "namespace": ctx.namespace},
            "spec": {"routerRef": {"name": router.name}, "vrfID": 1,
                     "importRouteTargets": [{"value": target}],
                     "exportRouteTargets": [{"value": target}]}}


def _instance_exists(ctx: PublishContext, router: Router, deadline: Deadline) -> bool:
    """The VPC's instance on this node exists (the cluster took its route target): from the
    agent's synced cache, else one GET."""
    cached = ctx.session.instances(ctx.namespace, router.name)
    if cached is not None:
        return any(i["metadata"]["name"] == ctx.instance_name for i in cached)
    return ctx.client.get(VRF_INSTANCES, ctx.instance_name, namespace=ctx.namespace,
                          deadline=deadline) is not None


def api_check_route_target_fits(ctx: PublishContext, router: Router,
                                deadline: Deadline) -> None:
    """Code 7 naming `vpc` and the CRD's limit when the cluster's BGPVRFInstance CRD refuses
    the VPC's route target (a dry run: nothing is written)."""
    target = naming.route_target(router.local_asn, ctx.inv.conf.vpc)
    if fits_galactic_crd(target) or _instance_exists(ctx, router, deadline):
        return
    try:
        ctx.client.request("POST", Target(VRF_INSTANCES, ctx.namespace), deadline,
                           body=_dry_run_body(ctx, router, target), query={"dryRun": "All"})
    except ApiError as exc:
        if exc.status == CONFLICT:
            return  # made meanwhile: the cluster holds it
        if exc.status != UNPROCESSABLE:
            raise
        raise CniError(
            INVALID_CONFIG,
            f"invalid vpc {ctx.inv.conf.vpc!r}: its route target {target} does not fit this "
            f"cluster's BGPVRFInstance CRD, which accepts at most {GALACTIC_DIGITS} digits on "
            f"each side of the colon (galactic's CRD)",
            f"install vpc-attach's CRDs (packaging/crds: up to 10 digits a side), or use a "
            f"VPC whose low 32 bits are below 10^9 with an ASN below 10^9; the API server "
            f"said: {exc.message}") from None
