"""Network namespaces and per-VPC kernel state the bench creates, and their removal.

Everything is named after the run's token, so the final sweep removes exactly what this run
made (also what an interrupted step left half-made) and never anything else on the host.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from dataclasses import dataclass

from cni_plugin.core import naming
from cni_plugin.kernel import links, netns

IP_TIMEOUT = 20.0
REAPER_TIMEOUT = 10.0


def ip(*args: str, check: bool = True) -> str:
    """Run `ip` (with a timeout) and return its stdout."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT,
                          check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def reaper_done(timeout: float = REAPER_TIMEOUT) -> bool:
    """Wait until no retired link is left on the host (cni_plugin/kernel/links.py): the agent
    has finished the kernel work a DEL through it deferred. Whether it did within timeout."""
    give_up = time.monotonic() + timeout
    with netns.open_netlink(None) as rtnl:
        while any(links.is_retired(link) for link in links.all_links(rtnl)):
            if time.monotonic() > give_up:
                return False
            time.sleep(0.002)
    return True


@dataclass(frozen=True)
class Netns:
    """A named network namespace; `path` is what a runtime passes as CNI_NETNS."""

    name: str

    @property
    def path(self) -> str:
        """The bind mount under /var/run/netns."""
        return f"/var/run/netns/{self.name}"


class KernelJanitor:
    """Creates the run's namespaces and forgets nothing it must remove."""

    def __init__(self, token: str) -> None:
        self.prefix = f"vpab-{token}-"
        self._counter = itertools.count()
        self._vpcs: set[str] = set()

    def netns(self) -> Netns:
        """A fresh, empty network namespace."""
        created = Netns(f"{self.prefix}{next(self._counter)}")
        ip("netns", "add", created.name)
        return created

    def remove(self, netns: Netns) -> None:
        """Delete a namespace this janitor made (missing is fine)."""
        ip("netns", "del", netns.name, check=False)

    def own_vpc(self, vpc: str) -> None:
        """Remember a VPC whose host links and policy rules the sweep must remove."""
        self._vpcs.add(vpc)

    def sweep(self) -> list[str]:
        """Remove every namespace, link and rule of this run; what was removed."""
        removed = []
        for line in ip("netns", "list", check=False).splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(self.prefix):
                ip("netns", "del", name, check=False)
                removed.append(f"netns {name}")
        prefixes = tuple("G" + naming.pad_base62(vpc, naming.VPC_WIDTH) for vpc in self._vpcs)
        if not prefixes:
            return removed
        for line in ip("-o", "link", "show", check=False).splitlines():
            link = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if link.startswith(prefixes):
                ip("link", "del", link, check=False)
                removed.append(f"link {link}")
        for family in ("-4", "-6"):
            for line in ip(family, "rule", "show", check=False).splitlines():
                iif = line.split("iif ")[1].split()[0] if "iif " in line else ""
                if iif.startswith(prefixes):
                    ip(family, "rule", "del", "iif", iif, check=False)
                    removed.append(f"rule {family} iif {iif}")
        return removed
