"""KubeVirt's persistent IPs in ADD (SPEC §16, `allowPersistentIPs`): the IPAMClaim the Pod's
network-selection element names for this attachment is read before IPAM (`api_read_pod_claim`),
vpc-attach-ipam keeps its addresses in records the claim owns, and the claim's status is written
after (`api_record_allocation`, or `api_record_failure`). GC frees the records of claims that
are gone (`api_free_gone_claims`); STATUS checks the permissions ADD uses
(`api_check_claim_access`). Every step goes through the verb's one
cluster session; the Pod comes from the agent's Pod cache when there is one.

The plugin is not told its NetworkAttachmentDefinition, so the element is the one whose
interface is CNI_IFNAME (asked for, or Multus's `net<position + 1>`), and the claim's
`spec.network` must be this config's `name`. Why: docs/architecture.md ("IPAMClaims").
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation
from cni_plugin.ipam import delegate
from cni_plugin.ipam.ipamclaims import release
from cni_plugin.ipam.ipamclaims.api import (
    IPAMCLAIMS,
    api_read_ipamclaim,
    api_write_ipamclaim_status,
)
from cni_plugin.ipam.ipamclaims.claim import Allocated, AllocationFailed, FailureReason, IPAMClaim
from cni_plugin.ipam.ipamclaims.selection import find_claim_reference
from cni_plugin.ipam.plugin.config import DEFAULT_LOCK_TIMEOUT_SECONDS, node_data_root
from cni_plugin.ipam.plugin.store import AddressTaken, ClaimOwner
from cni_plugin.kube.client import ApiError, api_failure
from cni_plugin.publish.resources import PODS
from cni_plugin.publish.source import VerbCluster
from cni_plugin.publish.status import api_review_access
from netconf.config import OWN_IPAM
from netconf.errors import (
    INVALID_CONFIG,
    IPAM_EXHAUSTED,
    STATUS_NOT_AVAILABLE,
    TRY_AGAIN_LATER,
    CniError,
)
from netconf.result import Result

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodClaim:
    """The IPAMClaim this attachment's Pod names, as read; the Pod's name (its owner); and
    the identity vpc-attach-ipam records (by uid: a claim made again is another one)."""

    claim: IPAMClaim
    pod: str
    owner: ClaimOwner


def api_read_pod_claim(inv: Invocation, cluster: VerbCluster) -> PodClaim | None:
    """With `allowPersistentIPs`, the claim the Pod names for this interface (code 7 when it is
    for another network, 11 when it does not exist yet or is being deleted); None without
    the setting or without a claim reference (then ADD is what it always was)."""
    if not inv.conf.allow_persistent_ips:
        return None
    namespace, name = inv.pod.namespace, inv.pod.name
    if not namespace or not name:
        raise CniError(INVALID_CONFIG, "allowPersistentIPs needs the Pod: K8S_POD_NAMESPACE "
                       "and K8S_POD_NAME are not in CNI_ARGS")
    session = cluster.session()
    try:
        pod = session.pod(inv.host.node_name, namespace, name) if inv.host.node_name else None
        if pod is None or (inv.pod.uid and inv.pod.uid != pod["metadata"].get("uid")):
            pod = session.client().get(PODS, name, namespace=namespace, deadline=inv.deadline)
            if pod is not None:
                session.remember_pod(pod)  # the EndpointSlice's owner: not read again
    except ApiError as exc:
        raise api_failure(exc, "read the Pod for its IPAMClaim") from None
    if pod is None:
        raise CniError(TRY_AGAIN_LATER, f"Pod {namespace}/{name} not found",
                       "allowPersistentIPs reads its network-selection annotation")
    reference = find_claim_reference(pod, network=None, interface=inv.env.ifname)
    if reference is None:
        return None
    claim = api_read_ipamclaim(session.client(), reference, network=inv.conf.name,
                               deadline=inv.deadline)
    if claim.deleting:
        raise CniError(TRY_AGAIN_LATER, f"IPAMClaim {claim} is being deleted",
                       "its addresses are freed once it is gone")
    return PodClaim(claim, name, ClaimOwner(claim.namespace, claim.name, claim.uid))


def start_claimed_add(inv: Invocation, ipam: delegate.IpamBackend,
                      pod_claim: PodClaim) -> delegate.PendingAdd:
    """vpc-attach-ipam's ADD with the claim (in-process only: the claim is an argument, never
    a config key), its `status.ips` requested exactly."""
    if not isinstance(ipam, delegate.InProcessIpam):
        raise CniError(INVALID_CONFIG, "invalid config key 'allowPersistentIPs'",
                       f"IPAM {ipam.plugin_type!r} is run as an executable; an IPAMClaim's "
                       f"addresses are kept by {OWN_IPAM} in-process")
    return ipam.start_claimed_add(inv.stdin, inv.deadline, pod_claim.owner, pod_claim.claim.ips)


def api_record_allocation(cluster: VerbCluster, pod_claim: PodClaim, allocated: Result,
                          deadline: Deadline) -> IPAMClaim:
    """The claim's status after a successful ADD: its addresses, this Pod, IPsAllocated
    True. A claim holding other addresses (another writer was first) is code 11
    (ClaimHoldsOtherAddresses): the ADD rolls back what it made."""
    ips = tuple(str(ip.address) for ip in allocated.ips)
    return api_write_ipamclaim_status(cluster.session().client(), pod_claim.claim,
                                      Allocated(ips), pod=pod_claim.pod, deadline=deadline)


def api_record_failure(cluster: VerbCluster, pod_claim: PodClaim, failure: CniError,
                       deadline: Deadline) -> None:
    """The failed condition for a claim that holds no addresses (one that does is left as it
    is); best effort: the ADD's own error is the answer."""
    if pod_claim.claim.ips:
        return
    reason: FailureReason = "InternalError"
    if isinstance(failure.__cause__, AddressTaken):
        reason = "IPAddressConflict"
    elif failure.code == IPAM_EXHAUSTED:
        reason = "SubnetExhausted"
    try:
        api_write_ipamclaim_status(cluster.session().client(), pod_claim.claim,
                                   AllocationFailed(reason, failure.msg), pod=pod_claim.pod,
                                   deadline=deadline)
    except CniError as exc:
        log.warning("cannot record the failed allocation in IPAMClaim %s: %s",
                    pod_claim.claim, exc.msg)


def api_free_gone_claims(inv: Invocation, cluster: VerbCluster) -> list[str]:
    """GC with `allowPersistentIPs`: free this node's records of IPAMClaims that no longer
    exist (a GET of each claim the node holds; never one that exists or cannot be read). The
    agent's watch does it as soon as a claim goes; this covers nodes without an agent."""
    root = node_data_root({**os.environ, **inv.node_env})
    return release.api_free_gone_claims(cluster.session().client(), root,
                                        lock_timeout=DEFAULT_LOCK_TIMEOUT_SECONDS,
                                        deadline=inv.deadline)


def api_check_claim_access(inv: Invocation, cluster: VerbCluster) -> None:
    """STATUS with `allowPersistentIPs`: code 50 unless the plugin's identity may read
    IPAMClaims and update their status (what ADD does), or without a kubeconfig."""
    try:
        client = cluster.session().client()
        for verb, subresource in (("get", ""), ("update", "status")):
            api_review_access(client, IPAMCLAIMS.group, IPAMCLAIMS.plural, verb,
                              subresource=subresource, deadline=inv.deadline)
    except ApiError as exc:
        raise CniError(STATUS_NOT_AVAILABLE, api_failure(exc, "check IPAMClaim access").msg,
                       exc.message) from None
    except CniError as exc:
        if exc.code == STATUS_NOT_AVAILABLE:
            raise
        raise CniError(STATUS_NOT_AVAILABLE, f"allowPersistentIPs: {exc.msg}",
                       exc.details) from None
