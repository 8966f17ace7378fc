"""ADD's links, of the kind the config names: `open_links` gives a `VethLinks` or `TapLinks`,
whose `create` makes them (each recorded for rollback) and returns the `CreatedVeth` or
`CreatedTap` that alone has `configure`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from cni_plugin.attachment.new_links import LinkOptions
from cni_plugin.attachment.node import host_netlink
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.attachment.tap import CreatedTap, TapLinks
from cni_plugin.attachment.veth import CreatedVeth, VethLinks
from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import netns
from netconf.host import NodeSettings

Created = CreatedVeth | CreatedTap  # what `configure` and answering the SID take


@contextmanager
def open_links(attachment: AttachmentRef, options: LinkOptions, *, lock_dir: str,
               node: NodeSettings, deadline: Deadline) -> Iterator[VethLinks | TapLinks]:
    """The attachment's links to make, with netlink sockets in the host (and pod) netns until
    exit; only what their `create` returns can be configured."""
    with ExitStack() as stack:
        host_rtnl = stack.enter_context(host_netlink(deadline))
        if attachment.kind == "tap":
            yield TapLinks(attachment, options, host_rtnl, lock_dir=lock_dir, node=node,
                           deadline=deadline)
        else:
            pod_rtnl = stack.enter_context(netns.open_netlink(attachment.netns, deadline=deadline))
            yield VethLinks(attachment, options, host_rtnl, pod_rtnl, lock_dir=lock_dir,
                            node=node, deadline=deadline)
