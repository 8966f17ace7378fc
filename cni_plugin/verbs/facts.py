"""What the attachment helpers take, picked out of the Invocation: a verb does it once and hands
the facts down, so no kernel step depends on more of the request than it reads."""

from __future__ import annotations

from cni_plugin.attachment.create import Created
from cni_plugin.attachment.new_links import LinkOptions
from cni_plugin.attachment.ref import AttachmentRef
from cni_plugin.core.addressing import Addressing
from cni_plugin.core.request import Invocation
from cni_plugin.policy.services import AttachmentFacts


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


def policy_facts_of(inv: Invocation, created: Created, addressing: Addressing) -> AttachmentFacts:
    """What the policy step records and enforces for the attachment ADD made."""
    return AttachmentFacts(
        container_id=inv.env.container_id, ifname=inv.env.ifname, kind=inv.conf.attachment,
        netns=inv.env.netns, host_link=created.host_link.name, vpc=inv.conf.vpc,
        vpcattachment=inv.conf.vpcattachment, table=created.vpc_table.table,
        addresses=tuple(str(a.ip) for a in addressing.workload), network_name=inv.conf.name)
