"""`vpc-attach doctor`: the CNI configs in the conf dir that reference vpc-attach, each stanza
validated as the verbs would, and the networks whose remote routes this node cannot install."""

from __future__ import annotations

import json
import os
from typing import Any

from cni_plugin.doctor.node import CONFLIST_SUFFIXES, FAIL, OK, WARN, Finding, Node, host_file_of
from cni_plugin.ipam.delegate import find_plugin
from cni_plugin.ipam.plugin.config import PLUGIN_TYPES, confine_data_dir, parse_network
from netconf.config import parse_netconf
from netconf.errors import CniError
from netconf.host import NodeSettings, stanza_host_values


def networks(node: Node) -> list[Finding]:
    """The CNI configs in the conf dir that reference vpc-attach, each one validated."""
    try:
        names = sorted(n for n in os.listdir(node.cni_conf_dir) if n.endswith(CONFLIST_SUFFIXES))
    except OSError as exc:
        return [Finding("cni.conflist", WARN, f"cannot list {node.cni_conf_dir}: "
                        f"{exc.strerror or exc}", "pass --cni-conf-dir with the runtime's CNI "
                        "config directory")]
    findings: list[Finding] = []
    for name in names:
        path = os.path.join(node.cni_conf_dir, name)
        findings.extend(_network_file(node, path))
    if not findings:
        return [Finding("cni.conflist", WARN, f"no config in {node.cni_conf_dir} references "
                        "vpc-attach (fine when NetworkAttachmentDefinitions do, through "
                        "Multus)")]
    return findings + remote_routes(node)


def remote_routes(node: Node) -> list[Finding]:
    """Networks whose Pods other nodes announce routes to, but whose routes galactic-router
    cannot install here: it finds a VPC's kernel table only through the VPC's VRF device."""
    table_networks = sorted({conf.name for _, conf in node.networks
                             if conf.publish.bgp and conf.attachment != "existing"
                             and conf.isolation == "table"})
    if not table_networks:
        return []
    return [Finding(
        "routes.remote", WARN,
        f"networks {', '.join(map(repr, table_networks))} use isolation 'table': galactic-router "
        "installs the routes other nodes announce only into a VPC's VRF device (G…V), so their "
        "Pods here reach Pods of the same VPC on this node only",
        "set \"isolation\": \"vrf\" on nodes whose Pods talk to other nodes (a kernel with VRF)")]


def _network_file(node: Node, path: str) -> list[Finding]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        return [Finding("cni.conflist", WARN, f"cannot read {path}: {exc.strerror or exc}")]
    if '"vpc-attach"' not in text.replace(" ", ""):
        return []
    try:
        config = json.loads(text)
        plugins = config.get("plugins", [config]) if isinstance(config, dict) else None
    except ValueError as exc:
        return [Finding("cni.conflist", FAIL, f"{path}: invalid JSON: {exc}",
                        "fix the file: the runtime cannot use it either")]
    if not isinstance(plugins, list):
        return [Finding("cni.conflist", FAIL, f"{path}: 'plugins' is not a list",
                        "fix the file: the runtime cannot use it either")]
    findings = []
    for plugin in plugins:
        if isinstance(plugin, dict) and plugin.get("type") == "vpc-attach":
            findings.append(_stanza(node, path, config, plugin))
    return findings


def _stanza(node: Node, path: str, config: dict[str, Any], plugin: dict[str, Any]) -> Finding:
    merged = {"cniVersion": config.get("cniVersion"), "name": config.get("name"), **plugin}
    try:
        stanza_host_values(merged, node.environ, host_file_of(node))
        conf = parse_netconf(merged)
        bin_path = (node.cni_bin_dir,)
        find_plugin("vpc-attach", bin_path)
        if conf.ipam is not None:
            find_plugin(str(conf.ipam["type"]), bin_path)
            if conf.ipam["type"] in PLUGIN_TYPES:
                ipam = confine_data_dir(parse_network(merged),
                                        NodeSettings.read(node.environ, node.host_file()))
                node.ipam_data_dirs.append(ipam.data_dir)
    except CniError as exc:
        where = f" ({exc.details})" if exc.details else ""
        return Finding("cni.conflist", FAIL, f"{path}: network {merged['name']!r}: "
                       f"{exc.msg}{where}", "fix the vpc-attach stanza (docs/configuration.md) "
                       f"or install the missing plugin into {node.cni_bin_dir}")
    node.networks.append((path, conf))
    return Finding("cni.conflist", OK, f"{path}: network {conf.name!r}, VPC {conf.vpc} "
                   f"attachment {conf.vpcattachment}, {conf.attachment}, isolation "
                   f"{conf.isolation}")
