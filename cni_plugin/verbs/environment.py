"""What a transport lends the verbs: where the cluster is reached, and how links are removed."""

from __future__ import annotations

from dataclasses import dataclass, field

from cni_plugin.attachment import RetiredLinks
from cni_plugin.publish.source import ClusterSource, ColdCluster


@dataclass(frozen=True)
class Environment:
    """The executable's defaults: a fresh API client per verb, links deleted at once."""

    cluster: ClusterSource = field(default_factory=ColdCluster)
    # The agent's reaper: DEL retires links and it deletes them after the answer.
    delete_retired_later: RetiredLinks | None = None
