"""What `vpc-attach doctor` checks on a node, one function per concern; each returns findings.

A finding is `ok`, `warn` (worth knowing, not wrong), `fail` (wrong: it says how to fix it) or
`skip` (could not be checked because an earlier check failed). Every network call and netlink
request has a timeout.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from cni_plugin.agent.client import CONNECT_TIMEOUT
from cni_plugin.agent.protocol import (
    MAGIC,
    ProtocolError,
    VersionMismatch,
    encode_request,
    read_reply,
)
from cni_plugin.core.deadline import Deadline
from cni_plugin.ipam.delegate import find_plugin
from cni_plugin.ipam.plugin.config import PLUGIN_TYPES, confine_data_dir, parse_network
from cni_plugin.ipam.plugin.store import PoolState, pool_directories
from cni_plugin.kernel import hostfilter, isolation, links, netns, srv6
from cni_plugin.kube.client import ApiError, KubeClient, Target
from cni_plugin.kube.config import load_kubeconfig
from cni_plugin.kube.kinds import ACCESS_REVIEWS, BINDINGS
from cni_plugin.publish.resources import GROUP, ROUTERS
from netconf.config import NetConf, parse_netconf
from netconf.errors import CniError
from netconf.host import (
    HostSettings,
    NodeSettings,
    ipam_data_root,
    read_host_file,
    resolve_with_sources,
    stanza_host_settings_allowed,
    stanza_host_values,
)

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
API_SECONDS = 5.0
AGENT_SECONDS = 5.0
NETLINK_SECONDS = 5.0
HTTP_SECONDS = 5.0
TUN_DEVICE = "/dev/net/tun"
CONFLIST_SUFFIXES = (".conflist", ".conf", ".json")
# What packaging/rbac/clusterrole.yaml grants: (API group, resource, verbs). The BGP kinds are
# checked in the BGP namespace, the rest cluster-wide (Pods live in every namespace). A test
# holds this equal to the packaged ClusterRole.
CLUSTER_ROLE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, "bgprouters", ("get", "list", "watch")),
    (GROUP, "bgpvrfinstances", ("get", "list", "watch", "create", "update", "patch",
                                "delete")),
    (GROUP, "bgpadvertisements", ("get", "list", "create", "update", "patch", "delete")),
    ("discovery.k8s.io", "endpointslices", ("get", "list", "create", "update", "patch",
                                            "delete")),
    ("", "pods", ("get", "list", "watch")),
    ("vpc-attach.datum.net", "vpcbindings", ("get", "list", "watch")),
    ("", "namespaces", ("get", "list", "watch")),
    ("vpc-attach.datum.net", "ipamblocks", ("get", "list", "create", "delete")),
    ("", "nodes", ("get",)),
    ("k8s.cni.cncf.io", "ipamclaims", ("get", "list", "watch")),
    ("k8s.cni.cncf.io", "ipamclaims/status", ("update",)),
    ("events.k8s.io", "events", ("create", "patch")),
    ("authorization.k8s.io", "selfsubjectaccessreviews", ("create",)),
)


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    check: str
    status: str
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        """The JSON form (`--json`)."""
        return asdict(self)


@dataclass
class Node:
    """What the checks learn and share: settings, the networks found, the API client."""

    environ: Mapping[str, str]
    cni_conf_dir: str
    cni_bin_dir: str
    metrics_address: str
    ipam_data_dirs: list[str]
    settings: HostSettings = field(default_factory=HostSettings)
    networks: list[tuple[str, NetConf]] = field(default_factory=list)
    client: KubeClient | None = None

    def close(self) -> None:
        """Close the API client, if one was opened."""
        if self.client is not None:
            self.client.close()


def host_settings(node: Node) -> list[Finding]:
    """Each host setting with where it came from (environment, host file, default)."""
    findings = []
    path = node.environ.get("VPC_ATTACH_HOST_CONFIG") or "/etc/vpc-attach/host.json"
    try:
        host_file = read_host_file(node.environ)
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
                                        NodeSettings.read(node.environ))
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


def host_file_of(node: Node) -> dict[str, Any]:
    try:
        return read_host_file(node.environ)
    except CniError:
        return {}  # reported by host_settings


def kernel(node: Node) -> list[Finding]:
    """VRF devices and /dev/net/tun, failing only when a network found needs them."""
    needs_vrf = [conf.name for _, conf in node.networks
                 if conf.attachment != "existing" and conf.isolation == "vrf"]
    needs_tun = [conf.name for _, conf in node.networks if conf.attachment == "tap"]
    findings = []
    try:
        with netns.open_netlink(None, NETLINK_SECONDS) as rtnl:
            has_vrf = isolation.vrf_supported(rtnl)
    except (OSError, CniError) as exc:
        findings.append(Finding("kernel.vrf", FAIL, f"cannot ask the kernel: {exc}",
                                "run doctor as root in the host network namespace"))
    else:
        if has_vrf:
            findings.append(Finding("kernel.vrf", OK, "VRF devices can be created"))
            findings.append(srv6_decap())
        else:
            findings.append(Finding(
                "kernel.vrf", FAIL if needs_vrf else WARN,
                "this kernel has no VRF device type" + (
                    f"; networks {', '.join(map(repr, needs_vrf))} use isolation 'vrf'"
                    if needs_vrf else "; networks must use \"isolation\": \"table\""),
                "modprobe vrf (CONFIG_NET_VRF), or set \"isolation\": \"table\" in the network"))
    try:
        fd = os.open(TUN_DEVICE, os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
        findings.append(Finding("kernel.tun", OK, f"{TUN_DEVICE} opens"))
    except OSError as exc:
        findings.append(Finding(
            "kernel.tun", FAIL if needs_tun else WARN,
            f"cannot open {TUN_DEVICE}: {exc.strerror or exc}" + (
                f"; tap networks {', '.join(map(repr, needs_tun))} need it" if needs_tun else ""),
            "modprobe tun; mknod /dev/net/tun c 10 200"))
    return findings


def host_protection(node: Node) -> list[Finding]:
    """The `inet vpc_attach` table and its mark rule (SPEC §14), and what it has dropped."""
    fix = "start the agent, or run `vpc-attach install` (it writes the table)"
    try:
        found = hostfilter.state()
    except CniError as exc:
        return [Finding("datapath.protection", FAIL, f"cannot read nftables: {exc.msg}", fix)]
    if not found.table:  # nothing attached yet, or removed: the next ADD writes it
        return [Finding("datapath.protection", WARN,
                        f"nftables table {hostfilter.FAMILY} {hostfilter.TABLE} is missing; "
                        "the next ADD writes it", fix)]
    if not found.mark_rule:  # table-mode VPCs route nothing until it is back
        return [Finding("datapath.protection", FAIL,
                        f"{hostfilter.FAMILY} {hostfilter.TABLE} lacks its mark rule (chain "
                        f"{hostfilter.MARK_CHAIN}): table-mode Pods are cut off", fix)]
    findings = [Finding("datapath.protection", OK,
                        f"nftables table {hostfilter.FAMILY} {hostfilter.TABLE} is in place")]
    try:
        dropped = hostfilter.counters()
    except CniError as exc:
        return [*findings, Finding("datapath.dropped", WARN, f"cannot read counters: {exc.msg}",
                                   "install Debian's nftables package")]
    detail = ", ".join(f"{name} {count}" for name, count in sorted(dropped.items()))
    return [*findings, Finding("datapath.dropped", OK, f"packets dropped: {detail}")]


def srv6_decap() -> Finding:
    """Whether the kernel answers SIDs (End.DT46 into a VRF), and the SIDs it answers now."""
    try:
        with netns.open_netlink(None, NETLINK_SECONDS) as rtnl:
            supported = srv6.end_dt46_supported(rtnl)
            answered = srv6.decap_routes(rtnl)
    except (OSError, CniError) as exc:
        return Finding("kernel.srv6", FAIL, f"cannot ask the kernel: {exc}",
                       "run doctor as root in the host network namespace")
    if not supported:
        return Finding("kernel.srv6", WARN, "this kernel cannot decapsulate SRv6 into a VRF "
                       "(seg6local End.DT46): other nodes' traffic to this node's SIDs is dropped",
                       "a kernel with CONFIG_IPV6_SEG6_LWTUNNEL (Linux 5.14 or later)")
    sids = ", ".join(f"{sid} -> table {table}" for sid, table in sorted(answered.items()))
    return Finding("kernel.srv6", OK, f"End.DT46 works; SIDs answered: {sids or 'none yet'}")


def agent(node: Node) -> list[Finding]:
    """The agent socket answers a VERSION in this protocol; its health endpoint says ready."""
    path = node.settings.agent_socket
    fix = ("kubectl -n kube-system get pods -l app.kubernetes.io/name=vpc-attach -o wide; "
           "kubectl -n kube-system logs <pod> -c agent (without the agent every verb runs "
           "in-process, slower)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
        sock.settimeout(AGENT_SECONDS)
        sock.sendall(encode_request({"CNI_COMMAND": "VERSION",
                                     "CNI_CONTAINERID": "vpc-attach-doctor"}, b""))
        status, answer = read_reply(sock)
    except VersionMismatch as exc:
        return [Finding("agent.socket", FAIL, f"{path}: the agent speaks another protocol "
                        f"version ({exc}; this executable speaks {MAGIC.decode()})",
                        "install the same vpc-attach version as the agent's image (the "
                        "DaemonSet's init container does; restart its Pod)")]
    except (OSError, ProtocolError) as exc:
        return [Finding("agent.socket", FAIL, f"{path}: no agent answers ({exc})", fix)]
    finally:
        sock.close()
    versions = ""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        versions = ", ".join(json.loads(answer)["supportedVersions"])
    if status != 0 or not versions:
        return [Finding("agent.socket", FAIL, f"{path}: the agent answered VERSION with "
                        f"status {status}: {answer[:200]!r}", fix)]
    return [Finding("agent.socket", OK, f"{path}: protocol {MAGIC.decode()}, CNI "
                    f"{versions}"), _agent_health(node)]


def _agent_health(node: Node) -> Finding:
    from cni_plugin.agent.health import parse_address
    address = node.metrics_address
    if not address:
        return Finding("agent.health", SKIP, "no metrics address (VPC_ATTACH_METRICS_ADDRESS "
                       "is empty)")
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        return Finding("agent.health", FAIL, str(exc), "pass --metrics-address HOST:PORT")
    conn = http.client.HTTPConnection(host, port, timeout=HTTP_SECONDS)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        body = response.read(4096).decode(errors="replace").strip()
    except OSError as exc:
        return Finding("agent.health", WARN, f"http://{address}/readyz: {exc} (metrics off, "
                       "or served elsewhere)", "pass --metrics-address with the agent's "
                       "VPC_ATTACH_METRICS_ADDRESS (the DaemonSet serves on the node IP)")
    finally:
        conn.close()
    if response.status == 200:
        return Finding("agent.health", OK, f"http://{address}/readyz: ready")
    return Finding("agent.health", FAIL, f"http://{address}/readyz: {response.status} {body}",
                   "see the reason; the agent's log: kubectl -n kube-system logs <pod> -c "
                   "agent and the log file")


def api(node: Node) -> list[Finding]:
    """The API server answers with the plugin's kubeconfig."""
    kubeconfig = node.settings.kubeconfig
    if not kubeconfig:
        publishing = [conf.name for _, conf in node.networks if conf.publish.any]
        if node.networks and not publishing:
            return [Finding("api.server", SKIP, "no kubeconfig, and no network found here "
                            "publishes")]
        return [Finding("api.server", FAIL, "no kubeconfig is configured (publishing and "
                        "Events need one)", "run `vpc-attach install` (the DaemonSet's init "
                        "container) or set kubeconfig in the host file")]
    try:
        client = KubeClient(load_kubeconfig(kubeconfig))
        version = client.request("GET", "/version", Deadline(API_SECONDS))
    except CniError as exc:
        detail = f"{kubeconfig}: {exc.msg}" + (f" ({exc.details})" if exc.details else "")
        return [Finding("api.server", FAIL, detail,
                        "check the kubeconfig's server is reachable from this node (curl -k "
                        "https://<server>/readyz); re-run the installer for a fresh "
                        "kubeconfig")]
    except (OSError, ValueError) as exc:  # e.g. a CA that does not load
        return [Finding("api.server", FAIL, f"{kubeconfig}: {type(exc).__name__}: {exc}",
                        "re-run the installer for a fresh kubeconfig")]
    except ApiError as exc:
        return [Finding("api.server", FAIL, f"{kubeconfig}: {exc.status} {exc.reason} "
                        f"{exc.message}", "the token is expired or belongs to a deleted Pod: "
                        "check the refresh-token container's log; restart the DaemonSet Pod")]
    node.client = client
    server = client.creds.server
    return [Finding("api.server", OK, f"{server} answered, Kubernetes "
                    f"{(version or {}).get('gitVersion', '?')} ({kubeconfig})")]


def rbac(node: Node) -> list[Finding]:
    """Every permission the packaged ClusterRole grants, asked with SelfSubjectAccessReviews."""
    client = node.client
    if client is None:
        return [Finding("api.rbac", SKIP, "the API server is not reachable")]
    missing: list[str] = []
    asked = 0
    try:
        for group, resource, verbs in CLUSTER_ROLE:
            if resource == "selfsubjectaccessreviews":
                continue  # every review below is one
            namespace = node.settings.namespace if group == GROUP else None
            for verb in verbs:
                asked += 1
                if not _allowed(client, group, resource, verb, namespace):
                    where = f" in namespace {namespace!r}" if namespace else ""
                    missing.append(f"{verb} {resource}{'.' + group if group else ''}{where}")
    except (CniError, ApiError) as exc:
        return [Finding("api.rbac", FAIL, f"cannot ask SelfSubjectAccessReviews: {exc}",
                        "kubectl apply -f packaging/rbac/")]
    if missing:
        return [Finding("api.rbac", FAIL, f"missing {len(missing)} of {asked}: "
                        + "; ".join(missing),
                        "kubectl apply -f packaging/rbac/ and check the binding's subject is "
                        "kube-system/vpc-attach")]
    return [Finding("api.rbac", OK, f"all {asked} permissions of the ClusterRole granted")]


def _allowed(client: KubeClient, group: str, resource: str, verb: str,
             namespace: str | None) -> bool:
    resource, _, subresource = resource.partition("/")  # e.g. ipamclaims/status
    attrs = {"group": group, "resource": resource, "subresource": subresource, "verb": verb}
    if namespace:
        attrs["namespace"] = namespace
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    review = client.create(ACCESS_REVIEWS, body, deadline=Deadline(API_SECONDS))
    return bool((review.get("status") or {}).get("allowed"))


def router(node: Node) -> list[Finding]:
    """Exactly one BGPRouter targets this node."""
    client, name, namespace = node.client, node.settings.node_name, node.settings.namespace
    if not name:
        return [Finding("bgp.router", FAIL, "no node name is configured",
                        "run `vpc-attach install` (NODE_NAME from the downward API) or set "
                        "nodeName in the host file")]
    if client is None:
        return [Finding("bgp.router", SKIP, "the API server is not reachable")]
    try:
        found = client.list(ROUTERS, namespace=namespace, deadline=Deadline(API_SECONDS),
                            fields=f"spec.targetRef.name={name}")
    except (CniError, ApiError) as exc:
        return [Finding("bgp.router", FAIL, f"cannot list BGPRouters in {namespace!r}: {exc}",
                        "kubectl apply -f packaging/crds/ (404) or packaging/rbac/ (403)")]
    names = [str(item["metadata"]["name"]) for item in found]
    if len(names) == 1:
        return [Finding("bgp.router", OK, f"{names[0]} targets node {name!r} in {namespace!r}")]
    return [Finding("bgp.router", FAIL, f"{len(names)} BGPRouters target node {name!r} in "
                    f"{namespace!r}" + (f": {', '.join(names)}" if names else ""),
                    "create one (docs/quickstart.md) with spec.targetRef {kind: Node, name: "
                    f"{name}}}" if not names else "delete all but one")]


def tenancy(node: Node) -> list[Finding]:
    """The tenancy mode (SPEC §14), and whether the VPCBinding CRD it reads is installed."""
    mode = node.settings.tenancy_mode
    why = "" if node.settings.tenancy else (" (no kubeconfig)" if mode == "off" else
                                            " (the default with a kubeconfig)")
    found = [Finding("tenancy.mode", OK, f"{mode}{why}")]
    if mode == "off":
        return found
    if node.client is None:
        return [*found, Finding("tenancy.crd", SKIP, "the API server is not reachable")]
    try:
        listed = node.client.request("GET", Target(BINDINGS), Deadline(API_SECONDS),
                                     query={"limit": "500"})
    except (CniError, ApiError) as exc:
        missing = isinstance(exc, ApiError) and exc.status == 404
        return [*found, Finding(
            "tenancy.crd", FAIL if mode == "enforce" else WARN,
            "the VPCBinding CRD is not installed: every ADD is denied" if missing else
            f"cannot list VPCBindings: {exc}",
            "kubectl apply -f packaging/crds/vpc-attach.datum.net_vpcbindings.yaml" if missing
            else "kubectl apply -f packaging/rbac/")]
    count = len(listed.get("items") or [])
    return [*found, Finding("tenancy.crd", OK if count else WARN, f"VPCBinding CRD installed, "
                            f"{count} binding(s)" + ("" if count else ": every ADD is denied"),
                            "" if count else "create the VPCBindings your namespaces need "
                            "(docs/configuration.md)")]


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

