"""`vpc-attach doctor`: policy inside a VPC on this node (SPEC §17): which kinds of attachment
the kernel lets vpc-attach enforce policy on, whether an agent keeps the rules current, and
what its last pass could not enforce."""

from __future__ import annotations

import os
import platform
import shutil
import time
from typing import Any

from cni_plugin.doctor.node import FAIL, OK, WARN, Finding, Node, host_file_of
from cni_plugin.kernel.nftables import LIBRARY
from cni_plugin.policy import records
from cni_plugin.policy.enforce import TAPS_FILTERED
from netconf.errors import CniError
from netconf.host import NodeSettings
from netconf.node_groups import PolicySettings

STALE_SECONDS = 180.0  # a keeper rewrites it at least every minute
TC_MODULES = ("cls_flower", "act_ct", "act_gact")
SHOWN = 5


def policy(node: Node) -> list[Finding]:
    """policy.mode, policy.kernel, policy.agent, policy.unenforced. MultiNetworkPolicy is
    enforced unless the node's operator turned it off, which policy.mode warns of (a tenant's
    policies would be ignored here); with both kinds off the others say so."""
    try:
        settings = NodeSettings(node.environ, host_file_of(node)).policy
    except CniError:
        settings = None  # reported by host_settings; checked as if on
    mode = _mode(settings)
    if settings is not None and not (settings.network_policy or settings.multi_network_policy):
        off = ("policy inside a VPC is off on this node (host settings multiNetworkPolicy, "
               "networkPolicy)")
        return [mode, *(Finding(name, OK, off)
                        for name in ("policy.kernel", "policy.agent", "policy.unenforced"))]
    try:
        attachments = list(records.read_all(node.settings.lock_dir))
    except CniError as exc:  # a newer release's record (code 108): state.formats names it too
        return [mode, Finding("policy.agent", FAIL, "neither the agent's passes nor an ADD a "
                              f"policy selects act without it: {exc.msg}", exc.details)]
    taps = sum(1 for attachment in attachments if attachment.kind == "tap")
    try:
        status = records.read_status(node.settings.lock_dir)
    except CniError as exc:  # a newer release's report: this release's next pass replaces it
        return [mode, _kernel(taps), Finding("policy.agent", WARN, exc.msg, exc.details),
                Finding("policy.unenforced", OK, "no agent pass to read")]
    return [mode, _kernel(taps), _agent(status, len(attachments)), *_unenforced(status)]


def _mode(settings: PolicySettings | None) -> Finding:
    """Which kinds of policy the node enforces (SPEC §17 has no off switch for
    MultiNetworkPolicy: an operator's `off` is a warning on every run)."""
    if settings is None:
        return Finding("policy.mode", OK, "as the defaults (host settings unusable)")
    plain = "NetworkPolicy on the conflist's attachments: " + (
        "enforce" if settings.network_policy else "off (another component's)")
    if not settings.multi_network_policy:
        return Finding("policy.mode", WARN, "MultiNetworkPolicy is off on this node (host "
                       f"setting multiNetworkPolicy): tenants' policies are not enforced on "
                       f"its attachments and nothing else reports them; {plain}",
                       "remove multiNetworkPolicy: off from the host settings (docs/"
                       "configuration.md, \"Policy inside a VPC\")")
    return Finding("policy.mode", OK, f"MultiNetworkPolicy: enforce (the default); {plain}")


def _kernel(taps: int) -> Finding:
    nft = "libnftables" if _loads(LIBRARY) else "the nft executable" if shutil.which("nft") \
        else None
    missing = [m for m in TC_MODULES if not _module_available(m)]
    if nft is None:
        return Finding("policy.kernel", FAIL, "neither libnftables nor nft is here: no "
                       "policy can be enforced on veth Pods",
                       "install Debian's nftables package (the DaemonSet's image has it)")
    if not TAPS_FILTERED:  # a policy selecting a tap is policy.unenforced's warning
        return Finding("policy.kernel", OK, f"veth Pods: nftables in their netns ({nft}); "
                       "taps: not filtered by this release (a policy selecting one is "
                       "reported: Event PolicyNotEnforced, policy.unenforced)")
    if missing and taps:
        return Finding("policy.kernel", WARN, f"veth Pods: enforced with {nft}; taps: this "
                       f"kernel lacks {', '.join(missing)} (stateful tc), so a policy "
                       f"selecting one of the {taps} VM tap(s) here is not enforced (Event "
                       "PolicyNotEnforced)",
                       f"use a kernel with {', '.join(TC_MODULES)} (modules of every "
                       "distribution kernel)")
    if missing:  # every node has MultiNetworkPolicy on: warn where a VM is, not everywhere
        return Finding("policy.kernel", OK, f"veth Pods: nftables in their netns ({nft}); "
                       f"no VM tap here, and this kernel lacks {', '.join(missing)}: a policy "
                       "selecting a tap would be reported (policy.unenforced, Event)")
    return Finding("policy.kernel", OK, f"veth Pods: nftables in their netns ({nft}); taps: "
                   f"stateful tc ({', '.join(TC_MODULES)})")


def _agent(status: dict[str, Any] | None, attachments: int) -> Finding:
    if status is None:
        detail = (f"{attachments} attachment(s) here could be selected by a policy; "
                  if attachments else "")
        return Finding("policy.agent", WARN if attachments else OK,
                       f"{detail}no node agent keeps policies: each ADD enforces what "
                       "exists then, later changes of policies, Pods or namespaces are not "
                       "followed on this node",
                       "run the DaemonSet's agent container (vpc-attach agent)"
                       if attachments else "")
    age = time.time() - float(status.get("syncedAt") or 0)
    if age > STALE_SECONDS:
        return Finding("policy.agent", WARN, f"the agent's last policy pass was {age:.0f} s "
                       "ago: changes are not followed", "kubectl -n kube-system logs <the "
                       "vpc-attach Pod of this node> -c agent")
    return Finding("policy.agent", OK, f"the agent keeps {attachments} attachment(s) current: "
                   f"{status.get('rules', 0)} rule(s), {status.get('enforced', 0)} "
                   f"attachment(s) isolated, last pass {age:.0f} s ago")


def _unenforced(status: dict[str, Any] | None) -> list[Finding]:
    raw = (status or {}).get("unenforced")
    found: list[dict[str, Any]] = [i for i in raw if isinstance(i, dict)] \
        if isinstance(raw, list) else []
    if not found:
        return [Finding("policy.unenforced", OK, "every policy selecting an attachment here "
                        "is enforced on every path" if status else "no agent pass to read")]
    listed = "; ".join(f"{item.get('attachment')}: {item.get('reason')} (policies "
                       f"{', '.join(item.get('policies') or [])})" for item in found[:SHOWN])
    return [Finding("policy.unenforced", WARN, f"{len(found)} attachment(s) a policy selects "
                    f"are not enforced on every path: {listed}",
                    "docs/operations.md, \"Policy: why a packet was dropped or was not\"")]


def _loads(library: str) -> bool:
    import ctypes
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def _module_available(name: str) -> bool:
    """Loaded, built in, or installed as a module of the running kernel."""
    if os.path.isdir(f"/sys/module/{name}"):
        return True
    base = f"/lib/modules/{platform.release()}"
    for listing in ("modules.builtin", "modules.dep"):
        try:
            with open(os.path.join(base, listing), encoding="utf-8") as handle:
                if any(f"/{name}.ko" in line for line in handle):
                    return True
        except OSError:
            continue
    return False
