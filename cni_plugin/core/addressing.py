"""The addresses of one attachment, derived from an IPAM result (SPEC §5): what the workload
gets and which gateway answers it, per IP version. Pure data, shared by kernel and publishing."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from netconf.result import IPConfig, Result, Route

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Used when the IPAM result names no gateway: link-local, so no VPC address is consumed.
DEFAULT_GATEWAYS: dict[int, IPAddr] = {
    4: ipaddress.IPv4Address("169.254.1.1"),
    6: ipaddress.IPv6Address("fe80::1"),
}
DEFAULT_DST = {4: ipaddress.ip_network("0.0.0.0/0"), 6: ipaddress.ip_network("::/0")}


@dataclass(frozen=True)
class Addressing:
    """The addresses of one attachment: the workload's, and the gateway per IP version."""

    workload: tuple[IPInterface, ...]
    gateways: dict[int, IPAddr]

    @classmethod
    def from_result(cls, result: Result) -> Addressing:
        """IPv6 as IPAM returned it, IPv4 as /32; gateways from IPAM or link-local defaults."""
        workload: list[IPInterface] = []
        gateways: dict[int, IPAddr] = {}
        for ip in result.ips:
            addr = ip.ip
            if addr.version == 4:
                addr = ipaddress.ip_interface(f"{addr.ip}/32")
            if addr not in workload:
                workload.append(addr)
            if ip.gateway and addr.version not in gateways:
                gateways[addr.version] = ipaddress.ip_address(ip.gateway)
        for version in {a.version for a in workload}:
            gateways.setdefault(version, DEFAULT_GATEWAYS[version])
        return cls(tuple(workload), gateways)

    def advertised(self, host_only: bool) -> tuple[IPNetwork, ...]:
        """What the attachment is advertised as (SPEC §6): its first IPv6 address's network
        (the host alone when `host_only`: an earlier plugin's pool is shared), its first IPv4
        address as /32."""
        found: dict[int, IPNetwork] = {}
        for addr in self.workload:
            if addr.version not in found:
                found[addr.version] = addr.network if addr.version == 6 and not host_only \
                    else ipaddress.ip_network(f"{addr.ip}/{addr.max_prefixlen}")
        return tuple(found[v] for v in sorted(found, reverse=True))

    @property
    def versions(self) -> set[int]:
        """IP versions present."""
        return {a.version for a in self.workload}

    def result_ips(self, interface: int) -> list[IPConfig]:
        """ips[] of the result, pointing at interface index `interface`."""
        return [IPConfig(address=str(a), gateway=str(self.gateways[a.version]),
                         interface=interface) for a in self.workload]

    def result_routes(self) -> list[Route]:
        """A default route per IP version, via its gateway."""
        return [Route(dst=str(DEFAULT_DST[v]), gw=str(self.gateways[v]))
                for v in sorted(self.versions)]
