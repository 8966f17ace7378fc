"""CHECK: compare everything ADD is responsible for against prevResult, naming each difference."""

from __future__ import annotations

from cni_plugin.attachment.check import attachment_differences
from cni_plugin.attachment.sid import VpcSid, sid_differences
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.request import Invocation
from cni_plugin.ipam import delegate
from cni_plugin.kubevirt import kubevirt_steps
from cni_plugin.publish.check import published_differences, published_sid
from cni_plugin.tenancy import resolve_recorded
from cni_plugin.verbs.collaborators import Collaborators
from cni_plugin.verbs.facts import attachment_of
from netconf.errors import (
    CHECK_MISMATCH,
    INCOMPATIBLE_VERSION,
    INVALID_CONFIG,
    UNKNOWN_CONTAINER,
    CniError,
)
from netconf.versions import CHECK_MIN_VERSION, at_least


def check(inv: Invocation, collaborators: Collaborators) -> None:
    """Raise CHECK_MISMATCH listing every difference; return quietly when all is well."""
    if not at_least(inv.conf.cni_version, CHECK_MIN_VERSION):
        raise CniError(INCOMPATIBLE_VERSION, "config version does not allow CHECK",
                       f"cniVersion {inv.conf.cni_version} < {CHECK_MIN_VERSION}")
    prev = inv.conf.prev()
    if prev is None:
        raise CniError(INVALID_CONFIG, "missing config key 'prevResult'", "CHECK needs it")
    chosen = resolve_recorded(inv)  # vpcFromPod: what ADD recorded, never the annotation
    if chosen is None:
        raise CniError(UNKNOWN_CONTAINER, f"no attachment recorded for container "
                       f"{inv.env.container_id!r} on {inv.env.ifname}")
    inv = chosen
    addressing = Addressing.from_result(prev)
    attachment = attachment_of(inv)  # what the kernel steps read of the request
    diffs: list[str] = []
    if inv.conf.attachment != "existing":
        diffs.extend(attachment_differences(attachment, prev, addressing,
                                            mode=inv.conf.isolation, mtu=inv.conf.mtu,
                                            deadline=inv.deadline))
    with collaborators.verb_cluster(inv) as cluster:  # one API client for CHECK
        announced = kubevirt_steps(inv, cluster).announced()  # a migration target is not yet
        diffs.extend(published_differences(inv, cluster, addressing, announced))
        if inv.conf.attachment != "existing" and inv.conf.isolation == "vrf":
            settled = published_sid(inv, cluster)
            if settled is not None and settled.sid and settled.locator and settled.node_id:
                diffs.extend(sid_differences(attachment, VpcSid(
                    settled.sid, settled.locator, settled.node_id, settled.vrf_id), addressing,
                    node=inv.node, deadline=inv.deadline))
        if diffs:
            raise CniError(CHECK_MISMATCH, f"CHECK found {len(diffs)} difference(s): "
                           f"{diffs[0]}", "; ".join(diffs))
        ipam = delegate.of(inv, cluster)
        if ipam is not None:
            ipam.run("CHECK", inv.stdin, inv.deadline)
