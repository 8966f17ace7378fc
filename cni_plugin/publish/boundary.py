"""How a verb's publishing step reaches the API: the settings checked (code 7), a
`PublishContext` on the verb's session (`connected`), and the one place an API refusal nobody
handled becomes a CNI error (`api_boundary`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from cni_plugin.core.request import Invocation
from cni_plugin.kube.client import ApiError, api_failure
from cni_plugin.kube.session import VerbCluster
from cni_plugin.publish.context import PublishContext
from netconf.errors import INVALID_CONFIG, CniError


@contextmanager
def api_boundary(doing: str) -> Iterator[None]:
    """Turn an ApiError escaping the block into its CNI error (the one place this happens)."""
    try:
        yield
    except ApiError as exc:
        raise api_failure(exc, doing) from None


def check_settings(inv: Invocation) -> str:
    """The node name; code 7 when publishing is on but it or the kubeconfig is unusable."""
    node = inv.host.node_name
    if not node:
        raise CniError(INVALID_CONFIG, "publishing needs a node name",
                       "set nodeName in the stanza, VPC_ATTACH_NODE_NAME, or the host file")
    kubeconfig = inv.host.kubeconfig
    if not kubeconfig:
        raise CniError(INVALID_CONFIG, "publishing needs a kubeconfig",
                       "set kubeconfig in the stanza, VPC_ATTACH_KUBECONFIG, or the host file; "
                       "or turn publishing off with \"publish\": {\"bgp\": false, "
                       "\"endpointSlice\": false}")
    if not os.access(kubeconfig, os.R_OK):
        raise CniError(INVALID_CONFIG, f"kubeconfig {kubeconfig!r} is not readable")
    return node


@contextmanager
def connected(inv: Invocation, cluster: VerbCluster) -> Iterator[PublishContext | None]:
    """A context on the verb's session (its client borrowed now), or None when publishing is
    off. The session stays the verb's: it outlives the block (a rollback after it uses it)."""
    if not inv.conf.publish.any:
        yield None
        return
    node = check_settings(inv)
    yield PublishContext.open(inv, cluster.session(), node)
