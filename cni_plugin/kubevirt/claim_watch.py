"""The agent frees the addresses of deleted IPAMClaims (SPEC §16): a watch of every IPAMClaim;
a claim the watch sees deleted has its records on this node freed at once (by uid), and every
(re)listing — the agent's start, a broken watch — frees the records of claims the node holds
that no longer exist (`release.api_free_gone_claims`: those not listed are read once more, so a
claim created after the listing is never taken for gone). Without the CRD nothing is freed."""

from __future__ import annotations

import logging
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.ipam.plugin.config import DEFAULT_LOCK_TIMEOUT_SECONDS
from cni_plugin.kube.client import ApiObserver, KubeClient
from cni_plugin.kube.config import KubeCredentials
from cni_plugin.kube.kinds import IPAMCLAIMS
from cni_plugin.kube.watch import WatchCache
from cni_plugin.kubevirt.release import api_free_gone_claims, free_deleted_claim

log = logging.getLogger(__name__)
RECONCILE_SECONDS = 60.0  # the reads after a listing, one GET per claim not listed


class DeletedClaimReleaser:
    """The watch of IPAMClaims and what it frees on this node under data_root."""

    def __init__(self, creds: KubeCredentials, data_root: str,
                 observe: ApiObserver | None = None) -> None:
        self._creds = creds
        self._observe = observe
        self.data_root = data_root
        self._watch = WatchCache(creds, IPAMCLAIMS, "", observe, absent_ok=True,
                                 on_listed=self._listed, on_deleted=self._deleted)

    def start(self) -> DeletedClaimReleaser:
        """Start watching (a thread of its own)."""
        self._watch.start()
        return self

    def stop(self) -> None:
        """End the watch."""
        self._watch.stop()

    def _listed(self, claims: list[dict[str, Any]]) -> None:
        existing = {str((c.get("metadata") or {}).get("uid")) for c in claims}
        client = KubeClient(self._creds, self._observe)
        try:
            api_free_gone_claims(client, self.data_root,
                                 lock_timeout=DEFAULT_LOCK_TIMEOUT_SECONDS,
                                 deadline=Deadline(RECONCILE_SECONDS), existing=existing)
        finally:
            client.close()

    def _deleted(self, claim: dict[str, Any]) -> None:
        meta = claim.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            return
        client = KubeClient(self._creds, self._observe)  # the lends this node made go too
        try:
            free_deleted_claim(self.data_root, uid, lock_timeout=DEFAULT_LOCK_TIMEOUT_SECONDS,
                               name=f"{meta.get('namespace')}/{meta.get('name')}",
                               client=client, deadline=Deadline(RECONCILE_SECONDS))
        finally:
            client.close()
