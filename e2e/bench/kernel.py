"""Network namespaces and per-VPC kernel state the bench creates, and their removal.

Everything is named after the run's token, so the final sweep removes exactly what this run
made (also what an interrupted step left half-made) and never anything else on the host.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cni_plugin.kernel import links, netns
from e2e.harness.kernel import remove_vpc_objects, run_ip
from e2e.harness.wait import wait_until

REAPER_TIMEOUT = 10.0


def reaper_done(timeout: float = REAPER_TIMEOUT) -> bool:
    """Wait until no retired link is left on the host (cni_plugin/kernel/links.py): the agent
    has finished the kernel work a DEL through it deferred. Whether it did within timeout."""
    with netns.open_netlink(None) as rtnl:
        try:
            wait_until("no retired link left", lambda: not any(
                links.is_retired(link) for link in links.all_links(rtnl)), timeout,
                interval=0.002)
        except TimeoutError:
            return False
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
        run_ip("netns", "add", created.name)
        return created

    def remove(self, netns: Netns) -> None:
        """Delete a namespace this janitor made (missing is fine)."""
        run_ip("netns", "del", netns.name, check=False)

    def own_vpc(self, vpc: str) -> None:
        """Remember a VPC whose host links and policy rules the sweep must remove."""
        self._vpcs.add(vpc)

    def sweep(self) -> list[str]:
        """Remove every namespace, link and rule of this run; what was removed."""
        removed = []
        for line in run_ip("netns", "list", check=False).splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(self.prefix):
                run_ip("netns", "del", name, check=False)
                removed.append(f"netns {name}")
        return removed + remove_vpc_objects(self._vpcs)
