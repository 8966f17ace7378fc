"""Compiled policy written into the kernel where each kind of attachment is enforced: an
nftables table in a veth Pod's netns, stateful tc filters on a tap (docs/architecture.md,
"Policy inside a VPC"). An `Enforcer` remembers what it wrote, so the next change of peers only
refills sets; one that starts afresh (an ADD in-process, a restarted agent) replaces whole
tables, which leaves the connections conntrack knows alone."""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import flower, netns, tc
from cni_plugin.kernel.nftables import Nft, NftError
from cni_plugin.kernel.rtnl import NetlinkError, Rtnl
from cni_plugin.policy import nft
from cni_plugin.policy import tc as tc_policy
from cni_plugin.policy.compile import Compiled
from cni_plugin.policy.records import LocalAttachment
from netconf.errors import KERNEL_FAILURE, CniError

log = logging.getLogger(__name__)
# What a kernel without stateful tc answers when a flower filter or ct action is asked for.
_MISSING_MODULE = (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTSUP)
NO_STATEFUL_TC = ("this kernel has no stateful tc (cls_flower, act_ct, act_gact): a tap's "
                  "traffic is not filtered")
# A tap's stateful filters, proven with real packets on one node in the full-kernel VM
# (e2e/test_policy_taps.py). Off: a policy selecting a tap is reported, nothing is written.
TAPS_FILTERED = True
TAPS_NOT_YET = ("policy on a VM's tap is not enforced by this release yet: its traffic is not "
                "filtered")


@dataclass(frozen=True)
class Enforced:
    """What one attachment enforces now: its allow rules, and why a path of it is not
    enforced (None: every path is)."""

    rules: int
    unenforced: str | None = None


class NftContext(Protocol):
    """What the enforcer asks of an nft context (`kernel.nftables.Nft`)."""

    def run(self, script: str, deadline: Deadline | None = None) -> str:
        """Run the script as one transaction, within `deadline`."""

    def close(self) -> None:
        """Free the context."""


@dataclass(frozen=True)
class _Written:
    """What a veth attachment was last made to enforce: the compiled policy, its table in
    the Pod's netns (None: none), and what that enforced."""

    compiled: Compiled
    table: nft.Table | None
    enforced: Enforced


class Enforcer:
    """Writes attachments' compiled policy; holds what it wrote and the nft contexts bound to
    their Pods' netns. A veth attachment whose compiled policy is the one written last is not
    rendered nor written again (most of a node's, on most changes): `repair` rewrites it
    whole."""

    def __init__(self, nft_in: Callable[[str, Deadline], NftContext] = Nft) -> None:
        self._nft_in = nft_in  # an nft context bound to a netns (a stand-in in unit tests)
        self._written: dict[str, _Written] = {}
        self._contexts: dict[str, NftContext] = {}
        self._lock = threading.RLock()  # the agent's sync thread and its verb threads

    def apply(self, attachment: LocalAttachment, compiled: Compiled,
              deadline: Deadline) -> Enforced:
        """Make the attachment enforce `compiled` (remove its rules when nothing selects it)."""
        with self._lock:
            if attachment.kind == "tap":  # diffed against the kernel each time: its repair
                if not TAPS_FILTERED:
                    return Enforced(0, TAPS_NOT_YET if compiled.enforced else None)
                return _apply_tap(attachment, compiled, deadline)
            known = self._written.get(attachment.key)
            if known is not None and known.compiled == compiled:
                return known.enforced
            return self._apply_veth(attachment, compiled, known, deadline)

    def repair(self, attachment: LocalAttachment, deadline: Deadline) -> None:
        """Write what the attachment enforces again, whole, through a new context (puts
        back what a Pod with NET_ADMIN may have flushed); nothing when nothing is remembered
        of it."""
        with self._lock:
            known = self._written.get(attachment.key)
            if known is not None:
                self.forget(attachment.key)
                self._apply_veth(attachment, known.compiled, None, deadline)

    def keys(self) -> set[str]:
        """The attachments it remembers something of."""
        with self._lock:
            return set(self._written) | set(self._contexts)

    def forget(self, key: str) -> None:
        """Drop what is remembered of an attachment that is gone."""
        with self._lock:
            self._written.pop(key, None)
            context = self._contexts.pop(key, None)
            if context is not None:
                context.close()

    def close(self) -> None:
        """Forget everything (the next change rewrites each table whole)."""
        with self._lock:
            for key in list(self._written) + list(self._contexts):
                self.forget(key)

    def _apply_veth(self, attachment: LocalAttachment, compiled: Compiled,
                    known: _Written | None, deadline: Deadline) -> Enforced:
        if not compiled.enforced:
            if known is None or known.table is not None:  # written before, or unknown
                self._run(attachment, nft.removal(attachment.ifname), deadline)
            self._written[attachment.key] = _Written(compiled, None, Enforced(0))
            return Enforced(0)
        table = nft.render(attachment.ifname, compiled)
        update = table.update_from(known.table) if known is not None and \
            known.table is not None else None
        if update is None:
            self._run(attachment, table.script(), deadline)
        elif update:
            self._run(attachment, update, deadline)
        enforced = Enforced(table.rules)
        self._written[attachment.key] = _Written(compiled, table, enforced)
        return enforced

    def _run(self, attachment: LocalAttachment, script: str, deadline: Deadline) -> None:
        context = self._contexts.get(attachment.key)
        if context is None:
            context = self._nft_in(attachment.netns, deadline)
            self._contexts[attachment.key] = context
        try:
            context.run(script, deadline)  # this pass's deadline: the context outlives it
        except NftError:
            self._written.pop(attachment.key, None)  # unknown now: the next change rewrites it
            raise


def _apply_tap(attachment: LocalAttachment, compiled: Compiled, deadline: Deadline) -> Enforced:
    """The tap's filters made exactly the rendered ones: new ones first, then the old ones
    deleted (for a moment both allow: never a moment with neither)."""
    wanted = tc_policy.render(compiled, attachment.zone)
    with netns.open_netlink(None, deadline=deadline) as rtnl:
        try:
            link = rtnl.get_link(name=attachment.host_link)
        except NetlinkError as exc:
            if exc.code == errno.ENODEV:
                return Enforced(0)  # gone: DEL runs
            raise
        if wanted:
            tc.ensure_clsact(rtnl, link.index)
        present = {(hook, priority, protocol, handle)
                   for hook in tc_policy.HOOKS.values()
                   for priority, protocol, handle in flower.dump_handles(rtnl, link.index, hook)
                   if priority in tc_policy.PRIORITIES}
        keep = {(f.hook, f.priority, f.protocol, f.handle) for f in wanted}
        added = sorted(keep - present)
        try:
            flower.add_filters(rtnl, link.index,
                               [f for f in wanted
                                if (f.hook, f.priority, f.protocol, f.handle) in added])
        except NetlinkError as exc:
            # The batch adds every filter the kernel takes: without act_ct, the drops (gact)
            # go in and the lookups do not, so a half policy drops what it allows (their
            # ct_state comes from the node's conntrack) and passes what it denies. This pass's
            # filters are taken back: the tap keeps what it had.
            flower.delete_filters(rtnl, link.index, added)
            if exc.code in _MISSING_MODULE:
                log.warning("policy on %s: %s (%s)", attachment.host_link, NO_STATEFUL_TC, exc)
                return Enforced(0, NO_STATEFUL_TC)
            raise CniError(KERNEL_FAILURE, f"failed to write the policy's tc filters on "
                           f"{attachment.host_link}", str(exc)) from None
        flower.delete_filters(rtnl, link.index, sorted(present - keep))
        early = _filters_before_policy(rtnl, link.index) if wanted else []
    if early:
        return Enforced(tc_policy.rule_count(wanted), (
            f"{', '.join(early)} on {attachment.host_link} runs before the policy's filters: "
            "packets it redirects to other nodes are not filtered"))
    return Enforced(tc_policy.rule_count(wanted))


def _filters_before_policy(rtnl: Rtnl, ifindex: int) -> list[str]:
    """bpf filters on the tap's ingress that run before the policy's (galactic's usid_egress
    attached at priority 1 by an earlier release or by galactic-bgp)."""
    return [f"bpf filter {f.name!r} (priority {f.priority})"
            for f in tc.bpf_filters(rtnl, ifindex, tc.TC_H_INGRESS_HOOK)
            if f.priority < tc_policy.ND_PRIORITY]
