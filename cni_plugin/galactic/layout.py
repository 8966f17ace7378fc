"""galactic's eBPF uSID maps as vpc-attach writes them: names, layouts and row encodings (pure).

The layouts are those of galactic's `usid.c` at the commit vpc-attach is compatible with (the
commit in ``shared/peers``): keys and values in the host's byte order, as galactic's Go side
writes them (cilium/ebpf's native-endian marshalling), packed where `usid.c` packs them. A pin
whose layout differs is never written (`pins.check_layout`). What each row means:
docs/architecture.md#galactics-datapath.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from cni_plugin.kernel.bpf import BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LPM_TRIE

DEFAULT_PIN_DIR = "/sys/fs/bpf/galactic"  # galactic's attach.PinDir
USID_EGRESS_PIN = "usid_egress_prog"  # attach.UsidEgressPinName
USID_EGRESS_PROGRAM = "usid_egress"  # its name as loaded (the kernel keeps 15 characters)
EGRESS_FILTER_NAME = "galactic_usid_egress"  # attach.egressFilterName
EGRESS_FILTER_PRIORITY = 1  # attach.defaultFilterPriority
# On a tap, after the policy's stateful filters (cni_plugin/policy/tc.py, priorities 100-106):
# a VM's packets to other nodes pass them before usid_egress redirects them (galactic's own
# attach takes its priority from GALACTIC_CNI_EBPF_FILTER_PRIORITY for the same reason).
TAP_EGRESS_FILTER_PRIORITY = 0xC000
EGRESS_FILTER_HANDLE = 1  # netlink.MakeHandle(0, 1)

BLOCK_BITS = 48
NODE_ID_BITS = 16
FUNCTION_BITS = 4
ARGUMENT_BITS = 12
BLOCK_MAX = (1 << BLOCK_BITS) - 1
NODE_ID_MIN, NODE_ID_MAX = 0x0001, 0xDFFF  # uformat.NodeIDMin/Max
ARGUMENT_MIN, ARGUMENT_MAX = 0x001, 0xFFF  # uformat.ArgumentMin/Max
FUNCTION_END_DT46 = 0xE
BEHAVIOR_END_DT46 = 1  # usid.c enum function_behavior
EGRESS_KIND_VETH = 0  # usid.c enum egress_kind: bpf_redirect_peer into the Pod's netns
EGRESS_KIND_TAP = 1  # plain bpf_redirect (a tap has no peer)
ROUTE_FAMILY_INET6 = 0  # USID_EGRESS_ROUTE_FAMILY_*
ROUTE_FAMILY_INET4 = 1
ROUTE_KEY_FIXED_BITS = 8 * (4 + 1)  # table_id + family, always matched in full
DEFAULT_PREFIX = ipaddress.IPv6Network("::/0")  # egressroutemap.DefaultPrefix


@dataclass(frozen=True)
class MapLayout:
    """What a pinned map must be for vpc-attach to write it."""

    name: str
    map_type: int
    key_size: int
    value_size: int

    def describe(self) -> str:
        """`type T, key K bytes, value V bytes`: for errors naming both layouts."""
        return describe_layout(self.map_type, self.key_size, self.value_size)


MAP_TYPE_NAMES = {BPF_MAP_TYPE_HASH: "hash", BPF_MAP_TYPE_ARRAY: "array",
                  BPF_MAP_TYPE_LPM_TRIE: "lpm_trie"}


def describe_layout(map_type: int, key_size: int, value_size: int) -> str:
    """A map's layout in words."""
    kind = MAP_TYPE_NAMES.get(map_type, f"type {map_type}")
    return f"{kind}, key {key_size} bytes, value {value_size} bytes"


_LOCATOR_KEY = struct.Struct("=Q")  # Block(48) << 16 | NodeID(16)
_LOCATOR_VALUE = struct.Struct("=Q")  # generation
_FUNCTION_KEY = struct.Struct("=Q")  # Block << 4 | Function
_FUNCTION_VALUE = struct.Struct("=I")  # behavior
_VRF_KEY = struct.Struct("=Q")  # Block << 12 | Argument
# vrf_table_id, egress_kind, packets, bytes, last_seen_ns, generation, dropped_packets
_VRF_VALUE = struct.Struct("=IIQQQQQ")
_IFINDEX_KEY = struct.Struct("=I")
_IFINDEX_VALUE = struct.Struct("=QH6x")  # block, argument, the struct's tail padding
_ROUTE_KEY = struct.Struct("=IIB16s")  # prefixlen (bits), table_id, family, addr (packed)
_ROUTE_VALUE = struct.Struct("=16sI6s6s")  # sid, link_ifindex, dmac, smac (packed)
_ARRAY_KEY = struct.Struct("=I")
_UPLINK_VALUE = struct.Struct("=I6s6s")  # link_ifindex, dmac, smac

LOCATOR_TABLE = MapLayout("locator_table", BPF_MAP_TYPE_HASH, _LOCATOR_KEY.size,
                          _LOCATOR_VALUE.size)
FUNCTION_TABLE = MapLayout("function_table", BPF_MAP_TYPE_HASH, _FUNCTION_KEY.size,
                           _FUNCTION_VALUE.size)
VRF_TABLE = MapLayout("vrf_table", BPF_MAP_TYPE_HASH, _VRF_KEY.size, _VRF_VALUE.size)
IFINDEX_VRF_TABLE = MapLayout("ifindex_vrf_table", BPF_MAP_TYPE_HASH, _IFINDEX_KEY.size,
                              _IFINDEX_VALUE.size)
EGRESS_ROUTE_TABLE = MapLayout("egress_route_table", BPF_MAP_TYPE_LPM_TRIE, _ROUTE_KEY.size,
                               _ROUTE_VALUE.size)
NODE_SRC_ADDR_TABLE = MapLayout("node_src_addr_table", BPF_MAP_TYPE_ARRAY, _ARRAY_KEY.size, 16)
PUBLIC_UPLINK_TABLE = MapLayout("public_uplink_table", BPF_MAP_TYPE_ARRAY, _ARRAY_KEY.size,
                                _UPLINK_VALUE.size)
# Every map vpc-attach reads or writes, in the order an attachment's rows are written.
MAPS = (LOCATOR_TABLE, FUNCTION_TABLE, VRF_TABLE, IFINDEX_VRF_TABLE, EGRESS_ROUTE_TABLE,
        NODE_SRC_ADDR_TABLE, PUBLIC_UPLINK_TABLE)

PASS_THROUGH = bytes(_ROUTE_VALUE.size)  # link_ifindex 0: "deliver locally" (usid_egress)
ARRAY_ONLY_KEY = _ARRAY_KEY.pack(0)  # node_src_addr_table and public_uplink_table hold one row


def block_of(locator: str) -> int:
    """The 48-bit uSID Block of an SRv6 locator (its first 48 bits; uformat.Block)."""
    network = ipaddress.IPv6Network(locator, strict=False)
    return int(network.network_address) >> (128 - BLOCK_BITS)


def check_node_id(node_id: int) -> None:
    """ValueError unless galactic's datapath accepts the node ID (uformat.ValidateNodeID)."""
    if not NODE_ID_MIN <= node_id <= NODE_ID_MAX:
        raise ValueError(f"node ID {node_id:#x} out of range [{NODE_ID_MIN:#x},{NODE_ID_MAX:#x}]")


def check_argument(argument: int) -> None:
    """ValueError unless the VRF ID is a uSID Argument (uformat.ValidateArgument)."""
    if not ARGUMENT_MIN <= argument <= ARGUMENT_MAX:
        raise ValueError(f"VRF ID {argument:#x} out of range "
                         f"[{ARGUMENT_MIN:#x},{ARGUMENT_MAX:#x}]")


def _check_block(block: int) -> None:
    if not 0 <= block <= BLOCK_MAX:
        raise ValueError(f"block {block:#x} overflows 48 bits")


def locator_key(block: int, node_id: int) -> bytes:
    """locator_table's key: Block << 16 | NodeID."""
    _check_block(block)
    check_node_id(node_id)
    return _LOCATOR_KEY.pack(block << NODE_ID_BITS | node_id)


def locator_value(generation: int) -> bytes:
    """locator_table's value: the generation (CLOCK_MONOTONIC ns at registration)."""
    return _LOCATOR_VALUE.pack(generation)


def function_key(block: int, function: int = FUNCTION_END_DT46) -> bytes:
    """function_table's key: Block << 4 | Function."""
    _check_block(block)
    return _FUNCTION_KEY.pack(block << FUNCTION_BITS | function)


def function_value(behavior: int = BEHAVIOR_END_DT46) -> bytes:
    """function_table's value: the behaviour (End.DT46)."""
    return _FUNCTION_VALUE.pack(behavior)


def vrf_key(block: int, argument: int) -> bytes:
    """vrf_table's key: Block << 12 | Argument (the VRF ID)."""
    _check_block(block)
    check_argument(argument)
    return _VRF_KEY.pack(block << ARGUMENT_BITS | argument)


def decode_vrf_key(key: bytes) -> tuple[int, int]:
    """(block, argument) of a vrf_table key."""
    (raw,) = _VRF_KEY.unpack(key)
    return raw >> ARGUMENT_BITS, raw & ARGUMENT_MAX


@dataclass(frozen=True)
class VrfRow:
    """One vrf_table value: the Linux table a SID's Argument decapsulates into, how to hand a
    packet to the workload, the registration's generation, and the datapath's counters."""

    table_id: int
    egress_kind: int
    packets: int = 0
    octets: int = 0  # usid.c's `bytes`
    last_seen_ns: int = 0
    generation: int = 0
    dropped_packets: int = 0

    def encode(self) -> bytes:
        """The value's bytes."""
        return _VRF_VALUE.pack(self.table_id, self.egress_kind, self.packets, self.octets,
                               self.last_seen_ns, self.generation, self.dropped_packets)

    @classmethod
    def decode(cls, value: bytes) -> VrfRow:
        """From the value's bytes."""
        return cls(*_VRF_VALUE.unpack(value))


def ifindex_key(ifindex: int) -> bytes:
    """ifindex_vrf_table's key: the host link's ifindex."""
    return _IFINDEX_KEY.pack(ifindex)


def decode_ifindex_key(key: bytes) -> int:
    """The ifindex of an ifindex_vrf_table key."""
    return int(_IFINDEX_KEY.unpack(key)[0])


def ifindex_value(block: int, argument: int) -> bytes:
    """ifindex_vrf_table's value: the (Block, Argument) the host link's packets belong to."""
    _check_block(block)
    check_argument(argument)
    return _IFINDEX_VALUE.pack(block, argument)


def decode_ifindex_value(value: bytes) -> tuple[int, int]:
    """(block, argument) of an ifindex_vrf_table value."""
    block, argument = _IFINDEX_VALUE.unpack(value)
    return int(block), int(argument)


def route_key(table_id: int, prefix: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bytes:
    """egress_route_table's LPM key for a prefix in a Linux table (egressroutemap.buildKey)."""
    family = ROUTE_FAMILY_INET4 if prefix.version == 4 else ROUTE_FAMILY_INET6
    address = prefix.network_address.packed.ljust(16, b"\0")
    return _ROUTE_KEY.pack(ROUTE_KEY_FIXED_BITS + prefix.prefixlen, table_id, family, address)


def decode_route_key(key: bytes) -> tuple[int, ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """(table_id, prefix) of an egress_route_table key."""
    bits, table_id, family, address = _ROUTE_KEY.unpack(key)
    length = bits - ROUTE_KEY_FIXED_BITS
    if family == ROUTE_FAMILY_INET4:
        return table_id, ipaddress.IPv4Network((address[:4], length), strict=False)
    return table_id, ipaddress.IPv6Network((address, length), strict=False)


@dataclass(frozen=True)
class EgressRoute:
    """One egress_route_table value: the SID to encapsulate toward and how to reach it."""

    sid: str
    link_ifindex: int
    dmac: str
    smac: str

    def encode(self) -> bytes:
        """The value's bytes."""
        return _ROUTE_VALUE.pack(ipaddress.IPv6Address(self.sid).packed, self.link_ifindex,
                                 _mac(self.dmac), _mac(self.smac))

    @classmethod
    def decode(cls, value: bytes) -> EgressRoute:
        """From the value's bytes."""
        sid, ifindex, dmac, smac = _ROUTE_VALUE.unpack(value)
        return cls(str(ipaddress.IPv6Address(sid)), ifindex, _mac_text(dmac), _mac_text(smac))


def node_src_value(address: str) -> bytes:
    """node_src_addr_table's value: the outer source address of encapsulated packets."""
    return ipaddress.IPv6Address(address).packed


def uplink_value(link_ifindex: int, dmac: str, smac: str) -> bytes:
    """public_uplink_table's value: the fabric uplink and its next hop's MAC."""
    return _UPLINK_VALUE.pack(link_ifindex, _mac(dmac), _mac(smac))


def _mac(text: str) -> bytes:
    raw = bytes.fromhex(text.replace(":", ""))
    if len(raw) != 6:
        raise ValueError(f"MAC address {text!r} is not 6 bytes")
    return raw


def _mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)
