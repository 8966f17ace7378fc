"""Which attachment a kernel step works on: the few facts of a request the attachment helpers
read, picked out of it once by the verb (the helpers never see the whole request)."""

from __future__ import annotations

from dataclasses import dataclass

from cni_plugin.core import naming
from cni_plugin.kernel.links import Owner


@dataclass(frozen=True)
class AttachmentRef:
    """One container's attachment to a VPC: its network, VPC attachment, kind and owner, and
    the pod netns it reaches into."""

    network: str  # the network config's name: galactic's registrations are kept per network
    vpc: str
    vpcattachment: str
    kind: str  # the stanza's attachment: veth or tap (no kernel step runs for existing)
    container_id: str  # CNI_CONTAINERID
    ifname: str  # CNI_IFNAME, the pod end's name (veth)
    netns: str  # CNI_NETNS ("" when the runtime sent none)

    @property
    def host_link(self) -> str:
        """The host link's name, G…H."""
        return naming.host_link_name(self.vpc, self.vpcattachment)

    @property
    def owner(self) -> Owner:
        """The owner mark its links carry."""
        return Owner(self.container_id, self.ifname)
