"""GC: remove our leftovers of attachments the runtime no longer knows about."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from cni_plugin.attachment.node import (
    forget_kept_table,
    host_netlink,
    release_unused_vpc,
    vpc_owners,
)
from cni_plugin.attachment.sid import collect_registrations
from cni_plugin.core import naming
from cni_plugin.core.request import Invocation
from cni_plugin.ipam import delegate
from cni_plugin.kernel import links
from cni_plugin.kernel.rtnl import Rtnl
from cni_plugin.kube.session import VerbCluster
from cni_plugin.kubevirt import kubevirt_steps
from cni_plugin.policy import records as policy_records
from cni_plugin.publish.collect import (
    collect_stale_advertisements,
    collect_stale_slices,
    collect_unused_instance,
    give_to_node,
)
from cni_plugin.tenancy import choice
from cni_plugin.verbs.collaborators import Collaborators
from netconf.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, CniError
from netconf.versions import GC_STATUS_MIN_VERSION, at_least

log = logging.getLogger(__name__)
VALID_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")


def valid_attachments(raw: dict[str, Any]) -> set[tuple[str, str]]:
    """(containerID, ifname) pairs the runtime still uses (code 6 if malformed)."""
    listed: Any = next((raw[k] for k in VALID_KEYS if k in raw), [])
    if not isinstance(listed, list):
        raise CniError(DECODE_FAILURE, f"{VALID_KEYS[0]} must be a list")
    pairs: set[tuple[str, str]] = set()
    for item in listed:
        if not isinstance(item, dict) or not isinstance(item.get("containerID"), str):
            raise CniError(DECODE_FAILURE, f"invalid {VALID_KEYS[0]} entry {item!r}")
        pairs.add((item["containerID"], str(item.get("ifname", ""))))
    return pairs


def gc(inv: Invocation, collaborators: Collaborators) -> None:
    """Delete this network's host link if its owner is not valid, its slices and advertised
    containers on this node that are not valid, the VPC's table or VRF and the BGPVRFInstance
    on this node if nothing uses them any more; forward GC to IPAM."""
    if not at_least(inv.conf.cni_version, GC_STATUS_MIN_VERSION):
        raise CniError(INCOMPATIBLE_VERSION, "config version does not allow GC")
    valid = valid_attachments(inv.raw)
    failures: list[CniError] = []
    with collaborators.verb_cluster(inv) as cluster:  # one API client for every attachment
        for chosen in _chosen_attachments(inv) if inv.conf.vpc_from_pod else [inv]:
            _collect(chosen, cluster, valid, failures)
        kubevirt = kubevirt_steps(inv, cluster)
        _best_effort(failures, kubevirt.api_free_gone_claims)  # of deleted IPAMClaims
        kubevirt.forget_targets_except(valid)
        try:
            _forward_ipam(inv, cluster)
        except CniError as exc:
            log.warning("GC: %s (%s)", exc.msg, exc.details)
            failures.append(exc)
    if failures:
        raise failures[0]
    if inv.conf.vpc_from_pod:
        choice.remove_records_except(inv.host.lock_dir, inv.conf.name, valid)
    policy_records.remove_except(inv.host.lock_dir, inv.conf.name, valid)


def _chosen_attachments(inv: Invocation) -> list[Invocation]:
    """vpcFromPod: one invocation per attachment recorded for this network on this node; the
    records of containers no longer valid are dropped once GC is done with them."""
    found = []
    for _cid, _ifname, vpc, att in choice.records_of(inv.host.lock_dir, inv.conf.name):
        chosen = dataclasses.replace(inv, conf=inv.conf.choosing(vpc, att))
        if chosen not in found:
            found.append(chosen)
    return found


def _collect(inv: Invocation, cluster: VerbCluster, valid: set[tuple[str, str]],
             failures: list[CniError]) -> None:
    with host_netlink(inv.deadline) as ipr:
        if inv.conf.attachment != "existing":
            _collect_links(ipr, inv, valid)
        # Read once the stale link is gone: the VPC's attachments here still use its instance.
        attached = vpc_owners(ipr, inv.conf.vpc)
    steps: list[Callable[[], None]] = [
        lambda: _collect_registrations(inv, valid),
        lambda: _release_vpc(inv),
        lambda: collect_stale_slices(inv, cluster, valid),
        lambda: collect_stale_advertisements(inv, cluster, valid),
        lambda: _collect_instance(inv, cluster, valid, attached),
        lambda: give_to_node(inv, cluster)]
    for step in steps:
        _best_effort(failures, step)


def _best_effort(failures: list[CniError], step: Callable[[], object]) -> None:
    try:
        step()
    except CniError as exc:
        log.warning("GC: %s (%s)", exc.msg, exc.details)
        failures.append(exc)


def _collect_links(ipr: Rtnl, inv: Invocation, valid: set[tuple[str, str]]) -> None:
    link = links.find(ipr, naming.host_link_name(inv.conf.vpc, inv.conf.vpcattachment))
    owner = link.owner if link is not None else None
    if link is not None and owner is not None and (owner.container_id, owner.ifname) not in valid:
        log.info("GC: deleting %s of stale container %s", link.name, owner.container_id)
        links.delete(ipr, link)
    # A stopped agent's (a running one deletes its own within milliseconds).
    for retired in links.delete_all_retired(ipr):
        log.info("GC: deleted retired link %s (%s)", retired.name, retired.alias)


def _collect_registrations(inv: Invocation, valid: set[tuple[str, str]]) -> None:
    for collected in collect_registrations(inv.conf.name, valid, lock_dir=inv.host.lock_dir,
                                           node=inv.node, deadline=inv.deadline):
        log.info("GC: removed the rows of %s from galactic's datapath", collected)


def _collect_instance(inv: Invocation, cluster: VerbCluster,
                      valid: set[tuple[str, str]], attached: set[tuple[str, str]]) -> None:
    """The VPC's BGPVRFInstance if unused; once it is gone, the VPC's table id is free again."""
    gone = collect_unused_instance(inv, cluster, valid, attached)
    if gone and inv.conf.isolation == "vrf" and inv.conf.attachment != "existing" \
            and forget_kept_table(inv.conf.vpc, lock_dir=inv.host.lock_dir,
                                  deadline=inv.deadline):
        log.info("GC: VPC %s keeps no table id any more (its BGPVRFInstance is gone)",
                 inv.conf.vpc)


def _release_vpc(inv: Invocation) -> None:
    if inv.conf.attachment != "existing":
        table = release_unused_vpc(inv.conf.vpc, inv.conf.isolation,
                                   lock_dir=inv.host.lock_dir, node=inv.node,
                                   deadline=inv.deadline)
        if table is not None:
            log.info("GC: removed table %d of VPC %s (no attachment left)", table, inv.conf.vpc)


def _forward_ipam(inv: Invocation, cluster: VerbCluster) -> None:
    ipam = delegate.of(inv, cluster)
    if ipam is not None:
        ipam.run("GC", inv.stdin, inv.deadline)
