"""What the attachment helpers take, picked out of the Invocation: a verb does it once and hands
the facts down, so no kernel step depends on more of the request than it reads."""

from __future__ import annotations

from cni_plugin.attachment.new_links import LinkOptions
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.core.request import Invocation


def attachment_of(inv: Invocation) -> AttachmentRef:
    """The attachment (veth or tap) this request names."""
    return AttachmentRef(network=inv.conf.name, vpc=inv.conf.vpc,
                         vpcattachment=inv.conf.vpcattachment, kind=inv.conf.attachment,
                         container_id=inv.env.container_id, ifname=inv.env.ifname,
                         netns=inv.env.netns)


def link_options_of(inv: Invocation) -> LinkOptions:
    """What ADD makes the links with: the isolation mode, the stanza's MTU and tap settings,
    and the `mac` capability's MAC (runtimeConfig, args.cni or CNI_ARGS, validated once)."""
    return LinkOptions(mode=inv.conf.isolation, mtu=inv.conf.mtu, mac=inv.mac,
                       tap=inv.conf.tap_options)
