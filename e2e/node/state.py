"""Everything vpc-attach keeps for its attachments on a node, as parts to compare byte for byte
(SPEC §18: a roll of the DaemonSet leaves existing attachments exactly as they were).

Each part is one thing with a stable key — a link, its addresses, one route, one rule, one
permanent neighbour, one nftables object of `inet vpc_attach`, a host link's sysctls, one state
file, one API object — and its canonical text (JSON, sorted keys), read by a client
independent of vpc-attach: `ip -j`, `nft -j`, the files themselves, the official Kubernetes
client. Comparing two snapshots part by part names exactly what changed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.harness.kube import Kube
from e2e.node.node import Node

LINK_PREFIX = "G"  # vpc-attach's host links (G…H) and VRFs (G…V)
LOCK_DIR = "/run/vpc-attach/locks"  # the node's lockDir (host file default)
POLICY_RECORDS = "policy"  # lockDir/policy: ADD's record of each attachment (SPEC §17)
POLICY_STATUS = f"{POLICY_RECORDS}/status.json"
IPAM_ROOT = "/var/lib/cni/vpc-attach-ipam"  # the node's ipamDataRoot
GALACTIC_PINS = "/sys/fs/bpf/galactic"
COMMAND_S = 30.0
LINK_SYSCTLS = ("ipv4/conf/{}/rp_filter", "ipv4/conf/{}/proxy_arp", "ipv4/conf/{}/forwarding",
                "ipv6/conf/{}/forwarding", "ipv6/conf/{}/proxy_ndp")
# (API path template, label selector, kind) of the objects vpc-attach writes or whose status
# it writes; {bgp} is the node's BGP namespace.
API_OBJECTS = (
    ("/apis/network.datumapis.com/v1alpha1/namespaces/{bgp}/bgpvrfinstances", None,
     "BGPVRFInstance"),
    ("/apis/network.datumapis.com/v1alpha1/namespaces/{bgp}/bgpadvertisements", None,
     "BGPAdvertisement"),
    ("/apis/discovery.k8s.io/v1/endpointslices",
     "endpointslice.kubernetes.io/managed-by=vpc-attach", "EndpointSlice"),
    ("/apis/k8s.cni.cncf.io/v1alpha1/ipamclaims", None, "IPAMClaim"),
    ("/apis/vpc-attach.datum.net/v1alpha1/ipamblocks", None, "IPAMBlock"),
)
# Metadata the API server moves on any write, even one that changes nothing else: compared
# apart, so a difference there is named as such.
VOLATILE_METADATA = ("resourceVersion", "managedFields", "generation")


def not_attachment_state(key: str) -> bool:
    """Parts that belong to no attachment, so a roll's new ADDs may change them: a pool's
    cursor (`last_reserved`, where its next search starts), flock files (empty; kept), a
    directory's format marker (`.formatVersion`: written by this release where it writes) and
    the policy keeper's report of its last pass (`policy/status.json`, for doctor: this
    release's agent rewrites it at every pass)."""
    return key.endswith(("/last_reserved", ".lock", "/lock", "/.formatVersion")) or \
        key == f"file {LOCK_DIR}/{POLICY_STATUS}"


@dataclass(frozen=True)
class Pod:
    """A Pod's sandbox network namespace on the node (a node path) and its interfaces."""

    name: str
    netns: str
    interfaces: tuple[str, ...] = ("eth0",)


@dataclass(frozen=True)
class Snapshot:
    """The parts at one moment: key -> canonical JSON text."""

    parts: dict[str, str]

    def keys_of(self, *needles: str) -> set[str]:
        """The keys of attachment state that mention any of `needles` (a link name, a
        container ID, an address)."""
        return {key for key, text in self.parts.items() if not not_attachment_state(key)
                and any(needle in key or needle in text for needle in needles)}

    def tentative(self) -> list[str]:
        """Addresses whose duplicate address detection has not finished (the kernel clears
        the flag by itself a moment after an address is added)."""
        return [key for key, text in self.parts.items()
                if " addr " in f" {key} " and '"tentative": true' in text]


@dataclass
class Comparison:
    """How `after` differs from `before` on the keys compared."""

    missing: list[str] = field(default_factory=list)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    volatile_only: list[str] = field(default_factory=list)  # API metadata alone moved
    added: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """What differed, for the test's report."""
        return {"missing": self.missing, "changed": {k: {"before": b, "after": a}
                                                     for k, (b, a) in self.changed.items()},
                "resourceVersion/managedFields only": self.volatile_only,
                "added": self.added}


def compare(before: Snapshot, after: Snapshot, keys: Iterable[str] | None = None) -> Comparison:
    """Part by part on `keys` (default: every part of `before` that is an attachment's state
    or the node's: all but `not_attachment_state`); parts only `after` has are listed as
    added."""
    chosen = {key for key in before.parts if not not_attachment_state(key)} if keys is None \
        else set(keys)
    found = Comparison(added=sorted(set(after.parts) - set(before.parts)))
    for key in sorted(chosen):
        old, new = before.parts.get(key), after.parts.get(key)
        if new is None:
            found.missing.append(key)
        elif old != new:
            if old is not None and key.startswith("api ") and \
                    _without_volatile(old) == _without_volatile(new):
                found.volatile_only.append(key)
            else:
                found.changed[key] = (old or "", new)
    return found


def nft_without_handles(snap: Snapshot) -> list[str]:
    """The `inet vpc_attach` objects as nft lists them, without their handles and counter
    values, sorted: the same rules in a rewritten table compare equal."""
    found = []
    for key, text in snap.parts.items():
        if key.startswith("nft "):
            body = json.loads(text) if text.startswith("{") else text
            if isinstance(body, dict):
                body = {k: v for k, v in body.items() if k not in ("handle", "packets", "bytes")}
            found.append(_canonical(body))
    return sorted(found)


def snapshot(node: Node, kube: Kube, pods: Iterable[Pod] = ()) -> Snapshot:
    """Every part now: host links, addresses, routes, rules, neighbours, nftables, sysctls,
    state files, API objects, and each given Pod's side."""
    parts: dict[str, str] = {}
    host_links = [link for link in _ip(node, ["-d", "link", "show"])
                  if str(link.get("ifname", "")).startswith(LINK_PREFIX)]
    names = sorted(str(link["ifname"]) for link in host_links)
    for link in host_links:
        parts[f"link {link['ifname']}"] = _canonical(link)
    for entry in _ip(node, ["addr", "show"]):
        if entry.get("ifname") in names:
            parts[f"addr {entry['ifname']}"] = _canonical(entry.get("addr_info", []))
    parts.update(_routes(node, names))
    parts.update(_rules(node))
    for neighbour in _ip(node, ["neigh", "show", "nud", "permanent"]):
        if str(neighbour.get("dev", "")).startswith(LINK_PREFIX):
            parts[f"neigh {neighbour['dst']} dev {neighbour['dev']}"] = _canonical(neighbour)
    parts.update(_nftables())
    for name in names:
        parts[f"sysctl {name}"] = _canonical(_link_sysctls(name))
    parts.update(_files(node, "/run", LOCK_DIR.removeprefix("/run/")))
    parts.update(_files(node, "/var/lib/cni", IPAM_ROOT.removeprefix("/var/lib/cni/")))
    parts["galactic pins"] = _canonical(_galactic())
    parts.update(_api_objects(node, kube))
    for pod in pods:
        parts.update(_pod_side(node, pod))
    return Snapshot(parts)


# -- kernel ------------------------------------------------------------------------------------


def _ip(node: Node, args: list[str], netns: str | None = None,
        family: str | None = None) -> list[dict[str, Any]]:
    """`ip -j` in the host netns (the node's: it shares the host's), or in a Pod's, entered
    from the node's mount namespace (where the netns path is mounted)."""
    argv = ["ip", "-j", *([family] if family else []), *args]
    if netns is not None:
        output = node.namespace.run(["nsenter", f"--net={netns}", *argv])
    else:
        output = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_S,
                                check=True, stdin=subprocess.DEVNULL).stdout
    decoded: list[dict[str, Any]] = json.loads(output or "[]")
    return decoded


def _routes(node: Node, links: list[str]) -> dict[str, str]:
    """Routes through vpc-attach links or in a table other than the kernel's own ones (the
    VPCs' tables), one part each; the main table's routes of other links are not ours."""
    parts: dict[str, str] = {}
    for family in ("-4", "-6"):
        for route in _ip(node, ["-d", "route", "show", "table", "all"], family=family):
            table = str(route.get("table", "main"))
            ours = route.get("dev") in links or table not in ("main", "local", "default")
            if ours:
                key = f"route {family} table {table} {route.get('type', 'unicast')} " \
                      f"{route.get('dst')} dev {route.get('dev', '-')}"
                parts[key] = _canonical(route)
    return parts


def _rules(node: Node) -> dict[str, str]:
    parts: dict[str, str] = {}
    for family in ("-4", "-6"):
        for rule in _ip(node, ["rule", "show"], family=family):
            parts[f"rule {family} {_canonical(rule)}"] = _canonical(rule)
    return parts


def _nftables() -> dict[str, str]:
    """One part per object of `inet vpc_attach` (chains and rules keyed with their handles, so
    a rewritten table shows as different objects); one saying so without the table."""
    proc = subprocess.run(["nft", "-j", "list", "table", "inet", "vpc_attach"],
                          capture_output=True, text=True, timeout=COMMAND_S, check=False,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        return {"nft table": f"absent: {proc.stderr.strip()}"}
    listed = json.loads(proc.stdout)
    parts: dict[str, str] = {}
    for item in listed.get("nftables", []):
        for kind, body in item.items():
            if kind == "metainfo":
                continue
            name = body.get("name") or body.get("chain", "")
            key = f"nft {kind} {name} handle {body.get('handle')}"
            parts[key] = _canonical(body)
    return parts


def _link_sysctls(link: str) -> dict[str, str]:
    """The host link's sysctls ADD sets (the node shares the host's network namespace)."""
    values = {}
    for template in LINK_SYSCTLS:
        path = Path("/proc/sys/net") / template.format(link)
        try:
            values[str(path)] = path.read_text().strip()
        except OSError as exc:
            values[str(path)] = f"unreadable: {exc.strerror}"
    return values


def _galactic() -> str:
    """galactic's pinned maps are compared where they exist; here: whether they do (the node
    shares the host's bpffs)."""
    if Path(GALACTIC_PINS).is_dir():
        return f"pinned at {GALACTIC_PINS}"
    return f"not pinned on this node ({GALACTIC_PINS} absent)"


def _pod_side(node: Node, pod: Pod) -> dict[str, str]:
    parts: dict[str, str] = {}
    for link in _ip(node, ["-d", "link", "show"], netns=pod.netns):
        if link.get("ifname") in pod.interfaces:
            parts[f"pod {pod.name} link {link['ifname']}"] = _canonical(link)
    for entry in _ip(node, ["addr", "show"], netns=pod.netns):
        if entry.get("ifname") in pod.interfaces:
            parts[f"pod {pod.name} addr {entry['ifname']}"] = _canonical(entry.get("addr_info"))
    for family in ("-4", "-6"):
        routes = _ip(node, ["route", "show", "table", "all"], netns=pod.netns, family=family)
        parts[f"pod {pod.name} routes {family}"] = _canonical(
            [r for r in routes if r.get("dev") in pod.interfaces])
    return parts


# -- files and API objects ---------------------------------------------------------------------


def _files(node: Node, bound: str, below: str) -> dict[str, str]:
    """Every file under the node path `bound`/`below` with its text (lock files: their
    existence), read from the host directory behind the node's bound path."""
    root = node.host_path(bound)
    parts: dict[str, str] = {}
    for path in sorted((root / below).rglob("*")):
        if not path.is_file():
            continue
        name = f"file {bound}/{path.relative_to(root)}"
        try:
            parts[name] = "(lock file)" if path.name == "lock" or path.suffix == ".lock" \
                else path.read_text(errors="replace")
        except FileNotFoundError:  # removed while listed (an ADD's temporary file)
            continue
    return parts


def _api_objects(node: Node, kube: Kube) -> dict[str, str]:
    parts: dict[str, str] = {}
    for template, labels, kind in API_OBJECTS:
        path = template.format(bgp=node.cluster.bgp_namespace)
        for item in kube.list(path, labels=labels):
            meta = item["metadata"]
            key = f"api {kind} {meta.get('namespace', '')}/{meta['name']}"
            parts[key] = _canonical({"kind": kind, **item})
    return parts


def _without_volatile(text: str) -> str:
    body = json.loads(text)
    for key in VOLATILE_METADATA:
        body.get("metadata", {}).pop(key, None)
    return _canonical(body)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def differing(report: Mapping[str, Any]) -> bool:
    """Whether a comparison's report lists anything but additions."""
    return any(report[key] for key in ("missing", "changed", "resourceVersion/managedFields only"))
