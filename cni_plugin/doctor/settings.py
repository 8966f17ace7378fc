"""`vpc-attach doctor`: each host setting and where it came from (environment, host file,
default)."""

from __future__ import annotations

from cni_plugin.doctor.node import FAIL, OK, WARN, Finding, Node
from netconf.errors import CniError
from netconf.host import (
    ipam_data_root,
    resolve_with_sources,
    stanza_host_settings_allowed,
)


def host_settings(node: Node) -> list[Finding]:
    """Each host setting with where it came from (environment, host file, default)."""
    findings = []
    path = node.environ.get("VPC_ATTACH_HOST_CONFIG") or "/etc/vpc-attach/host.json"
    try:
        host_file = node.host_file()
    except CniError as exc:
        findings.append(Finding("settings.hostFile", FAIL, f"{exc.msg}: {exc.details}",
                                "fix the JSON of the host file, or re-run `vpc-attach "
                                "install` (restart the DaemonSet Pod on this node)"))
        host_file = {}
    try:
        node.settings, sources = resolve_with_sources({}, node.environ, host_file)
    except CniError as exc:
        findings.append(Finding("settings", FAIL, f"{exc.msg}: {exc.details}",
                                f"correct the value in {path} or the environment"))
        return findings
    names = {"node_name": "nodeName", "kubeconfig": "kubeconfig", "namespace": "namespace",
             "log_file": "logFile", "log_level": "logLevel", "log_max_bytes": "logMaxBytes",
             "log_backups": "logBackups", "agent_socket": "agentSocket",
             "timeout_seconds": "timeoutSeconds", "lock_dir": "lockDir", "tenancy": "tenancy"}
    for setting, key in names.items():
        value = getattr(node.settings, setting)
        source = sources[setting]
        if source.startswith("host file"):
            source = f"host file {path}"
        shown = "(unset)" if value is None else str(value)
        findings.append(Finding(f"settings.{key}", OK, f"{shown} ({source})"))
    findings.append(Finding("settings.ipamDataRoot", OK, ipam_data_root(node.environ, host_file)))
    if stanza_host_settings_allowed(node.environ, host_file):  # validated by resolve above
        findings.append(Finding(
            "settings.stanzaHostSettings", WARN, "allow: network configs may set host settings "
            "(where the plugin writes, connects to and who it is)", "only on a single-tenant "
            "node: whoever writes a NetworkAttachmentDefinition controls them"))
    return findings
