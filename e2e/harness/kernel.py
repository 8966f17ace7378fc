"""Kernel objects seen through iproute2's `ip` (independent of the plugin's netlink client):
network namespaces, links, and the host links and policy rules of a VPC."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
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


RECORD_PRIORITY = "40000"


def has_vpc_attach_table() -> bool:
    """Whether this netns has vpc-attach's nftables table (False without `nft`)."""
    if not IS_ROOT or shutil.which("nft") is None:
        return False
    return subprocess.run(["nft", "list", "table", "inet", "vpc_attach"], capture_output=True,
                          timeout=IP_TIMEOUT, check=False).returncode == 0


def remove_vpc_attach_table() -> None:
    """Delete vpc-attach's nftables table of this netns, if there is one (nothing else)."""
    if has_vpc_attach_table():
        subprocess.run(["nft", "delete", "table", "inet", "vpc_attach"], capture_output=True,
                       timeout=IP_TIMEOUT, check=False)


def vpc_table(vpc: str, netns: str | None = None) -> str | None:
    """The table recorded for a table-mode VPC (`iif G{vpc}V lookup T` at priority 40000)."""
    record = naming.vrf_name(vpc)
    args = ["-n", os.path.basename(netns)] if netns else []
    for line in run_ip(*args, "-4", "rule", "show").splitlines():
        if line.startswith(RECORD_PRIORITY + ":") and f"iif {record} " in line + " ":
            return line.split("lookup")[1].split()[0]
    return None


def mark_rules(table: str, netns: str | None = None) -> list[str]:
    """The `fwmark … lookup table` rules of both families."""
    args = ["-n", os.path.basename(netns)] if netns else []
    return [line for family in ("-4", "-6")
            for line in run_ip(*args, family, "rule", "show").splitlines()
            if "fwmark" in line and line.split("lookup")[1].split()[0] == table]


def remove_vpc_objects(vpcs: Iterable[str]) -> list[str]:
    """Delete the host links and policy rules of these VPCs (what a test or the bench may have
    left behind); what was removed."""
    vpcs = list(vpcs)
    prefixes = tuple("G" + naming.pad_base62(vpc, naming.VPC_WIDTH) for vpc in vpcs)
    if not prefixes:
        return []
    removed = []
    # Read first: the loop over iif rules below also deletes each VPC's table record.
    tables = {vpc: vpc_table(vpc) for vpc in vpcs}
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
    for vpc, table in tables.items():
        if table is None:
            continue
        for family in ("-4", "-6"):
            for line in mark_rules(table):
                mark = line.split("fwmark")[1].split()[0]
                run_ip(family, "rule", "del", "fwmark", mark, "lookup", table, check=False)
            run_ip(family, "route", "flush", "table", table, check=False)
        run_ip("-4", "rule", "del", "iif", naming.vrf_name(vpc), "lookup", table, check=False)
        removed.append(f"table {table}")
    return removed


def vpc_table_of(host_link: str, isolation: str) -> str:
    """The routing table a host link's packets are looked up in, checking the mode's shape:
    the VPC's record rule, one mark rule per family and the link's group as its mark (`table`),
    or enslaved to its VPC's VRF and no rule (`vrf`)."""
    record = host_link[:1 + naming.VPC_WIDTH] + "V"  # G{vpc:9}{att:3}H -> G{vpc:9}V
    if isolation == "table":
        table = next((line.split("lookup")[1].split()[0]
                      for line in run_ip("-4", "rule", "show").splitlines()
                      if line.startswith(RECORD_PRIORITY + ":")
                      and f"iif {record} " in line + " "), None)
        assert table is not None, f"no table recorded for {record}"
        assert len(mark_rules(table)) == 2, "one mark rule per family for the VPC"
        assert f"group {int(table) << 16} " in run_ip("-d", "link", "show", host_link), \
            "the host link's group is its VPC's mark"
        return table
    rules = [line for family in ("-4", "-6") for line in run_ip(family, "rule").splitlines()
             if f"iif {host_link} " in line + " "]
    assert rules == [], f"isolation 'vrf' adds no iif rule: {rules}"
    master = link_json(host_link).get("master")
    assert master == record, f"{host_link} master {master}"
    return str(link_json(master)["linkinfo"]["info_data"]["table"])


def link_json(name: str) -> dict[str, Any]:
    """`ip -j -d link show NAME` of the host netns."""
    shown: list[dict[str, Any]] = json.loads(run_ip("-j", "-d", "link", "show", name))
    return shown[0]
