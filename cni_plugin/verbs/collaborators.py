"""What a transport lends the verbs (their collaborators): where the cluster is reached, how
links are removed, and who hears how a rollback ended and which ADDs tenancy denied."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cni_plugin.attachment.detach import RetiredLinks
from cni_plugin.core.request import Invocation
from cni_plugin.core.rollback import RollbackObserver
from cni_plugin.kube.session import ClusterSource, ColdCluster, VerbCluster
from cni_plugin.policy.services import PolicyServices
from cni_plugin.tenancy import DenialObserver

if TYPE_CHECKING:
    from cni_plugin.kubevirt import MigrationTargets


@dataclass(frozen=True)
class Collaborators:
    """The executable's defaults: a fresh API client per verb, links deleted at once."""

    cluster: ClusterSource = field(default_factory=ColdCluster)
    # The agent's reaper: DEL retires links and it deletes them after the answer.
    delete_retired_later: RetiredLinks | None = None
    # The agent's metrics: told how each ADD's rollback ended (complete or not).
    rollback_finished: RollbackObserver | None = None
    # The agent's: told of each ADD no VPCBinding admitted (it counts them, writes audit Events).
    tenancy_denied: DenialObserver | None = None
    # The agent's Pod watch: told of each live-migration target ADD recorded (it cuts it over
    # when KubeVirt marks the Pod ready; without it, STATUS does).
    migration_targets: MigrationTargets | None = None
    # Where the policy step reads and who remembers what it wrote (the agent's caches and
    # keeper; by default the verb's API client and a fresh enforcer).
    policy: PolicyServices = field(default_factory=PolicyServices)

    def verb_cluster(self, inv: Invocation) -> VerbCluster:
        """The verb's one cluster session (nothing is opened until a step needs the API),
        handed to every step; the verb ends it."""
        return VerbCluster(self.cluster, inv.host.kubeconfig, inv.env.container_id)
