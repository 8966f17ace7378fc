"""DEL: release IPAM first, withdraw what was published, remove our own links. Idempotent."""

from __future__ import annotations

import logging
from collections.abc import Callable

from cni_plugin import policy
from cni_plugin.attachment.detach import detach
from cni_plugin.attachment.node import lock_attachment, release_unused_vpc
from cni_plugin.attachment.sid import unregister_datapath
from cni_plugin.core.request import Invocation
from cni_plugin.ipam import delegate
from cni_plugin.kube.session import VerbCluster
from cni_plugin.kubevirt import kubevirt_steps
from cni_plugin.publish.withdraw import unpublish
from cni_plugin.tenancy import choice, resolve_recorded
from cni_plugin.verbs.collaborators import Collaborators
from cni_plugin.verbs.facts import attachment_of
from netconf.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, INVALID_CONFIG, CniError

log = logging.getLogger(__name__)
UNUSABLE_CONFIG = (INCOMPATIBLE_VERSION, DECODE_FAILURE, INVALID_CONFIG)


def forgives_unusable_config(exc: CniError) -> bool:
    """Whether DEL answers success, changing nothing, though its config did not parse."""
    if exc.code not in UNUSABLE_CONFIG:
        return False
    # An ADD with this config failed before changing anything, so there is nothing to
    # undo; failing would leave the runtime's sandbox stuck. GC collects any leftovers
    # of a config that was valid once.
    log.warning("DEL with an unusable config succeeds without changes: %s (%s)",
                exc.msg, exc.details)
    return True


def delete(inv: Invocation, collaborators: Collaborators) -> None:
    """Undo ADD for this container; every step runs, the first failure is reported."""
    with inv.container_lock():  # never interleaved with an ADD of the same container
        chosen = resolve_recorded(inv)  # vpcFromPod: what ADD recorded, never the annotation
        if chosen is None:
            with collaborators.verb_cluster(inv) as cluster:
                _release_unrecorded(inv, cluster)
            return
        with collaborators.verb_cluster(chosen) as cluster:  # one API client for DEL
            _undo_add(chosen, cluster, collaborators)
        if chosen.conf.vpc_from_pod:
            choice.remove_record(chosen)  # only once everything above succeeded


def _release_unrecorded(inv: Invocation, cluster: VerbCluster) -> None:
    """A vpcFromPod DEL with no record: ADD made no link or object (it records first), but an
    IPAM allocation keyed by the container may be left by a node that lost /run: release it."""
    log.info("DEL: no recorded attachment for %s/%s; releasing IPAM only",
             inv.env.container_id, inv.env.ifname)
    ipam = delegate.of(inv, cluster)
    if ipam is not None:
        ipam.run("DEL", inv.stdin, inv.deadline)


def _undo_add(inv: Invocation, cluster: VerbCluster, collaborators: Collaborators) -> None:
    failures: list[CniError] = []
    ipam = delegate.of(inv, cluster)
    if ipam is not None:
        _best_effort(failures, "release IPAM", lambda: ipam.run("DEL", inv.stdin, inv.deadline))
    _best_effort(failures, "withdraw published objects",
                 lambda: unpublish(inv, cluster))
    kubevirt_steps(inv, cluster).forget_target()  # a migration target that never cut over
    if inv.conf.attachment != "existing":
        attachment = attachment_of(inv)  # what the kernel steps read of the request
        lock_dir, node, deadline = inv.host.lock_dir, inv.node, inv.deadline

        def remove_links() -> None:
            with lock_attachment(attachment.vpc, attachment.vpcattachment, lock_dir=lock_dir,
                                 deadline=deadline):
                # galactic's rows first, then the links
                unregister_datapath(attachment.owner, lock_dir=lock_dir, node=node,
                                    deadline=deadline)
                detach(attachment, deadline=deadline,
                       delete_later=collaborators.delete_retired_later)
                # Its rules went with its link (a tap's filters) or go with its netns.
                policy.forget(collaborators.policy, lock_dir, attachment.container_id,
                                   attachment.ifname)
            # The VPC's table/VRF if this was its last link.
            release_unused_vpc(attachment.vpc, inv.conf.isolation, lock_dir=lock_dir,
                               node=node, deadline=deadline)
        _best_effort(failures, "remove links", remove_links)
    if failures:
        raise failures[0]


def _best_effort(failures: list[CniError], step: str, call: Callable[[], None]) -> None:
    try:
        call()
    except CniError as exc:
        log.warning("DEL: could not %s: %s (%s)", step, exc.msg, exc.details)
        failures.append(exc)
