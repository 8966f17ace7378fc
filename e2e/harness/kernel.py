"""Kernel objects seen through iproute2's `ip` (independent of the plugin's netlink client):
network namespaces, links, and the host links and policy rules of a VPC."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import Iterable, Iterator
from typing import Any

from cni_plugin.core import naming

IS_ROOT = os.geteuid() == 0
IP_TIMEOUT = 20.0


def run_ip(*args: str, check: bool = True) -> str:
    """Run `ip` (with a timeout) and return its stdout."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT,
                          check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def links_in(netns: str | None = None) -> set[str]:
    """Names of links in a netns (host when None)."""
    args = ["-o", "link", "show"] if netns is None else \
        ["-n", os.path.basename(netns), "-o", "link", "show"]
    return {line.split(":")[1].strip().split("@")[0] for line in run_ip(*args).splitlines()}


@contextlib.contextmanager
def temporary_netns(prefix: str) -> Iterator[str]:
    """A fresh network namespace (its path, as a runtime passes CNI_NETNS), deleted after."""
    if not IS_ROOT:
        raise PermissionError("network namespaces need root")
    name = f"{prefix}-{secrets.token_hex(4)}"
    run_ip("netns", "add", name)
    try:
        yield f"/var/run/netns/{name}"
    finally:
        run_ip("netns", "del", name, check=False)


def remove_vpc_objects(vpcs: Iterable[str]) -> list[str]:
    """Delete the host links and policy rules of these VPCs (what a test or the bench may have
    left behind); what was removed."""
    prefixes = tuple("G" + naming.pad_base62(vpc, naming.VPC_WIDTH) for vpc in vpcs)
    if not prefixes:
        return []
    removed = []
    for line in run_ip("-o", "link", "show", check=False).splitlines():
        link = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if link.startswith(prefixes):
            run_ip("link", "del", link, check=False)
            removed.append(f"link {link}")
    for family in ("-4", "-6"):
        for line in run_ip(family, "rule", "show", check=False).splitlines():
            iif = line.split("iif ")[1].split()[0] if "iif " in line else ""
            if iif.startswith(prefixes):
                run_ip(family, "rule", "del", "iif", iif, check=False)
                removed.append(f"rule {family} iif {iif}")
    return removed


def vpc_table_of(host_link: str, isolation: str) -> str:
    """The routing table a host link's packets are looked up in, checking the mode's shape:
    one `iif` rule per family (`table`), or enslaved to its VPC's VRF and no rule (`vrf`)."""
    rules = {family: [line for line in run_ip(family, "rule").splitlines()
                      if f"iif {host_link} " in line + " "] for family in ("-4", "-6")}
    if isolation == "table":
        assert all(len(found) == 1 for found in rules.values()), rules
        return rules["-4"][0].split("lookup")[1].strip()
    assert rules == {"-4": [], "-6": []}, f"isolation 'vrf' adds no iif rule: {rules}"
    master = link_json(host_link).get("master")
    # G{vpc:9}{att:3}H is enslaved to G{vpc:9}V.
    assert master == host_link[:1 + naming.VPC_WIDTH] + "V", f"{host_link} master {master}"
    return str(link_json(master)["linkinfo"]["info_data"]["table"])


def link_json(name: str) -> dict[str, Any]:
    """`ip -j -d link show NAME` of the host netns."""
    shown: list[dict[str, Any]] = json.loads(run_ip("-j", "-d", "link", "show", name))
    return shown[0]
