"""`vpc-attach doctor`: leftovers (retired links, vpc-attach-ipam allocations without an
attachment)."""

from __future__ import annotations

from collections.abc import Iterable

from cni_plugin.doctor.node import API_SECONDS, FAIL, NETLINK_SECONDS, OK, Finding, Node
from cni_plugin.ipam.plugin.store import PoolState, pool_directories
from cni_plugin.kernel import links, netns
from netconf.errors import CniError


def leftovers(node: Node) -> list[Finding]:
    """Retired links nobody deletes, and vpc-attach-ipam allocations of containers that have
    no attachment on this node any more."""
    try:
        with netns.open_netlink(None, NETLINK_SECONDS) as rtnl:
            host_links = links.all_links(rtnl)
    except (OSError, CniError) as exc:
        return [Finding("leftovers.links", FAIL, f"cannot list links: {exc}",
                        "run doctor as root in the host network namespace")]
    findings = []
    retired = sorted(link.name for link in host_links if links.is_retired(link))
    if retired:
        findings.append(Finding("leftovers.links", FAIL, f"{len(retired)} retired link(s) not "
                                f"deleted: {', '.join(retired[:10])}",
                                "the agent deletes them at its start and any GC does; or ip "
                                "link del <name>"))
    else:
        findings.append(Finding("leftovers.links", OK, "no retired links"))
    live = {(link.owner.container_id, link.owner.ifname) for link in host_links
            if link.owner is not None}
    stale, total = _stale_allocations(_unique(node.ipam_data_dirs), live)
    if stale:
        findings.append(Finding("leftovers.ipam", FAIL, f"{len(stale)} of {total} "
                                "vpc-attach-ipam allocations belong to containers with no "
                                f"attachment on this node: {'; '.join(stale[:10])}",
                                "a DEL of that container releases it, or a GC with the "
                                "runtime's valid list (check crictl pods --no-trunc); run "
                                "doctor again first: an ADD in flight looks the same"))
    else:
        findings.append(Finding("leftovers.ipam", OK, f"{total} vpc-attach-ipam "
                                "allocation(s), each with its attachment"))
    return findings


def _stale_allocations(data_dirs: Iterable[str], live: set[tuple[str, str]]
                       ) -> tuple[list[str], int]:
    stale: list[str] = []
    total = 0
    for data_dir in data_dirs:
        for _, _, path in pool_directories(data_dir):
            try:
                records = PoolState(path, API_SECONDS).records()
            except CniError:
                continue
            for record in records:
                total += 1
                owner = record.attachment
                if record.claim is not None:  # an IPAMClaim's: kept until the claim goes
                    continue
                if owner is None:
                    stale.append(f"{path}/{record.name} (unreadable record)")
                elif (owner.container_id, owner.ifname) not in live:
                    stale.append(f"{path}/{record.name} ({owner.container_id[:12]}/"
                                 f"{owner.ifname})")
    return stale, total


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
