"""`vpc-attach doctor`: the format of what vpc-attach keeps on this node (SPEC §18). After a
rollback past a format change, files a newer release wrote are refused by every verb (code
108): this names them at once, and counts the files still in the previous release's format."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from cni_plugin.core.records import DIRECTORY_FORMAT
from cni_plugin.doctor.node import FAIL, OK, Finding, Node, host_file_of
from cni_plugin.galactic.record import RECORDS_DIR as REGISTRATIONS
from cni_plugin.ipam.plugin.claimed import CLAIMS_DIR
from cni_plugin.ipam.plugin.store import pool_directories
from cni_plugin.kernel.tableids import DIRECTORY as TABLES
from cni_plugin.kubevirt.migration import RECORDS_DIR as MIGRATIONS
from cni_plugin.policy.records import DIRECTORY as POLICY
from cni_plugin.tenancy.choice import RECORDS_DIR as CHOICES
from netconf.errors import CniError
from netconf.formats import FORMAT_KEY, FORMAT_VERSION, check_format
from netconf.host import ipam_data_root

SHOWN = 5  # newer files named in one line
# Directories of formats the previous release (041aa67) never wrote, which have carried
# formatVersion from their start: a file there without it is damaged, no release's format.
SINCE_PREVIOUS = (POLICY,)


def state_formats(node: Node) -> list[Finding]:
    """FAIL naming the files of a newer format than this release reads; OK with how many are
    of this release's format and how many of the previous one's (no formatVersion)."""
    newer: list[str] = []
    counts = {"this": 0, "previous": 0}
    since_previous = {os.path.join(node.settings.lock_dir, d) for d in SINCE_PREVIOUS}
    for path in _state_files(node):
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            continue  # plain-text files and damaged ones: the verbs say what they make of them
        try:
            check_format(data, path, "file")
        except CniError:
            newer.append(path)
            continue
        if isinstance(data, dict) and FORMAT_KEY in data:
            counts["this"] += 1
        elif isinstance(data, dict) and os.path.dirname(path) not in since_previous:
            counts["previous"] += 1
    if newer:
        return [Finding("state.formats", FAIL,
                        f"{len(newer)} file(s) written by a newer vpc-attach (this release reads "
                        f"formatVersion up to {FORMAT_VERSION}); every verb refuses them with "
                        f"code 108: {', '.join(newer[:SHOWN])}",
                        "roll the DaemonSet forward to that release again "
                        "(docs/operations.md, \"Upgrades\")")]
    return [Finding("state.formats", OK,
                    f"{counts['this']} file(s) of formatVersion {FORMAT_VERSION}, "
                    f"{counts['previous']} of the previous release's format (no formatVersion)")]


def _state_files(node: Node) -> Iterator[str]:
    """The JSON files and directory markers under the node's lockDir and IPAM data dirs."""
    lock_dir = node.settings.lock_dir
    for directory in (CHOICES, REGISTRATIONS, POLICY):
        yield from _json_files(os.path.join(lock_dir, directory))
    for directory in (MIGRATIONS, TABLES):
        yield os.path.join(lock_dir, directory, DIRECTORY_FORMAT)
    yield os.path.join(ipam_data_root(node.environ, host_file_of(node)), CLAIMS_DIR,
                       DIRECTORY_FORMAT)
    for data_dir in sorted(set(node.ipam_data_dirs)):
        for _network, _pool, path in pool_directories(data_dir):
            yield os.path.join(path, DIRECTORY_FORMAT)
            yield from (os.path.join(path, name) for name in _names(path)
                        if name[:1].isdigit() or ":" in name)
            yield from _json_files(os.path.join(path, "blocks"))


def _json_files(directory: str) -> Iterator[str]:
    yield from (os.path.join(directory, name) for name in _names(directory)
                if not name.startswith("."))


def _names(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []
