"""`vpc-attach doctor [--json]`: diagnose this node (SPEC §12) and say how to fix what is wrong.

It checks the host settings and where each came from, the CNI configs that reference
vpc-attach, the kernel features they need, the agent (socket, protocol, readiness), the API
server with the plugin's kubeconfig, every permission of the packaged ClusterRole, this node's
BGPRouter, and leftovers (retired links, vpc-attach-ipam allocations without an attachment),
and the cluster blocks of vpc-attach-ipam pools the node holds.
Exit status 0 only when no check failed; warnings do not count.

One module per concern, each a list of checks on what they share (`node`: `Finding`, `Node`,
the statuses and bounds): `settings`, `networks`, `kernel` (with the host protection table),
`galactic`, `agent`, `cluster` (API, RBAC, router, tenancy), `blocks`, `leftovers`, `formats`
(files a newer release wrote, SPEC §18), `policy` (policy inside a VPC: what the kernel lets
the node enforce, the agent's last pass); KubeVirt's
checks are its room's (`cni_plugin/kubevirt/doctor.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from cni_plugin.doctor.agent import agent as check_agent
from cni_plugin.doctor.blocks import ipam_blocks as check_ipam_blocks
from cni_plugin.doctor.cluster import api as check_api
from cni_plugin.doctor.cluster import rbac as check_rbac
from cni_plugin.doctor.cluster import router as check_router
from cni_plugin.doctor.cluster import tenancy as check_tenancy
from cni_plugin.doctor.formats import state_formats as check_state_formats
from cni_plugin.doctor.galactic import galactic_datapath as check_galactic_datapath
from cni_plugin.doctor.kernel import host_protection as check_host_protection
from cni_plugin.doctor.kernel import kernel as check_kernel
from cni_plugin.doctor.leftovers import leftovers as check_leftovers
from cni_plugin.doctor.networks import networks as check_networks
from cni_plugin.doctor.node import FAIL, Finding, Node
from cni_plugin.doctor.policy import policy as check_policy
from cni_plugin.doctor.settings import host_settings as check_host_settings
from cni_plugin.kubevirt.doctor import ipam_claims as check_ipam_claims
from cni_plugin.kubevirt.doctor import migration_targets as check_migration_targets

DEFAULT_CNI_CONF_DIR = "/etc/cni/net.d"
DEFAULT_CNI_BIN_DIR = "/opt/cni/bin"
# In this order: later checks use what earlier ones learned (settings, networks, API client).
CHECKS: tuple[Callable[[Node], list[Finding]], ...] = (
    check_host_settings, check_networks, check_kernel, check_galactic_datapath,
    check_host_protection, check_agent,
    check_api, check_rbac, check_router, check_tenancy, check_leftovers, check_state_formats,
    check_ipam_blocks, check_ipam_claims, check_migration_targets, check_policy)


def diagnose(node: Node) -> list[Finding]:
    """Run every check on node, in order."""
    findings: list[Finding] = []
    try:
        for check in CHECKS:
            findings.extend(check(node))
    finally:
        node.close()
    return findings


def render_table(findings: list[Finding]) -> str:
    """The report as a table: check, status, detail; a problem's fix on the line below."""
    width = max([len("CHECK"), *(len(f.check) for f in findings)])
    lines = [f"{'CHECK':<{width}}  STATUS  DETAIL"]
    for finding in findings:
        lines.append(f"{finding.check:<{width}}  {finding.status:<6}  {finding.detail}")
        if finding.fix and finding.status != "ok":
            lines.append(f"{'':<{width}}  {'':<6}  fix: {finding.fix}")
    failed = sum(f.status == FAIL for f in findings)
    lines.append(f"{failed} problem(s)" if failed else "no problems")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`vpc-attach doctor [--json] [...]`; 0 when nothing is wrong, 1 otherwise."""
    from cni_plugin.agent.health import DEFAULT_METRICS_ADDRESS, METRICS_ADDRESS_ENV
    from cni_plugin.ipam.plugin.config import DEFAULT_DATA_DIR

    parser = argparse.ArgumentParser(prog="vpc-attach doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--cni-conf-dir", default=DEFAULT_CNI_CONF_DIR,
                        help=f"the runtime's CNI config directory (default {DEFAULT_CNI_CONF_DIR})")
    parser.add_argument("--cni-bin-dir", default=DEFAULT_CNI_BIN_DIR,
                        help=f"the CNI plugin directory (default {DEFAULT_CNI_BIN_DIR})")
    parser.add_argument("--metrics-address",
                        default=os.environ.get(METRICS_ADDRESS_ENV, DEFAULT_METRICS_ADDRESS),
                        help=f"the agent's {METRICS_ADDRESS_ENV} (default: this environment's,"
                        f" else {DEFAULT_METRICS_ADDRESS})")
    parser.add_argument("--ipam-data-dir", action="append", default=[],
                        help=f"a vpc-attach-ipam dataDir to look for leftovers in (repeatable; "
                        f"default {DEFAULT_DATA_DIR}); those of the configs found are added")
    args = parser.parse_args(argv)
    node = Node(environ=dict(os.environ), cni_conf_dir=args.cni_conf_dir,
                cni_bin_dir=args.cni_bin_dir, metrics_address=args.metrics_address.strip(),
                ipam_data_dirs=list(args.ipam_data_dir or [DEFAULT_DATA_DIR]))
    findings = diagnose(node)
    ok = not any(f.status == FAIL for f in findings)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [f.to_json() for f in findings]}, indent=2))
    else:
        print(render_table(findings))
    sys.stdout.flush()
    return 0 if ok else 1
