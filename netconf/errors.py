"""The CNI error object and the codes vpc-attach answers with.

Codes 1-11 and 50-51 are the CNI spec's; 100+ are ours, documented in docs/configuration.md.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`: the executable's VERSION path imports this module
if TYPE_CHECKING:
    from typing import Any

INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
STATUS_NOT_AVAILABLE = 50
STATUS_LIMITED = 51
# Plugin-specific codes.
KERNEL_FAILURE = 100  # a netlink/sysctl operation failed
IPAM_FAILURE = 101  # reserved: a failing IPAM delegate's own code is passed through instead
IPAM_EXHAUSTED = 102  # vpc-attach-ipam: no free address in the pool, or not the requested one
CHECK_MISMATCH = 103  # CHECK found a difference from prevResult
PUBLISH_FAILURE = 104  # the API server refused for a non-transient reason (401 is code 11)
INTERFACE_CONFLICT = 105  # the interface exists and belongs to nobody we know
TENANCY_DENIED = 106  # no VPCBinding admits the Pod's namespace to the VPC attachment
DATAPATH_MISMATCH = 107  # galactic's pinned datapath has a layout vpc-attach does not write
NEWER_FORMAT = 108  # a file on the node was written by a newer vpc-attach (formatVersion)
INTERNAL_ERROR = 199  # a bug: an unexpected exception (never a traceback on stdout)


class CniError(Exception):
    """An error that is answered to the runtime as a CNI error object."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict[str, Any]:
        """The error object of the CNI spec, in the version the caller asked for."""
        return {"cniVersion": cni_version, "code": self.code, "msg": self.msg,
                "details": self.details}

    def __repr__(self) -> str:
        return f"CniError({self.code}, {self.msg!r}, {self.details!r})"


def quoted(name: str) -> str:
    """A key name as messages show it: repr's quoting, but always in single quotes (repr switches
    to double quotes for a name with a quote in it, and tests and users look for 'key')."""
    shown = repr(name)
    return shown if shown[0] == "'" else "'" + shown[1:-1].replace("'", "\\'") + "'"
