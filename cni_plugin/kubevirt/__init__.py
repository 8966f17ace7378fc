"""KubeVirt's room (SPEC §16): persistent IPs (`allowPersistentIPs`: the IPAMClaim a VM's Pod
names keeps its addresses) and live migrations (a claim's second Pod announced once KubeVirt
marks it ready). The verbs reach it through one step object, `KubeVirt` (`kubevirt_steps`, or
ADD's `api_read_pod_claim`), as they reach publishing through `Publisher`: its no-op form is what
every verb does without the feature, so the recipes carry no `if` for it, and the room's
modules are imported only when a network allows persistent IPs (an ADD in a fresh process pays
nothing for them otherwise).

The room: `step` (the step object's no-op form), `steps` (its forms that act: `PersistentIps`,
`ClaimedPod`), `selection` (which IPAMClaim the Pod's network-selection element names; pure),
`holders` (which living Pods hold a claim, a migration's source; pure), `claim` (the claim as
read and the status an allocation leaves on it; pure), `api` (reading the claim, writing its
status), `release` (freeing the records of claims that are gone), `migration` (a migration
target's on-node record and its cut-over), `claim_watch` and `cutovers` (the agent's watch of
IPAMClaims, and its cut-overs on the Pod watch), `doctor` (`vpc-attach doctor`'s checks of
claims, lends and targets). What stays outside: vpc-attach-ipam keeps the records a claim owns
and lends a claim's address across nodes (`ipam/plugin/`: `store`, `claimed`, `lending`), under
its pools' locks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from cni_plugin.kubevirt.step import KubeVirt, MigrationTargets

if TYPE_CHECKING:
    from cni_plugin.core.request import Invocation
    from cni_plugin.kube.session import VerbCluster

__all__ = ["KubeVirt", "MigrationTargets", "api_read_pod_claim", "kubevirt_steps"]


def kubevirt_steps(inv: Invocation, cluster: VerbCluster) -> KubeVirt:
    """DEL's, CHECK's, STATUS's and GC's KubeVirt steps for the network (the no-op form
    without `allowPersistentIPs`)."""
    if not inv.conf.allow_persistent_ips:
        return KubeVirt()
    from cni_plugin.kubevirt.steps import PersistentIps
    return PersistentIps(inv, cluster)


def api_read_pod_claim(inv: Invocation, cluster: VerbCluster,
                       targets: MigrationTargets | None) -> KubeVirt:
    """ADD's KubeVirt steps, read before IPAM: the IPAMClaim the Pod names for this interface
    and the claim's other living Pods (a live migration's source; a third Pod is code 102);
    the no-op form without `allowPersistentIPs`."""
    if not inv.conf.allow_persistent_ips:
        return KubeVirt()
    from cni_plugin.kubevirt import steps
    return steps.api_read_pod_claim(inv, cluster, targets)
