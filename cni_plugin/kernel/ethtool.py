"""A link's offload features over ethtool's generic netlink family (`ETHTOOL_MSG_FEATURES_GET`
/ `_SET`, Linux 5.6+), on the standard library: no `ethtool` binary, no ioctl string tables
(features are named in the request itself).

Used to keep GSO packets away from galactic's `usid_egress` (SPEC §15): a veth whose
segmentation offloads are off makes the stack segment in software before the packet crosses.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cni_plugin.kernel.rtnl import (
    NLA_F_NESTED,
    NetlinkError,
    Rtnl,
    as_str,
    attr,
    attr_str,
    attr_u32,
    iter_attrs,
    parse_attrs,
)

if TYPE_CHECKING:
    from cni_plugin.core.deadline import Deadline

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
FAMILY = "ethtool"
VERSION = 1

ETHTOOL_MSG_FEATURES_GET, ETHTOOL_MSG_FEATURES_SET = 11, 12
ETHTOOL_A_HEADER_DEV_INDEX, ETHTOOL_A_HEADER_FLAGS = 1, 3
ETHTOOL_FLAG_OMIT_REPLY = 1 << 1
ETHTOOL_A_FEATURES_HEADER, ETHTOOL_A_FEATURES_HW = 1, 2
ETHTOOL_A_FEATURES_WANTED, ETHTOOL_A_FEATURES_ACTIVE = 3, 4
ETHTOOL_A_FEATURES_NOCHANGE = 5
ETHTOOL_A_BITSET_NOMASK, ETHTOOL_A_BITSET_BITS = 1, 3
ETHTOOL_A_BITSET_BITS_BIT = 1
ETHTOOL_A_BITSET_BIT_INDEX, ETHTOOL_A_BITSET_BIT_NAME, ETHTOOL_A_BITSET_BIT_VALUE = 1, 2, 3

_GENLMSGHDR = struct.Struct("=BBH")  # cmd, version, reserved
_U16 = struct.Struct("=H")  # CTRL_ATTR_FAMILY_ID

# Features that let a packet of several segments cross a device (veth: NETIF_F_GSO_SOFTWARE and
# the tunnel types), by `ethtool -k`'s names: every "tx-...-segmentation" (TCP v4/v6, ECN,
# mangleid, AccECN, UDP, SCTP, GRE, IPIP, UDP tunnels; the list grows with the kernel) but
# generic segmentation (the stack's own, in software before the device), and fraglist GSO.
GENERIC_SEGMENTATION = "tx-generic-segmentation"
OTHER_GSO = ("tx-gso-list", "tx-gso-partial")
# Features that merge received segments into one packet before TC ingress sees it: GRO
# (generic-receive-offload), hardware GRO, LRO, fraglist GRO.
RECEIVE_AGGREGATION = ("rx-gro", "rx-gro-hw", "rx-lro", "rx-gro-list")


@dataclass(frozen=True)
class Features:
    """A link's features by name: which the driver lets change (`hw`) and which are on."""

    changeable: frozenset[str]
    active: frozenset[str]


def nested(kind: int, *children: bytes) -> bytes:
    """A nested attribute flagged NLA_F_NESTED (ethtool's policies refuse one without)."""
    return attr(kind | NLA_F_NESTED, b"".join(children))


def genl_header(command: int) -> bytes:
    """The generic netlink header after nlmsghdr."""
    return _GENLMSGHDR.pack(command, VERSION, 0)


def family_request(name: str) -> bytes:
    """CTRL_CMD_GETFAMILY for a family by name."""
    return _GENLMSGHDR.pack(CTRL_CMD_GETFAMILY, 1, 0) + attr_str(CTRL_ATTR_FAMILY_NAME, name)


def header(ifindex: int, flags: int = 0) -> bytes:
    """ETHTOOL_A_FEATURES_HEADER naming the link by index."""
    return nested(ETHTOOL_A_FEATURES_HEADER, attr_u32(ETHTOOL_A_HEADER_DEV_INDEX, ifindex),
                  *([attr_u32(ETHTOOL_A_HEADER_FLAGS, flags)] if flags else []))


def features_get_request(ifindex: int) -> bytes:
    """ETHTOOL_MSG_FEATURES_GET for one link (bitsets in their verbose form: names)."""
    return genl_header(ETHTOOL_MSG_FEATURES_GET) + header(ifindex)


def features_set_request(ifindex: int, wanted: dict[str, bool]) -> bytes:
    """ETHTOOL_MSG_FEATURES_SET: the named features on (True) or off (False), others as
    they are (a bitset with a mask: only the bits listed)."""
    bits = [nested(ETHTOOL_A_BITSET_BITS_BIT, attr_str(ETHTOOL_A_BITSET_BIT_NAME, name),
                   *([attr(ETHTOOL_A_BITSET_BIT_VALUE, b"")] if on else []))
            for name, on in sorted(wanted.items())]
    return genl_header(ETHTOOL_MSG_FEATURES_SET) + header(ifindex, ETHTOOL_FLAG_OMIT_REPLY) + \
        nested(ETHTOOL_A_FEATURES_WANTED, nested(ETHTOOL_A_BITSET_BITS, *bits))


def bitset_names(payload: bytes) -> tuple[frozenset[str], frozenset[str]]:
    """A verbose bitset: (names listed, names whose value is set). Without a mask
    (NOMASK) the kernel lists only the bits that are set."""
    attrs = parse_attrs(payload)
    listed, on = set(), set()
    for kind, bit in iter_attrs(attrs.get(ETHTOOL_A_BITSET_BITS, b"")):
        if kind != ETHTOOL_A_BITSET_BITS_BIT:
            continue
        fields = parse_attrs(bit)
        name = as_str(fields.get(ETHTOOL_A_BITSET_BIT_NAME, b""))
        if not name:
            continue
        listed.add(name)
        if ETHTOOL_A_BITSET_NOMASK in attrs or ETHTOOL_A_BITSET_BIT_VALUE in fields:
            on.add(name)
    return frozenset(listed), frozenset(on)


def decode_features(payload: bytes) -> Features:
    """An ETHTOOL_MSG_FEATURES_GET_REPLY (after its genl header)."""
    attrs = parse_attrs(payload, _GENLMSGHDR.size)
    _, changeable = bitset_names(attrs.get(ETHTOOL_A_FEATURES_HW, b""))
    _, active = bitset_names(attrs.get(ETHTOOL_A_FEATURES_ACTIVE, b""))
    return Features(changeable, active)


class Ethtool:
    """ethtool's netlink family on a generic netlink socket of the calling thread's netns."""

    def __init__(self, timeout: float, deadline: Deadline | None = None) -> None:
        self._socket = Rtnl(timeout, deadline, protocol=NETLINK_GENERIC)
        try:
            self.family = self._family_id()
        except BaseException:
            self._socket.close()
            raise

    def close(self) -> None:
        """Close the socket."""
        self._socket.close()

    def __enter__(self) -> Ethtool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _family_id(self) -> int:
        try:
            replies = self._socket.request(GENL_ID_CTRL, family_request(FAMILY))
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:
                raise NetlinkError(errno.EOPNOTSUPP, "this kernel has no ethtool netlink "
                                   "interface (Linux 5.6 or later has it)") from None
            raise
        for reply in replies:
            found = parse_attrs(reply.payload, _GENLMSGHDR.size).get(CTRL_ATTR_FAMILY_ID)
            if found is not None:
                return int(_U16.unpack_from(found)[0])
        raise NetlinkError(errno.EBADMSG, "the kernel named no id for the ethtool family")

    def features(self, ifindex: int) -> Features:
        """The link's changeable and active features."""
        replies = self._socket.request(self.family, features_get_request(ifindex))
        if not replies:
            raise NetlinkError(errno.EBADMSG, f"no features answered for ifindex {ifindex}")
        return decode_features(replies[0].payload)

    def set_features(self, ifindex: int, wanted: dict[str, bool]) -> None:
        """Turn the named features on or off (the kernel refuses a name it does not know)."""
        if wanted:
            self._socket.request(self.family, features_set_request(ifindex, wanted))


def segmentation_offloads(names: Iterable[str]) -> frozenset[str]:
    """Which of the feature names are segmentation offloads (see OTHER_GSO's comment)."""
    return frozenset(name for name in names if name in OTHER_GSO or (
        name.endswith("-segmentation") and name != GENERIC_SEGMENTATION))


def segmentation_offloads_on(features: Features) -> frozenset[str]:
    """The segmentation offloads on: a packet of several segments can cross the link."""
    return segmentation_offloads(features.active)


def receive_aggregation_on(features: Features) -> frozenset[str]:
    """The receive offloads on that hand TC ingress one packet for several segments."""
    return features.active & frozenset(RECEIVE_AGGREGATION)


def turn_off_segmentation_offloads(ethtool: Ethtool, ifindex: int) -> frozenset[str]:
    """Turn off every segmentation offload that is on; the ones still on after (a driver that
    cannot turn them off)."""
    features = ethtool.features(ifindex)
    ethtool.set_features(ifindex, dict.fromkeys(
        sorted(segmentation_offloads_on(features) & features.changeable), False))
    return segmentation_offloads_on(ethtool.features(ifindex))
