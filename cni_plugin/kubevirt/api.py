"""Reading an IPAMClaim and writing its status through the API server, with the plugin's own
client inside the verb's deadline.

The status goes through the `/status` subresource (the ClusterRole grants `ipamclaims/status`
update, not `ipamclaims` update: the plugin can change nothing else of a claim), with the
resourceVersion it was read at: a conflicting writer costs a re-read, and addresses another
writer recorded first are never overwritten.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, KubeClient, api_failure, update_with_retry
from cni_plugin.kube.kinds import IPAMCLAIMS
from cni_plugin.kubevirt.claim import (
    Allocation,
    IPAMClaim,
    IPsAlreadySet,
    MalformedClaim,
    status_after,
)
from cni_plugin.kubevirt.selection import ClaimReference
from netconf.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError

STATUS = "status"


class ClaimHoldsOtherAddresses(CniError):
    """Code 11: another writer recorded other addresses in the claim first. The ADD gives its
    own back (its rollback); the next try gets the claim's."""

    def __init__(self, claim: IPAMClaim, offered: tuple[str, ...]) -> None:
        super().__init__(TRY_AGAIN_LATER, f"IPAMClaim {claim} already holds "
                         f"{', '.join(claim.ips)}, recorded by another writer first; not "
                         f"overwritten with {', '.join(offered)}",
                         f"ownerPod {claim.owner_pod or 'unset'}")
        self.claim = claim


def api_read_ipamclaim(client: KubeClient, reference: ClaimReference, *, network: str,
                       deadline: Deadline) -> IPAMClaim:
    """GET the claim a Pod's network-selection element names; it must be for this network
    (its `spec.network` the network config's `name`: code 7 naming both otherwise). A claim
    not (yet) there is code 11: kubevirt's ipam-extensions creates it with the VM."""
    try:
        obj = client.get(IPAMCLAIMS, reference.name, namespace=reference.namespace,
                         deadline=deadline)
    except ApiError as exc:
        raise api_failure(exc, "read the Pod's IPAMClaim") from None
    if obj is None:
        raise CniError(TRY_AGAIN_LATER, f"IPAMClaim {reference} not found",
                       "the Pod's network-selection element names it; kubevirt's "
                       "ipam-extensions creates it with the VM (is it running, and the "
                       "IPAMClaim CRD installed?)")
    claim = _claim(obj, str(reference))
    if claim.network != network:
        raise CniError(INVALID_CONFIG, f"IPAMClaim {reference} is for network "
                       f"{claim.network!r}, not this network config's {network!r}")
    return claim


def api_write_ipamclaim_status(client: KubeClient, claim: IPAMClaim, allocation: Allocation,
                               *, pod: str, deadline: Deadline) -> IPAMClaim:
    """PUT the claim's status after this ADD's allocation (`claim.status_after`) through
    `/status`, from the claim as read (its resourceVersion the precondition); on a conflict
    re-read and apply again, never over addresses recorded meanwhile
    (ClaimHoldsOtherAddresses). Nothing is written when nothing changes. The claim as stored
    after."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def record(current: dict[str, Any]) -> bool:
        fresh = _claim(current, str(claim))
        if fresh.uid != claim.uid:
            raise CniError(TRY_AGAIN_LATER, f"IPAMClaim {claim} was deleted and created again "
                           "since it was read", f"uid {claim.uid} → {fresh.uid}")
        try:
            status = status_after(fresh, allocation, pod=pod, now=now)
        except IPsAlreadySet as exc:
            raise ClaimHoldsOtherAddresses(fresh, exc.offered) from None
        if status == (current.get("status") or {}):
            return False
        current["status"] = status
        return True

    try:
        stored = update_with_retry(client, IPAMCLAIMS, claim.name, namespace=claim.namespace,
                                   deadline=deadline, mutate=record, read=claim.obj,
                                   subresource=STATUS)
    except ApiError as exc:
        raise api_failure(exc, "record the allocation in the IPAMClaim") from None
    if stored is None:
        raise CniError(TRY_AGAIN_LATER, f"IPAMClaim {claim} was deleted before its status "
                       "could be written")
    return _claim(stored, str(claim))


def _claim(obj: Mapping[str, Any], where: str) -> IPAMClaim:
    try:
        return IPAMClaim.from_object(obj)
    except MalformedClaim as exc:
        raise CniError(INVALID_CONFIG, f"IPAMClaim {where}: {exc}") from None
