"""A Pod's own choice of attachment (`vpcFromPod`): its annotation, read at ADD, and the
on-node record of what ADD used, which DEL, CHECK and GC read instead (the annotation may
change or vanish while the attachment lives)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from cni_plugin.core import naming
from cni_plugin.core.records import write_record as write_record_file
from cni_plugin.core.request import Invocation
from netconf.base62 import ATTACHMENT_LIMIT, VPC_LIMIT, decode_base62
from netconf.errors import INVALID_CONFIG, CniError
from netconf.formats import check_format, versioned
from netconf.result import Result

ANNOTATION = "vpc-attach.datum.net/attachment"
RECORDS_DIR = "attachments"  # under the host's lockDir


def from_annotation(pod: dict[str, Any] | None, where: str) -> tuple[str, str]:
    """(vpc, vpcattachment) from the Pod's annotation "<vpc>/<vpcattachment>"; code 7 naming
    the annotation when it is missing or malformed."""
    annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION)
    if pod is None:
        raise CniError(INVALID_CONFIG, f"vpcFromPod: Pod {where} not found",
                       f"the annotation {ANNOTATION} of the Pod names its attachment")
    if not isinstance(value, str):
        raise CniError(INVALID_CONFIG, f"vpcFromPod: Pod {where} has no annotation {ANNOTATION}",
                       'set it to "<vpc>/<vpcattachment>" (base62 identifiers)')
    vpc, sep, attachment = value.partition("/")
    if not sep or not vpc or not attachment or "/" in attachment:
        raise CniError(INVALID_CONFIG, f"vpcFromPod: malformed annotation {ANNOTATION}="
                       f"{value!r} on Pod {where}", 'expected "<vpc>/<vpcattachment>"')
    for what, text, limit in (("VPC", vpc, VPC_LIMIT), ("attachment", attachment,
                                                        ATTACHMENT_LIMIT)):
        try:
            valid = decode_base62(text) < limit
        except ValueError:
            valid = False
        if not valid:
            raise CniError(INVALID_CONFIG, f"vpcFromPod: annotation {ANNOTATION}={value!r} on "
                           f"Pod {where} names no valid {what}",
                           f"{what} {text!r} must be base62 (0-9a-zA-Z) below {limit}")
    return vpc, attachment


def record_path(inv: Invocation) -> str:
    """Where the (container, ifname)'s choice is recorded (container IDs hold no '@')."""
    return os.path.join(inv.host.lock_dir, RECORDS_DIR,
                        f"{inv.env.container_id}@{inv.env.ifname}.json")


def write_record(inv: Invocation) -> None:
    """Record the chosen attachment before anything is made with it (atomically)."""
    body = versioned({"network": inv.conf.name, "vpc": inv.conf.vpc,
                      "vpcattachment": inv.conf.vpcattachment})
    write_record_file(record_path(inv), json.dumps(body), "the attachment")


def remove_record(inv: Invocation) -> None:
    """Forget the choice (DEL done, or ADD rolled back)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(inv))


def read_record(path: str) -> dict[str, str] | None:
    """A record's fields, or None when it is absent or unreadable (code 108 when a newer
    release wrote it: never taken for absent)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    check_format(data, path, "the record of an attachment's vpcFromPod choice")
    if not isinstance(data, dict) or not all(
            isinstance(data.get(k), str) for k in ("network", "vpc", "vpcattachment")):
        return None
    return {k: data[k] for k in ("network", "vpc", "vpcattachment")}


def recorded(inv: Invocation) -> tuple[str, str] | None:
    """What ADD used for this container: its record, else our host link in prevResult."""
    record = read_record(record_path(inv))
    if record is not None:
        return record["vpc"], record["vpcattachment"]
    prev: Result | None = inv.conf.prev()
    for interface in prev.interfaces if prev is not None else []:
        parsed = naming.parse_host_link_name(interface.name)
        if parsed is not None:
            return parsed
    return None


def remove_records_except(lock_dir: str, network: str, valid: set[tuple[str, str]]) -> None:
    """GC: forget network's records of containers the runtime no longer knows."""
    for container_id, ifname, _vpc, _att in records_of(lock_dir, network):
        if (container_id, ifname) not in valid:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(lock_dir, RECORDS_DIR, f"{container_id}@{ifname}.json"))


def records_of(lock_dir: str, network: str) -> list[tuple[str, str, str, str]]:
    """(containerID, ifname, vpc, vpcattachment) of every record of network on this node
    (code 108 if a newer release wrote one: GC then touches none of them)."""
    directory = os.path.join(lock_dir, RECORDS_DIR)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        stem, dot, ext = name.rpartition(".")
        container_id, at, ifname = stem.partition("@")
        record = read_record(os.path.join(directory, name)) if dot and ext == "json" else None
        if at and record is not None and record["network"] == network:
            found.append((container_id, ifname, record["vpc"], record["vpcattachment"]))
    return found
