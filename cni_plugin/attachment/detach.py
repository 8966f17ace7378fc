"""DEL's removal of an attachment's links (SPEC §5): only what carries this container's owner
mark, deleted at once or retired for the agent's reaper."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from cni_plugin.attachment.node import host_netlink
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import links, netns

# Takes the name of a retired host link and deletes it after the verb answered (the agent's
# reaper); without one, DEL deletes links at once.
RetiredLinks = Callable[[str], None]


def detach(attachment: AttachmentRef, *, deadline: Deadline,
           delete_later: RetiredLinks | None = None) -> None:
    """Delete the container's host link (veth or tap) and pod interface; others' stay.

    With delete_later the links are retired instead and the host one (taking its veth peer
    along) is deleted after the answer: the kernel's teardown is off the runtime's path.
    """
    owner, pod_netns = attachment.owner, attachment.netns
    retired: str | None = None
    with host_netlink(deadline) as rtnl:
        link = links.find(rtnl, attachment.host_link)
        if link is not None and link.owner == owner:
            if delete_later is not None:
                retired = links.retire(rtnl, link)
            else:
                links.delete(rtnl, link)
    if attachment.kind == "veth" and pod_netns and netns.exists(pod_netns):
        with suppress(netns.NetnsGone), \
                netns.open_netlink(pod_netns, deadline=deadline) as pod_rtnl:
            pod_link = links.find(pod_rtnl, attachment.ifname)
            if pod_link is not None and pod_link.owner == owner:
                if retired is not None:  # the peer of the retired host end: goes with it
                    links.retire(pod_rtnl, pod_link)
                else:
                    links.delete(pod_rtnl, pod_link)
    if retired is not None and delete_later is not None:
        delete_later(retired)
