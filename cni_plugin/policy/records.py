"""The node's attachments as policy sees them: one record per attachment, written by ADD
(whichever path ran it) before it answers, removed by DEL and GC; the agent reads them to keep
the rules current after ADD answered (a restarted agent, too). Beside them, the agent's report
of its last pass (STATUS_FILE), which doctor reads.

Both carry formatVersion (SPEC §18, netconf/formats.py) and always have: release 041aa67, the
previous one, predates policy, so a file here without it is no release's and read as damaged.
One a newer release wrote is refused with code 108 naming it, never skipped as damaged: no ADD,
agent pass or GC acts on the node's records without it (docs/architecture.md, "On-node
formats")."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from cni_plugin.core.records import write_record
from cni_plugin.kube.networks import NetworkName
from cni_plugin.policy.networks import PRIMARY, NetworkRef, PodKey
from netconf.formats import FORMAT_KEY, check_format, versioned

if TYPE_CHECKING:
    from cni_plugin.policy.compile import Endpoint, Target

DIRECTORY = "policy"
STATUS_FILE = "status.json"  # the agent's report of its last pass, for doctor
RECORD = "the policy record of an attachment"
STATUS = "the policy keeper's status"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class LocalAttachment:
    """An attachment on this node: where its rules go and what they are for."""

    container_id: str
    ifname: str
    kind: str  # veth (rules in the Pod's netns) or tap (tc filters on host_link)
    netns: str  # the Pod's netns path (veth)
    host_link: str
    vpc: str
    vpcattachment: str
    zone: int  # the VPC's table id: its conntrack zone on a tap
    pod: PodKey
    network: NetworkRef
    addresses: tuple[str, ...] = field(default=())
    network_name: str = ""  # the CNI network (config name) that made it: GC's scope

    @property
    def key(self) -> str:
        """container/ifname."""
        return f"{self.container_id}/{self.ifname}"

    def target(self) -> Target:
        """What the compiler enforces for."""
        from cni_plugin.policy.compile import Target
        return Target(self.pod.namespace, self.pod.name, self.network, self.vpc)

    def endpoint(self) -> Endpoint:
        """It as a peer of other attachments."""
        from cni_plugin.policy.compile import Endpoint
        return Endpoint(self.pod.namespace, self.pod.name, self.network, self.vpc,
                        tuple(ipaddress.ip_address(a) for a in self.addresses))

    def describe(self) -> str:
        """`Pod namespace/name interface (kind host_link)`, how Events name it."""
        return (f"Pod {self.pod.namespace}/{self.pod.name} interface {self.ifname} "
                f"({self.kind} {self.host_link})")


def record_path(lock_dir: str, container_id: str, ifname: str) -> str:
    """The attachment's record under the lock directory."""
    name = _UNSAFE.sub("_", f"{container_id}-{ifname}")
    return os.path.join(lock_dir, DIRECTORY, f"{name}.json")


def write(lock_dir: str, attachment: LocalAttachment) -> None:
    """Record the attachment (whole or not at all)."""
    body = asdict(attachment)
    body["network"] = None if attachment.network is None else str(attachment.network)
    write_record(record_path(lock_dir, attachment.container_id, attachment.ifname),
                 json.dumps(versioned(body), sort_keys=True),
                 "the attachment's policy record")


def remove(lock_dir: str, container_id: str, ifname: str) -> None:
    """Forget the attachment (nothing when there is no record)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(lock_dir, container_id, ifname))


def read_all(lock_dir: str) -> Iterator[LocalAttachment]:
    """Every readable record; a damaged one is skipped (GC removes what it does not list), one
    a newer release wrote is code 108 naming it."""
    directory = os.path.join(lock_dir, DIRECTORY)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(".json") or name == STATUS_FILE:
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as handle:
                body = json.load(handle)
        except (OSError, ValueError):
            continue  # removed meanwhile (a DEL), or damaged
        attachment = _readable(body, path)
        if attachment is not None:
            yield attachment


def _readable(body: object, path: str) -> LocalAttachment | None:
    """The record's attachment; None when it is damaged (code 108 passes)."""
    try:
        return parse(body, path)
    except (ValueError, KeyError, TypeError):
        return None


def parse(body: object, path: str) -> LocalAttachment:
    """A record's body (ValueError, KeyError or TypeError when damaged, as one without
    formatVersion is); code 108 naming `path` when a newer release wrote it."""
    check_format(body, path, RECORD)
    if not isinstance(body, dict) or FORMAT_KEY not in body:
        raise ValueError(f"{path}: no {FORMAT_KEY} (every release writing it wrote one)")
    network = body.get("network")
    namespace, _, name = str(network or "").partition("/")
    pod = body["pod"]
    return LocalAttachment(
        str(body["container_id"]), str(body["ifname"]), str(body["kind"]), str(body["netns"]),
        str(body["host_link"]), str(body["vpc"]), str(body["vpcattachment"]),
        int(body["zone"]), PodKey(str(pod["namespace"]), str(pod["name"]), str(pod["uid"])),
        PRIMARY if network is None else NetworkName(namespace, name),
        tuple(str(a) for a in body.get("addresses") or ()), str(body.get("network_name") or ""))


def remove_except(lock_dir: str, network_name: str, valid: set[tuple[str, str]]) -> int:
    """GC: forget the network's attachments the runtime no longer lists; how many."""
    removed = 0
    for attachment in list(read_all(lock_dir)):
        if attachment.network_name == network_name and \
                (attachment.container_id, attachment.ifname) not in valid:
            remove(lock_dir, attachment.container_id, attachment.ifname)
            removed += 1
    return removed


def status_path(lock_dir: str) -> str:
    """Where the agent reports its last pass."""
    return os.path.join(lock_dir, DIRECTORY, STATUS_FILE)


def write_status(lock_dir: str, status: dict[str, Any]) -> None:
    """The agent's report of its last pass (whole or not at all). Rewritten by every pass:
    a report, no state, so one a newer release left is replaced, not refused."""
    write_record(status_path(lock_dir), json.dumps(versioned(status), sort_keys=True),
                 "the policy status")


def read_status(lock_dir: str) -> dict[str, Any] | None:
    """The agent's last report; None when there is none or it is damaged (as one without
    formatVersion is); code 108 naming the file when a newer release wrote it."""
    path = status_path(lock_dir)
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    check_format(found, path, STATUS)
    return found if isinstance(found, dict) and FORMAT_KEY in found else None
