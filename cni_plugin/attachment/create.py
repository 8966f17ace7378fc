"""ADD's links, of the kind the config names: `open_links` gives a `VethLinks` or `TapLinks`,
whose `create` makes them (each recorded for rollback) and returns the `CreatedVeth` or
`CreatedTap` that alone has `configure`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from cni_plugin.attachment.node import host_netlink
from cni_plugin.attachment.tap import CreatedTap, TapLinks
from cni_plugin.attachment.veth import CreatedVeth, VethLinks
from cni_plugin.core.request import Invocation
from cni_plugin.kernel import netns

Created = CreatedVeth | CreatedTap  # what `configure` and answering the SID take


@contextmanager
def open_links(inv: Invocation) -> Iterator[VethLinks | TapLinks]:
    """The attachment's links to make, with netlink sockets in the host (and pod) netns until
    exit; only what their `create` returns can be configured."""
    with ExitStack() as stack:
        host_rtnl = stack.enter_context(host_netlink(inv.deadline))
        if inv.conf.attachment == "tap":
            yield TapLinks(inv, host_rtnl)
        else:
            yield VethLinks(inv, host_rtnl, stack.enter_context(
                netns.open_netlink(inv.env.netns, deadline=inv.deadline)))
