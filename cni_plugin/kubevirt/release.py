"""Freeing the addresses of IPAMClaims that are gone (SPEC §16): a claim's records on this node
are freed only once the claim no longer exists, never while it does — whatever its Pods and
containers, and never on a failed read.

Which claims the node holds comes from vpc-attach-ipam's notes under the node's ipamDataRoot
(`cni_plugin/ipam/plugin/claimed.py`); whether one still exists, from a GET of it by
namespace and name: absent, or present with another uid (deleted and made again), is gone.
The agent calls this when its watch of IPAMClaims (re)lists and frees a claim at once when the
watch says it was deleted; GC calls it on nodes without an agent.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from cni_plugin.core.deadline import Deadline
from cni_plugin.ipam.plugin.allocator import claim_owners, free_claim
from cni_plugin.ipam.plugin.kubeblocks import IPAM_BLOCKS
from cni_plugin.ipam.plugin.lending import Lend
from cni_plugin.kube.client import ApiError, KubeClient
from cni_plugin.kube.kinds import IPAMCLAIMS
from netconf.errors import CniError

log = logging.getLogger(__name__)
LEND_DELETE_SECONDS = 10.0  # one lend's DELETE when the caller gave no deadline


def api_free_gone_claims(client: KubeClient, data_root: str, *, lock_timeout: float,
                         deadline: Deadline, existing: Collection[str] = ()) -> list[str]:
    """Free the records of every claim this node holds that no longer exists; the records
    freed (`pool directory/address`). existing: uids known to exist (a fresh listing), not
    read again. A claim whose GET fails keeps its records; a pool that cannot be freed is
    logged and tried again next time."""
    freed: list[str] = []
    for uid, owner in claim_owners(data_root).items():
        if uid in existing:
            continue
        try:
            current = client.get(IPAMCLAIMS, owner.name, namespace=owner.namespace,
                                 deadline=deadline)
        except ApiError as exc:
            log.warning("IPAMClaim %s keeps its addresses: it cannot be read (%s)", owner, exc)
            continue
        if current is not None and (current.get("metadata") or {}).get("uid") == uid:
            continue
        freed.extend(free_deleted_claim(data_root, uid, lock_timeout=lock_timeout,
                                        name=str(owner), client=client, deadline=deadline))
    return freed


def free_deleted_claim(data_root: str, uid: str, *, lock_timeout: float, name: str = "",
                       client: KubeClient | None = None,
                       deadline: Deadline | None = None) -> list[str]:
    """Free the records of the claim with this uid (it is known to be gone) and delete the
    lends this node made for them (client: the API; without it GC deletes them); logged,
    never raised."""
    lends: list[Lend] = []
    try:
        freed = free_claim(data_root, uid, lock_timeout, lends)
    except CniError as exc:
        log.warning("cannot free the addresses of deleted IPAMClaim %s (uid %s): %s", name,
                    uid, exc.msg)
        return []
    if freed:
        log.info("freed the addresses of deleted IPAMClaim %s (uid %s): %s", name, uid,
                 ", ".join(freed))
    if client is not None:
        for lend in lends:
            try:
                if client.delete(IPAM_BLOCKS, lend.name, uid=lend.uid or None,
                                 deadline=deadline or Deadline(LEND_DELETE_SECONDS)):
                    log.info("deleted lend %s of deleted IPAMClaim %s", lend.name, name)
            except (ApiError, CniError) as exc:
                log.warning("cannot delete lend %s of deleted IPAMClaim %s (GC deletes it): %s",
                            lend.name, name, exc)
    return freed
