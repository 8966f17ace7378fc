"""What vpc-attach lends vpc-attach-ipam when it runs its verbs in-process: the node's settings
it read, its host settings, the verb's cluster session and the verb's deadline (SPEC §9). The
IPAM then reads no host file, opens no API client and starts no deadline of its own; a block
claim or a lend inside an ADD runs on the verb's connection and ends by the verb's deadline. The
executable has no caller and makes its own (`kubeblocks.block_api`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cni_plugin.core.deadline import Deadline
from netconf.host import HostSettings, NodeSettings

if TYPE_CHECKING:
    from cni_plugin.kube.session import VerbCluster


@dataclass(frozen=True)
class Caller:
    """The verb that runs vpc-attach-ipam in-process."""

    node: NodeSettings
    host: HostSettings  # the verb's: the node's name and kubeconfig
    cluster: VerbCluster  # the verb's one session, opened on first use, ended by the verb
    deadline: Deadline  # what is left of the verb's
