"""A node for the datapath's boundary tests (SPEC §14): a network namespace where the plugin
(and, with VPC_ATTACH_E2E_VIA=agent, an agent) runs, so the `inet vpc_attach` table, the policy
rules and the host links exist only there, with an uplink to `ext`, a namespace standing for a
network only the node's main table routes; Pods are further namespaces attached to it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.agentproc import OwnAgents
from e2e.harness.kernel import run_ip
from e2e.harness.packets import in_netns, nft_counters, nft_table
from e2e.harness.plugin import VIA_AGENT, Plugin, base_conf, host_local, with_prev

NODE_V4, NODE_V6 = "192.0.2.2", "2001:db8:2::2"
EXT_V4, EXT_V6 = "192.0.2.1", "2001:db8:2::1"
SUBNETS = {"a1": ("10.80.0.0/24", "fd80::/64"), "b2": ("10.80.0.0/24", "fd80::/64"),
           "c3": ("10.90.0.0/24", "fd90::/64")}  # b2 reuses a1's subnets


@dataclass
class Pod:
    """An attached netns."""

    netns: str
    result: dict[str, Any]

    def ip(self, version: int) -> str:
        """Its address of one family."""
        return next(str(ip["address"]).split("/")[0] for ip in self.result["ips"]
                    if ipaddress.ip_interface(ip["address"]).version == version)

    def gateway(self, version: int) -> str:
        """Its gateway of one family."""
        return next(str(ip["gateway"]) for ip in self.result["ips"]
                    if ipaddress.ip_interface(ip["address"]).version == version)


@dataclass
class Node:
    """A node network namespace with the plugin running inside it."""

    name: str
    ext: str
    plugin: Plugin
    work: Path
    stack: ExitStack
    pods: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)
    isolation: str = "table"

    def run_ip(self, *args: str, check: bool = True) -> str:
        """`ip` inside the node."""
        return run_ip("-n", self.name, *args, check=check)

    def conf(self, vpc: str, att: str, **overrides: Any) -> dict[str, Any]:
        """A veth stanza of the VPC with host-local over its subnets."""
        ipam = host_local(self.work / f"ipam-{vpc}", *SUBNETS[vpc])
        return base_conf(vpc, att, **{"ipam": ipam, "isolation": self.isolation, **overrides})

    def attach(self, vpc: str, att: str, **overrides: Any) -> Pod:
        """A fresh pod netns attached to vpc/att."""
        name = f"vpa-dp-{secrets.token_hex(4)}"
        run_ip("netns", "add", name)
        self.stack.callback(run_ip, "netns", "del", name, check=False)
        netns = f"/var/run/netns/{name}"
        conf = self.conf(vpc, att, **overrides)
        result = self.plugin.ok("ADD", conf, container_id=name, netns=netns)
        self.pods.append((with_prev(conf, result), name, netns))
        return Pod(netns, result)

    def detach(self, pod: Pod) -> None:
        """DEL of the pod's attachment."""
        conf, name, netns = next(p for p in self.pods if p[2] == pod.netns)
        self.plugin.ok("DEL", conf, container_id=name, netns=netns)
        self.pods.remove((conf, name, netns))

    def counters(self) -> dict[str, int]:
        """The node's drop counters, read by `nft`."""
        return nft_counters(self.name)


@contextmanager
def node_with_uplink(cni_bin: Path, own_agents: OwnAgents, work: Path, host_access: str = "",
                     host_file: dict[str, Any] | None = None) -> Iterator[Node]:
    """A node netns with an uplink to `ext`; the plugin (or agent) inside, with this hostAccess
    or this whole host file; every attachment still there DELeted and both netns removed after."""
    suffix = secrets.token_hex(3)
    name, ext = f"vpa-node-{suffix}", f"vpa-ext-{suffix}"
    with ExitStack() as stack:
        for netns in (name, ext):
            run_ip("netns", "add", netns)
            stack.callback(run_ip, "netns", "del", netns, check=False)
            run_ip("-n", netns, "link", "set", "lo", "up")
        run_ip("-n", name, "link", "add", "up0", "type", "veth", "peer", "name", "up1",
               "netns", ext)
        for netns, link, v4, v6 in ((name, "up0", NODE_V4, NODE_V6),
                                    (ext, "up1", EXT_V4, EXT_V6)):
            run_ip("-n", netns, "addr", "add", f"{v4}/24", "dev", link)
            run_ip("-n", netns, "addr", "add", f"{v6}/64", "dev", link, "nodad")
            run_ip("-n", netns, "link", "set", link, "up")
        lock_dir = work / "node-locks"
        lock_dir.mkdir()
        environ = {"VPC_ATTACH_HOST_ACCESS": host_access} if host_access else {}
        host_path = lock_dir / "absent-host.json"
        if host_file is not None:
            host_path = work / "host.json"
            host_path.write_text(json.dumps(host_file))
            environ["VPC_ATTACH_HOST_CONFIG"] = str(host_path)
        runner = Plugin(cni_bin=cni_bin, lock_dir=lock_dir, environ=environ,
                        prefix=in_netns(name))
        if VIA_AGENT:
            agent_dir = work / "agent"
            agent_dir.mkdir()
            agent = own_agents.enter(stack, agent_dir, prefix=in_netns(name), env={
                **environ, "VPC_ATTACH_LOCK_DIR": str(lock_dir),
                "VPC_ATTACH_HOST_CONFIG": str(host_path)})
            runner.agent_socket = str(agent.socket)
            assert "chain prerouting" in nft_table(name), "the agent protects the node at start"
        node = Node(name, ext, runner, work, stack)
        yield node
        for conf, container, netns in list(node.pods):
            runner.call("DEL", conf, container_id=container, netns=netns)


def use_vrf(node: Node) -> None:
    """The node's attachments in `vrf` isolation from now on (skips where the kernel has no VRF
    device: the full-kernel VM runs those)."""
    probe = node.run_ip("link", "add", "vpaprobe", "type", "vrf", "table", "4000", check=False)
    if "vpaprobe" not in node.run_ip("link", "show", check=False):
        pytest.skip(f"this kernel cannot create VRF devices {probe.strip()}")
    node.run_ip("link", "del", "vpaprobe")
    node.isolation = "vrf"


def host_link(pod: Pod) -> str:
    """The Pod's host-side link (the result's first interface)."""
    return str(pod.result["interfaces"][0]["name"])


def ipv4_udp_frame(dst_mac: str, src: str, dst: str, port: int, payload: bytes) -> bytes:
    """An Ethernet frame carrying one IPv4 UDP datagram, as a VM writes it into its tap."""
    udp = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0x4000, 64, 17, 0,
                         socket.inet_aton(src), socket.inet_aton(dst))
    words = sum(struct.unpack("!10H", header))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    header = header[:10] + struct.pack("!H", ~words & 0xFFFF) + header[12:]
    return bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex("020000000001") + \
        b"\x08\x00" + header + udp


def vpc_attach_cli(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    """`vpc-attach <args>` (install, uninstall, …) run inside the node, on its lock dir."""
    return subprocess.run(in_netns(node.name, str(node.plugin.cni_bin / "vpc-attach"), *args),
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "VPC_ATTACH_LOCK_DIR": str(node.plugin.lock_dir)})
