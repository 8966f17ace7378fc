"""KubeVirt's steps in the verbs (SPEC §16, `allowPersistentIPs`), behind the room's step object
(`kubevirt.KubeVirt`): `PersistentIps` for a network that allows persistent IPs, `ClaimedPod`
for an ADD whose Pod names an IPAMClaim.

ADD: the IPAMClaim the Pod's network-selection element names for this attachment is read before
IPAM (`api_read_pod_claim`), vpc-attach-ipam keeps its addresses in records the claim owns, and
the claim's status is written after (`api_record_allocation`, or `api_record_failure`). GC frees
the records of claims that are gone; STATUS checks the permissions ADD uses. Every step goes
through the verb's one cluster session; the Pod comes from the agent's Pod cache when there is
one.

A live migration (KubeVirt's source and target Pods of one claim): the claim's other living
Pods are listed with the claim; a second one makes this Pod the target, published but not
announced and recorded (`kubevirt.migration`) until KubeVirt's ready timestamp (the agent's Pod
watch cuts it over; without an agent, STATUS); a third is refused, code 102.

The plugin is not told its NetworkAttachmentDefinition, so the element is the one whose
interface is CNI_IFNAME (asked for, or Multus's `net<position + 1>`), and the claim's
`spec.network` must be this config's `name`. Why: docs/architecture.md ("IPAMClaims").
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation
from cni_plugin.core.rollback import Rollback
from cni_plugin.ipam import delegate
from cni_plugin.ipam.plugin.config import DEFAULT_LOCK_TIMEOUT_SECONDS, node_data_root
from cni_plugin.ipam.plugin.store import AddressTaken, ClaimOwner
from cni_plugin.kube.client import ApiError, KubeClient, api_failure
from cni_plugin.kube.kinds import IPAMCLAIMS, PODS
from cni_plugin.kube.session import VerbCluster
from cni_plugin.kubevirt import migration, release
from cni_plugin.kubevirt.api import api_read_ipamclaim, api_write_ipamclaim_status
from cni_plugin.kubevirt.claim import Allocated, AllocationFailed, FailureReason, IPAMClaim
from cni_plugin.kubevirt.holders import (
    COMPLETED_PHASES,
    MAX_HOLDERS,
    VM_NAME_LABEL,
    Holder,
    holders,
    migration_source,
)
from cni_plugin.kubevirt.migration import MigrationSource, target_ready
from cni_plugin.kubevirt.selection import find_claim_reference
from cni_plugin.kubevirt.step import KubeVirt, MigrationTargets
from cni_plugin.publish.endpointslice import FAMILY_SUFFIX, slice_name
from cni_plugin.publish.publisher import Unannounced
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
    """The IPAMClaim this attachment's Pod names, as read; the Pod's name (its owner); the
    identity vpc-attach-ipam records (by uid: a claim made again is another one); and, when
    the Pod is a live migration's target, the source it takes the claim over from and
    whether KubeVirt marked it ready already."""

    claim: IPAMClaim
    pod: str
    owner: ClaimOwner
    migrating_from: MigrationSource | None = None
    ready: bool = False


def api_read_pod_claim(inv: Invocation, cluster: VerbCluster,
                       targets: MigrationTargets | None) -> PersistentIps:
    """ADD's steps: `ClaimedPod` with the claim the Pod names for this interface, else
    `PersistentIps` (whose ADD steps are the no-op form's)."""
    pod_claim = api_pod_claim(inv, cluster)
    if pod_claim is None:
        return PersistentIps(inv, cluster)
    return ClaimedPod(inv, cluster, pod_claim, targets)


def api_pod_claim(inv: Invocation, cluster: VerbCluster) -> PodClaim | None:
    """The claim the Pod names for this interface (code 7 when it is for another network, 11
    when it does not exist yet or is being deleted); None without a claim reference (then ADD
    is what it always was)."""
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
    source = _migration_source(api_claim_holders(session.client(), pod, claim, inv.deadline),
                               pod, claim)
    return PodClaim(claim, name, ClaimOwner(claim.namespace, claim.name, claim.uid), source,
                    target_ready(pod))


def api_claim_holders(client: KubeClient, pod: dict[str, Any], claim: IPAMClaim,
                      deadline: Deadline) -> list[Holder]:
    """The other living Pods naming the claim: one LIST of the Pod's namespace, narrowed to
    the VM's virt-launcher Pods by KubeVirt's label when the Pod carries it."""
    meta = pod["metadata"]
    vm = (meta.get("labels") or {}).get(VM_NAME_LABEL)
    try:
        pods = client.list(PODS, namespace=claim.namespace, deadline=deadline,
                           labels=f"{VM_NAME_LABEL}={vm}" if vm else None,
                           fields=",".join(f"status.phase!={p}" for p in COMPLETED_PHASES))
    except ApiError as exc:
        raise api_failure(exc, f"list the Pods holding IPAMClaim {claim}") from None
    return holders(pods, claim.name, but=str(meta.get("uid") or ""))


def _migration_source(others: list[Holder], pod: dict[str, Any],
                      claim: IPAMClaim) -> MigrationSource | None:
    """The source when this Pod is a live migration's target; code 102 when two other Pods
    hold the claim already (a migration's source and target)."""
    if len(others) >= MAX_HOLDERS:
        meta = pod["metadata"]
        raise CniError(IPAM_EXHAUSTED, f"IPAMClaim {claim} is held by {len(others)} Pods "
                       f"already ({'; '.join(str(h) for h in others)}): Pod "
                       f"{meta.get('namespace')}/{meta.get('name')} cannot be a third",
                       "a live migration moves a VM between two Pods of its claim, a source "
                       "and a target; this Pod gets the claim's addresses once one of them "
                       "is gone")
    source = migration_source(others, pod, claim.owner_pod)
    if source is None:
        return None
    return MigrationSource(source.namespace, source.name, source.node)


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


def api_cut_over_now(inv: Invocation, cluster: VerbCluster) -> None:
    """ADD of a migration target KubeVirt marked ready before it: its announcement is taken
    over at once. Best effort: a failure leaves the record, which the agent or STATUS finish."""
    lock_dir = inv.host.lock_dir
    path = migration.record_path(lock_dir, inv.env.container_id, inv.env.ifname)
    try:
        with open(path, encoding="utf-8") as handle:
            pending = migration.PendingTarget.from_json(handle.read())
        migration.api_cut_over(cluster.session().client(), pending, inv.deadline)
    except (OSError, ValueError, ApiError, CniError) as exc:
        log.warning("migration target %s: cut-over left to the agent or STATUS: %s",
                    inv.env.container_id, getattr(exc, "msg", exc))
        return
    migration.remove_pending(lock_dir, inv.env.container_id, inv.env.ifname)


def api_cut_over_ready_targets(inv: Invocation, cluster: VerbCluster) -> None:
    """STATUS: cut over this network's migration targets on this node whose Pods KubeVirt
    marked ready (one GET per pending target; none on a node without one). Best effort:
    STATUS answers whether ADD would work, and a failed cut-over is tried again next time."""
    lock_dir = inv.host.lock_dir
    if not migration.pending_targets(lock_dir):
        return
    try:
        client = cluster.session().client()
        migration.api_complete_ready(
            client, lock_dir, inv.deadline,
            lambda namespace, name: client.get(PODS, name, namespace=namespace,
                                               deadline=inv.deadline),
            network=inv.conf.name)
    except (ApiError, CniError) as exc:
        log.warning("STATUS: migration cut-over failed, tried again next time: %s",
                    getattr(exc, "msg", exc))


def forget_pending_targets_except(inv: Invocation, valid: set[tuple[str, str]]) -> None:
    """GC: drop this network's pending migration targets of containers no longer valid."""
    for pending in migration.pending_targets(inv.host.lock_dir):
        if pending.network == inv.conf.name and \
                (pending.container_id, pending.ifname) not in valid:
            migration.remove_pending(inv.host.lock_dir, pending.container_id, pending.ifname)


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
    root = node_data_root(inv.node)
    return release.api_free_gone_claims(cluster.session().client(), root,
                                        lock_timeout=DEFAULT_LOCK_TIMEOUT_SECONDS,
                                        deadline=inv.deadline)


def api_check_claim_access(inv: Invocation, cluster: VerbCluster) -> None:
    """STATUS with `allowPersistentIPs`: code 50 unless the plugin's identity may read
    IPAMClaims, list them (a cluster block's claim keeps their addresses), update their
    status and list Pods (what ADD does), or without a kubeconfig."""
    try:
        client = cluster.session().client()
        for verb, subresource in (("get", ""), ("list", ""), ("update", "status")):
            api_review_access(client, IPAMCLAIMS.group, IPAMCLAIMS.plural, verb,
                              subresource=subresource, deadline=inv.deadline)
        # the Pods naming a claim (a live migration's other Pod)
        api_review_access(client, "", "pods", "list", deadline=inv.deadline)
    except ApiError as exc:
        raise CniError(STATUS_NOT_AVAILABLE, api_failure(exc, "check IPAMClaim access").msg,
                       exc.message) from None
    except CniError as exc:
        if exc.code == STATUS_NOT_AVAILABLE:
            raise
        raise CniError(STATUS_NOT_AVAILABLE, f"allowPersistentIPs: {exc.msg}",
                       exc.details) from None


def record_target(inv: Invocation, source: MigrationSource, held: Unannounced,
                  rollback: Rollback, targets: MigrationTargets | None) -> None:
    """A live migration's target: what publishing held back recorded on this node (removed by
    a rollback) for its cut-over, and the agent told of it."""
    conf, lock_dir = inv.conf, inv.host.lock_dir
    pending = migration.PendingTarget(
        network=conf.name, container_id=inv.env.container_id, ifname=inv.env.ifname,
        pod_namespace=inv.pod.namespace or "", pod_name=inv.pod.name or "",
        pod_uid=held.pod_uid, node=held.node, bgp_namespace=held.namespace,
        advertisement=held.advertisement, annotations=held.annotations, spec=dict(held.spec),
        owner_references=held.owner_references, created_by=inv.created_by, slices=held.slices,
        source=source,
        source_advertisement=naming.advertisement_name(conf.vpc, conf.vpcattachment,
                                                       source.node),
        source_slices=[slice_name(source.name, conf.vpc, conf.vpcattachment, family)
                       for family in FAMILY_SUFFIX] if conf.publish.endpoint_slice else [])
    rollback.created(f"pending migration target {inv.env.container_id}",
                     lambda _d: migration.remove_pending(lock_dir, inv.env.container_id,
                                                         inv.env.ifname))
    migration.write_pending(lock_dir, pending)
    if targets is not None and inv.host.kubeconfig:
        targets.expect_migration_targets(inv.host.kubeconfig, held.node, lock_dir)


class PersistentIps(KubeVirt):
    """The steps of a network that allows persistent IPs; ADD's are the no-op form's (this
    Pod names no claim for the interface)."""

    def __init__(self, inv: Invocation, cluster: VerbCluster) -> None:
        self.inv = inv
        self.cluster = cluster

    def forget_target(self) -> None:
        """DEL: the container's pending migration target, if any, is forgotten."""
        inv = self.inv
        migration.remove_pending(inv.host.lock_dir, inv.env.container_id, inv.env.ifname)

    def announced(self) -> bool:
        """CHECK: not while this container is a migration target KubeVirt has not marked
        ready (its advertisement lacks it on purpose)."""
        inv = self.inv
        return not os.path.exists(migration.record_path(inv.host.lock_dir,
                                                        inv.env.container_id, inv.env.ifname))

    def api_status(self) -> None:
        """STATUS: the claims' permissions checked, ready targets cut over."""
        api_check_claim_access(self.inv, self.cluster)
        # The runtime polls STATUS: without an agent, this announces migration targets
        # KubeVirt marked ready since (docs/architecture.md, "Live migration").
        api_cut_over_ready_targets(self.inv, self.cluster)

    def api_free_gone_claims(self) -> None:
        """GC: the records of claims that no longer exist, freed."""
        api_free_gone_claims(self.inv, self.cluster)

    def forget_targets_except(self, valid: set[tuple[str, str]]) -> None:
        """GC: pending targets of containers no longer valid, dropped."""
        forget_pending_targets_except(self.inv, valid)


class ClaimedPod(PersistentIps):
    """ADD of a Pod that names an IPAMClaim for this interface."""

    def __init__(self, inv: Invocation, cluster: VerbCluster, pod_claim: PodClaim,
                 targets: MigrationTargets | None) -> None:
        super().__init__(inv, cluster)
        self.pod_claim = pod_claim
        self.targets = targets

    def start_ipam_add(self, ipam: delegate.IpamBackend, inv: Invocation) -> delegate.PendingAdd:
        """vpc-attach-ipam's ADD with the claim's records and addresses."""
        return start_claimed_add(inv, ipam, self.pod_claim)

    def api_record_failure(self, pending: delegate.PendingAdd) -> None:
        """The claim's failed condition, when the allocation failed."""
        if not pending.failed:
            return
        try:
            pending.result()
        except CniError as failure:
            api_record_failure(self.cluster, self.pod_claim, failure, self.inv.deadline)

    @property
    def announces(self) -> bool:
        """Not a live migration's target until KubeVirt marks it ready."""
        return self.pod_claim.migrating_from is None

    def record_target(self, unannounced: Unannounced | None, rollback: Rollback) -> None:
        """A migration target's record (none when nothing was published)."""
        source = self.pod_claim.migrating_from
        if unannounced is not None and source is not None:
            record_target(self.inv, source, unannounced, rollback, self.targets)

    def api_record_allocation(self, allocated: Result) -> None:
        """The claim's status; a target marked ready already is cut over now."""
        api_record_allocation(self.cluster, self.pod_claim, allocated, self.inv.deadline)
        if self.pod_claim.migrating_from is not None and self.pod_claim.ready:
            api_cut_over_now(self.inv, self.cluster)  # marked ready already
