"""vpc-attach-ipam in-process reaches the cluster on what the verb lends it (`Caller`): the
verb's session and what is left of the verb's deadline, never a client or a deadline of its
own; the executable, which has no caller, makes its own and ends it (SPEC §9)."""

from __future__ import annotations

from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.ipam.plugin.caller import Caller
from cni_plugin.ipam.plugin.kubeblocks import block_api, lent_block_api
from cni_plugin.kube.client import KubeClient
from cni_plugin.kube.session import ColdCluster, ColdSession, VerbCluster
from netconf.host import HostSettings, NodeSettings


class OneSession(ColdCluster):
    """A source whose sessions are counted and whose client is a stand-in."""

    def __init__(self) -> None:
        self.opened: list[CountedSession] = []

    def session(self, kubeconfig: str) -> CountedSession:
        made = CountedSession(kubeconfig)
        self.opened.append(made)
        return made


class CountedSession(ColdSession):
    closed = False

    def _connect(self) -> KubeClient:
        client: Any = object()  # never used for a request here
        return client  # type: ignore[no-any-return]

    def close(self) -> None:
        self.closed = True


def test_a_caller_lends_its_session_and_deadline_and_keeps_them() -> None:
    source = OneSession()
    cluster = VerbCluster(source, "/etc/kubeconfig", "c1")
    verb_client = cluster.session().client()
    deadline = Deadline(7.0)
    caller = Caller(NodeSettings({}), HostSettings(node_name="n1", kubeconfig="/etc/kubeconfig"),
                    cluster, deadline)
    blocks = lent_block_api(caller, "c1", "eth0")
    assert blocks.client is verb_client and blocks.deadline is deadline
    assert len(source.opened) == 1, "the verb's one session, no second"
    blocks.close()
    assert not source.opened[0].closed, "the verb ends its session, not the IPAM"
    rollback = Deadline(2.0)
    assert lent_block_api(caller, "c1", "eth0", rollback).deadline is rollback


def test_the_executable_makes_its_own_session_and_ends_it(tmp_path: Any) -> None:
    node = NodeSettings({"VPC_ATTACH_NODE_NAME": "n1", "VPC_ATTACH_KUBECONFIG": "/k",
                         "VPC_ATTACH_HOST_CONFIG": str(tmp_path / "absent.json")})
    blocks = block_api(node, "c1", "eth0")
    assert blocks.cluster.kubeconfig == "/k" and blocks.deadline.seconds == 30.0
    blocks.close()  # nothing was opened: nothing to end
