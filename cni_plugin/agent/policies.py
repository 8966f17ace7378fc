"""The agent keeps every attachment's policy current (SPEC §17).

It lists and watches MultiNetworkPolicies, NetworkPolicies (where the node enforces them),
Pods, namespaces and vpc-attach's EndpointSlices. Any change marks the node dirty; one thread
waits a moment for more (a burst is one pass, not one per event), then recompiles every
attachment of the node (its records, written by ADD) and writes what changed: a peer coming or
going refills sets, a policy change rewrites the attachment's table, each attachment in one
transaction; an attachment whose compiled policy did not change is not written at all.
ADDs through the agent read the same caches and write through the same `Enforcer`, so the
pass after them has nothing left to do. A restarted agent finds the rules in place and
replaces each table once, whole; every RESYNC_SECONDS it does so again, which also puts back
what a Pod with NET_ADMIN may have flushed: after a pass's changes are written, one table at
a time, giving way to any change that comes meanwhile (a change never waits for the repairs).

What a pass could not enforce is reported: a Warning Event `PolicyNotEnforced` on each policy
selecting the attachment (once per agent and cause), the gauges, and a status file for
`vpc-attach doctor`; policies with parts that match nothing get a Warning `PolicyInvalid`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.kube.client import ApiError, ApiObserver, KubeClient, Resource, Target
from cni_plugin.kube.config import KubeCredentials
from cni_plugin.kube.events import EVENTS, object_event_body
from cni_plugin.kube.kinds import NAMESPACES, PODS
from cni_plugin.kube.session import ClusterSession
from cni_plugin.kube.watch import WatchCache
from cni_plugin.policy import records
from cni_plugin.policy.compile import Endpoint, World
from cni_plugin.policy.enforce import Enforcer
from cni_plugin.policy.model import MULTI, NETWORK_POLICY, Policy, parse_policy
from cni_plugin.policy.services import PolicyServices
from cni_plugin.policy.source import (
    MULTI_POLICIES,
    NETWORK_POLICIES,
    OUR_SLICES,
    ApiPolicyView,
    PolicyView,
)
from cni_plugin.policy.sync import SyncResult, repair, sync
from cni_plugin.policy.world import build_world
from cni_plugin.publish.resources import ENDPOINT_SLICES
from netconf.formats import NewerFormat

log = logging.getLogger(__name__)
COALESCE_SECONDS = 0.02  # after a change, wait this long for the rest of its burst
RESYNC_SECONDS = 60.0  # every table rewritten whole (repairs what was changed behind us)
SYNC_DEADLINE_SECONDS = 30.0
NOT_ENFORCED, INVALID = "PolicyNotEnforced", "PolicyInvalid"
API_VERSIONS = {MULTI: "k8s.cni.cncf.io/v1beta1", NETWORK_POLICY: "networking.k8s.io/v1"}


class PolicyKeeper:
    """Watches, the coalescing sync thread, and what it reports."""

    def __init__(self, creds: KubeCredentials, lock_dir: str, node: str, *,
                 network_policy: bool, observe: ApiObserver | None = None,
                 synced: Callable[[int, int, float | None], None] | None = None) -> None:
        self.lock_dir = lock_dir
        self.node = node
        self.network_policy = network_policy
        self.enforcer = Enforcer()  # shared with ADDs through the agent (it locks itself)
        self._creds, self._observe, self._synced = creds, observe, synced
        self._changed = threading.Condition()
        self._pending_since: float | None = None
        self._stop = threading.Event()
        # A fresh enforcer writes every table whole on the first pass: repairs start after.
        self._last_full = time.monotonic()
        self._unrepaired: set[str] = set()  # attachments due a whole rewrite
        self._reported: set[tuple[str, str, str]] = set()
        self._refusal = ""  # the newer release's file the last pass stopped at, if any
        self.multi = self._watch(MULTI_POLICIES, absent_ok=True)
        self.plain = self._watch(NETWORK_POLICIES) if network_policy else None
        self.pods = self._watch(PODS)
        self.namespaces = self._watch(NAMESPACES)
        self.slices = self._watch(ENDPOINT_SLICES, labels=OUR_SLICES)
        self._thread = threading.Thread(target=self._run, name="policy sync", daemon=True)

    def services(self) -> PolicyServices:
        """What the agent's verbs lend the policy step: these caches (the verb's API client
        while they are not in sync), this enforcer, and this keeper to tell."""
        return PolicyServices(view=self._view, enforcer=self.enforcer, changed=self.changed)

    def _view(self, session: ClusterSession, node: str) -> PolicyView:
        return WarmPolicyView(self, ApiPolicyView(session, node))

    def _watch(self, resource: Resource, *, absent_ok: bool = False,
               labels: str | None = None) -> WatchCache:
        """Every object of a kind, each change heard."""
        return WatchCache(self._creds, resource, "", self._observe, absent_ok, labels=labels,
                          on_listed=self._heard, on_changed=self._heard,
                          on_deleted=self._heard)

    def start(self) -> PolicyKeeper:
        """Start the watches and the sync thread."""
        for watch in self._watches():
            watch.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watches and the thread."""
        self._stop.set()
        for watch in self._watches():
            watch.stop()
        with self._changed:
            self._changed.notify_all()

    def changed(self) -> None:
        """Something the rules depend on changed (an ADD or DEL says so too)."""
        with self._changed:
            if self._pending_since is None:
                self._pending_since = time.monotonic()
            self._changed.notify_all()

    def synced_caches(self) -> bool:
        """Whether every watch is in sync (an ADD may then answer from them)."""
        return all(watch.items() is not None for watch in self._watches())

    def world(self, policies: list[Policy], local: list[Endpoint]) -> World | None:
        """The world from the caches (None: not in sync)."""
        pods, namespaces = self.pods.items(), self.namespaces.items()
        slices = self.slices.items()
        if pods is None or namespaces is None or slices is None:
            return None
        return build_world(policies, pods, namespaces, slices, local, self.network_policy)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Pod from the cache."""
        return self.pods.get(namespace, name)

    def _watches(self) -> list[WatchCache]:
        return [w for w in (self.multi, self.plain, self.pods, self.namespaces, self.slices)
                if w is not None]

    def _heard(self, _what: Any) -> None:
        self.changed()

    def _all_policies(self) -> list[Policy] | None:
        multi = self.multi.items()
        plain = self.plain.items() if self.plain is not None else []
        if multi is None or plain is None:
            return None
        return [*(parse_policy(o, MULTI) for o in multi),
                *(parse_policy(o, NETWORK_POLICY) for o in plain)]

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._changed:
                self._changed.wait_for(lambda: self._pending_since is not None or
                                       self._stop.is_set(), timeout=RESYNC_SECONDS)
            if self._stop.is_set():
                return
            self._stop.wait(COALESCE_SECONDS)
            with self._changed:
                since, self._pending_since = self._pending_since, None
            try:
                self.sync_once(since)
                self._refusal = ""
            except NewerFormat as exc:
                # A newer release's record: no pass acts without it, the rules stay as they
                # are, and the next change or resync tries again (no retry every second).
                self._refused(exc)
            except Exception:  # a bug must not end the keeper: the next change retries
                log.exception("policy sync failed")
                self.changed()
                self._stop.wait(1.0)

    def sync_once(self, since: float | None) -> SyncResult | None:
        """One pass over the node's attachments (None: the caches are not in sync yet)."""
        policies = self._all_policies()
        attachments = list(records.read_all(self.lock_dir))
        world = self.world(policies or [], [a.endpoint() for a in attachments]) \
            if policies is not None else None
        if world is None:
            with self._changed:  # try again once the watches have listed
                self._pending_since = self._pending_since or since or time.monotonic()
            self._stop.wait(0.2)
            return None
        keys = {a.key for a in attachments}
        if time.monotonic() - self._last_full >= RESYNC_SECONDS:
            self._unrepaired = set(keys)
            self._last_full = time.monotonic()
        self._unrepaired &= keys
        deadline = Deadline(SYNC_DEADLINE_SECONDS)
        result = sync(world, attachments, self.enforcer, deadline)
        for key in self.enforcer.keys() - keys:
            self.enforcer.forget(key)
        seconds = time.monotonic() - since if since is not None else None
        if self._synced is not None:
            self._synced(result.rules, len(result.unenforced), seconds)
        self._report(result, policies or [])
        repair(attachments, self.enforcer, self._unrepaired, self._change_waits, deadline)
        return result

    def _refused(self, exc: NewerFormat) -> None:
        """Say once per file that a newer release's record stops every pass (doctor's
        state.formats and policy.agent name it too)."""
        if exc.path != self._refusal:
            log.warning("policy not kept current on this node: %s; %s", exc.msg, exc.details)
            self._refusal = exc.path

    def _change_waits(self) -> bool:
        """Whether a change is waiting for a pass (read without the lock: one that comes just
        after is seen at the next attachment)."""
        return self._pending_since is not None or self._stop.is_set()

    def _report(self, result: SyncResult, policies: list[Policy]) -> None:
        by_key = {policy.key: policy for policy in policies}
        for unenforced in result.unenforced:
            for key in unenforced.policies:
                policy = by_key.get(key)
                if policy is not None:
                    self._event(policy, NOT_ENFORCED,
                                f"{unenforced.attachment.describe()} on node {self.node}: "
                                f"{unenforced.reason}",
                                f"{unenforced.attachment.key}|{unenforced.reason}")
        for policy in policies:
            if policy.problems:
                self._event(policy, INVALID, "refused, matches nothing: " +
                            "; ".join(policy.problems), "|".join(policy.problems))
        status = {"syncedAt": time.time(), "rules": result.rules,
                  "enforced": result.enforced,
                  "unenforced": [{"attachment": u.attachment.describe(), "reason": u.reason,
                                  "policies": list(u.policies)} for u in result.unenforced]}
        try:
            records.write_status(self.lock_dir, status)
        except Exception as exc:  # the status is doctor's; the rules are written already
            log.warning("policy status not written: %s", exc)

    def _event(self, policy: Policy, reason: str, note: str, cause: str) -> None:
        key = (policy.uid, reason, cause)
        if key in self._reported:
            return
        self._reported.add(key)
        regarding = {"apiVersion": API_VERSIONS[policy.kind], "kind": policy.kind,
                     "namespace": policy.namespace, "name": policy.name, "uid": policy.uid}
        body = object_event_body(regarding, self.node, reason, "Warning", note, "Enforce")
        client = KubeClient(self._creds, self._observe)
        try:
            client.request("POST", Target(EVENTS, policy.namespace), Deadline(10), body=body)
        except (ApiError, OSError, Exception) as exc:
            log.warning("Event %s on %s not written: %s", reason, policy.key, exc)
            self._reported.discard(key)
        finally:
            client.close()


class WarmPolicyView:
    """The policy step's reads through the agent: its caches, or the verb's API client while
    they are not in sync."""

    def __init__(self, keeper: PolicyKeeper, fallback: PolicyView) -> None:
        self._keeper = keeper
        self._fallback = fallback

    def pod(self, namespace: str, name: str, deadline: Deadline) -> dict[str, Any] | None:
        """The Pod from the cache, else the API."""
        return self._keeper.pod(namespace, name) or self._fallback.pod(namespace, name,
                                                                         deadline)

    def policies(self, namespace: str, network_policy: bool,
                 deadline: Deadline) -> list[Policy]:
        """The namespace's policies from the API, not the caches: a policy created a moment
        before the ADD must already hold (a watch may lag behind; peers a cache has not seen
        yet only stay shut until the next pass)."""
        return self._fallback.policies(namespace, network_policy, deadline)

    def world(self, policies: list[Policy], local: list[Endpoint], network_policy: bool,
              deadline: Deadline) -> World:
        """The world from the caches, else the API."""
        found = self._keeper.world(policies, local)
        return found if found is not None else \
            self._fallback.world(policies, local, network_policy, deadline)
