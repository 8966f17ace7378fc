"""ADD as a recipe, like the reference ptp plugin's cmdAdd. Each step says where it leaves the
process: `api_` reads or writes the API server (the verb's one session), `_thread` runs beside
the rest, `start_ipam_add` runs the delegate as a child process meanwhile (vpc-attach-ipam: at
once, in this process), and `kernel` (the netlink sockets of `open_links`) and `answer_sid`
(the kernel's End.DT46, galactic's eBPF maps) write the kernel. Every write is recorded for the
created-only rollback as it happens.
"""

from __future__ import annotations

from cni_plugin.attachment import sid
from cni_plugin.attachment.create import Created, open_links
from cni_plugin.attachment.node import lock_attachment
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.request import Invocation
from cni_plugin.core.rollback import Rollback
from cni_plugin.ipam import delegate
from cni_plugin.kube.session import VerbCluster
from cni_plugin.kubevirt import KubeVirt, api_read_pod_claim
from cni_plugin.policy import NO_POLICY, PolicyStep, api_read_policies
from cni_plugin.publish.boundary import api_boundary
from cni_plugin.publish.publisher import Publication, Publisher
from cni_plugin.tenancy import admit, choice
from cni_plugin.verbs.collaborators import Collaborators
from cni_plugin.verbs.facts import attachment_of, link_options_of, policy_facts_of
from netconf.errors import INVALID_CONFIG, CniError
from netconf.result import Result


def add(parsed: Invocation, collaborators: Collaborators) -> Result:
    """Attach the container and answer its result (in the 1.1.0 shape)."""
    # One cluster session (API client) for the whole ADD: tenancy, publishing, rollback.
    with collaborators.verb_cluster(parsed) as cluster:
        # Before any change, read from the API server: whether a VPCBinding admits it (and
        # which attachment a Pod chose).
        admitted = admit(parsed, cluster, collaborators.tenancy_denied)
        return _add(admitted, cluster, collaborators)


def _add(inv: Invocation, cluster: VerbCluster, collaborators: Collaborators) -> Result:
    """ADD once tenancy admitted it (and resolved a Pod's chosen attachment)."""
    prev = inv.conf.prev()
    # One ADD or DEL of this container at a time; settings, API and router are checked before
    # any change (SPEC §4); the session outlives the rollback, if any.
    with inv.container_lock(), \
            Rollback(inv.final_deadline, on_finish=collaborators.rollback_finished) as rollback:
        publisher = Publisher.api_find_router(inv, cluster)
        # Before any change: the Pod's network and its namespace's policies (SPEC §17).
        policies = _api_read_policies(inv, cluster, collaborators)
        # allowPersistentIPs: the IPAMClaim the Pod names for this interface, if any.
        kubevirt = api_read_pod_claim(inv, cluster, collaborators.migration_targets)
        if inv.conf.vpc_from_pod:  # what DEL and CHECK read instead of the annotation
            rollback.created("record of the Pod's chosen attachment",
                             lambda _deadline: choice.remove_record(inv))
            choice.write_record(inv)
        if inv.conf.attachment == "existing":  # publish what an earlier plugin created
            result = _previous(prev)
            with publisher.api_settle_instance_thread(rollback) as publication:
                publication.api_publish(Addressing.from_result(result))
            return result
        attachment = attachment_of(inv)  # what the kernel steps read of the request
        lock_dir = inv.host.lock_dir
        with lock_attachment(attachment.vpc, attachment.vpcattachment, lock_dir=lock_dir,
                             deadline=inv.deadline), \
                open_links(attachment, link_options_of(inv), lock_dir=lock_dir,
                           node=inv.node, deadline=inv.deadline) as kernel:
            ipam = start_ipam_add(inv, cluster, rollback, kubevirt)
            kubevirt.api_record_failure(ipam)  # the claim's, before the IPAM's error ends ADD
            # The VRF exists before galactic-router can read the VPC's instance: it resolves
            # the VPC's table through it once (SPEC §15).
            vpc_table = kernel.ensure_vpc_table(keeps_table=publisher.publishes_instance)
            mtu = kernel.mtu(encapsulated=publisher.announces_sids and
                             sid.galactic_datapath(inv.node))
            with publisher.api_settle_instance_thread(rollback) as publication:
                created = kernel.create(rollback, vpc_table, mtu)
                allocated = ipam.result()  # waits for the delegate
                addressing = Addressing.from_result(allocated)
                # The policies selecting it are in place before it has an address.
                policies.kernel_install(policy_facts_of(inv, created, addressing), rollback,
                                        inv.deadline)
                result = chain(prev, created.configure(addressing))
                answer_sid(inv, attachment, publication, created, addressing, rollback)
                # A live migration's target is held back, announced once KubeVirt marks it ready.
                unannounced = publication.api_publish(addressing, announce=kubevirt.announces)
                kubevirt.record_target(unannounced, rollback)
            # Last: a claim holding other addresses rolls all of it back.
            kubevirt.api_record_allocation(allocated)
    return result


def _api_read_policies(inv: Invocation, cluster: VerbCluster,
                       collaborators: Collaborators) -> PolicyStep:
    """The policy step: the Pod and its namespace's policies read (nothing without a
    kubeconfig, or for `existing`, whose interface an earlier plugin made)."""
    if not inv.host.kubeconfig or inv.conf.attachment == "existing":
        return NO_POLICY
    with api_boundary("read the Pod's policies"):
        return api_read_policies(
            collaborators.policy, cluster.session(), inv.host.node_name or "",
            lock_dir=inv.host.lock_dir, namespace=inv.pod.namespace, name=inv.pod.name,
            ifname=inv.env.ifname, network_policy=inv.node.policy.network_policy,
            multi_network_policy=inv.node.policy.multi_network_policy, deadline=inv.deadline)


def answer_sid(inv: Invocation, attachment: AttachmentRef, publication: Publication,
               created: Created, addressing: Addressing, rollback: Rollback) -> None:
    """Before the attachment is announced, the node answers the VPC's SID, where it has one
    (VRF isolation, a router with a locator and node ID)."""
    settled = publication.settled()
    if settled is None or settled.sid is None or inv.conf.isolation != "vrf":
        return
    assert settled.locator is not None and settled.node_id is not None  # they made the SID
    sid.answer_sid(attachment, created.host_link, created.vpc_table.table,
                   sid.VpcSid(settled.sid, settled.locator, settled.node_id, settled.vrf_id),
                   addressing, rollback, lock_dir=inv.host.lock_dir, node=inv.node,
                   deadline=inv.deadline)


def start_ipam_add(inv: Invocation, cluster: VerbCluster, rollback: Rollback,
                   kubevirt: KubeVirt) -> delegate.PendingAdd:
    """The delegated ADD, started (a child process running while the rest is made;
    vpc-attach-ipam in-process on the verb's session, with the Pod's IPAMClaim if any), with
    its release recorded for rollback."""
    ipam = delegate.of(inv, cluster)
    if ipam is None:
        return delegate.FinishedAdd(Result())  # a tap without ipam is L2 only
    pending = kubevirt.start_ipam_add(ipam, inv)

    def release(deadline: Deadline) -> None:
        pending.settle(deadline)
        if pending.failed:  # an ADD it refused allocated nothing
            return
        if pending.undo is not None:  # in-process: exactly what it did, nothing more
            pending.undo(deadline)
        else:
            ipam.run("DEL", inv.stdin, deadline)

    rollback.created(f"IPAM allocation ({ipam.plugin_type})", release)
    return pending


def _previous(prev: Result | None) -> Result:
    if prev is None:
        raise CniError(INVALID_CONFIG, "missing config key 'prevResult'",
                       "attachment 'existing' publishes what an earlier plugin created")
    return prev


def chain(prev: Result | None, ours: Result) -> Result:
    """Append our interfaces, ips and routes to prevResult's (a later plugin in a chain)."""
    if prev is None:
        return ours
    merged = prev.copy_deep()
    offset = len(merged.interfaces)
    merged.interfaces.extend(ours.interfaces)
    for ip in ours.ips:
        moved = ip.model_copy()
        if moved.interface is not None:
            moved.interface += offset
        merged.ips.append(moved)
    merged.routes.extend(ours.routes)
    return merged
