"""The version of the files vpc-attach writes on a node (SPEC §18; the list of formats:
docs/architecture.md, "On-node formats").

`formatVersion` counts incompatible changes only. A release adds fields without changing it,
and ignores fields it does not know, so the previous release reads what the next one writes
and a rollback works. A file of a higher version than a reader knows is refused with code 108
(NEWER_FORMAT), never misread. A file without the key is what release 041aa67 wrote, the last
without it: format 1 as well. A file whose previous readers refuse any extra key (an exact
record, plain text) carries no key: the marker file of its directory says its version
(`cni_plugin.core.records`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from netconf.errors import NEWER_FORMAT, CniError

FORMAT_KEY = "formatVersion"
FORMAT_VERSION = 1  # what this release writes and the highest it reads


class NewerFormat(CniError):
    """Code 108: a file on the node was written by a newer vpc-attach than this one."""

    def __init__(self, what: str, path: str, version: object) -> None:
        super().__init__(
            NEWER_FORMAT, f"{what} {path!r} was written by a newer vpc-attach "
            f"(formatVersion {version!r}; this release reads up to {FORMAT_VERSION})",
            "roll the DaemonSet forward to that release again; nothing here acts on a file "
            "it cannot read (docs/operations.md, \"Upgrades\")")
        self.path = path


def versioned(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` with this release's formatVersion (first, for a reader of the file)."""
    return {FORMAT_KEY: FORMAT_VERSION, **body}


def check_format(data: object, path: str, what: str) -> None:
    """NewerFormat when `data` (a file's decoded JSON object) names a format this release does
    not read: a higher version, or one that is not a positive whole number."""
    if not isinstance(data, Mapping) or FORMAT_KEY not in data:
        return  # not an object (the caller's unreadable case), or the previous release's
    version = data[FORMAT_KEY]
    if isinstance(version, bool) or not isinstance(version, int) or \
            not 1 <= version <= FORMAT_VERSION:
        raise NewerFormat(what, path, version)
