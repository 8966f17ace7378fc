"""Publishing an attachment to Kubernetes: BGP custom resources, then the Pod's EndpointSlice.

The verbs call only the functions below. Settings are validated before any kernel change
(`preflight`); the API work itself lands with the publishing issue, and until then an ADD that
asks for it fails cleanly (code 7) after rolling back, instead of pretending to publish.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from netconf.errors import INVALID_CONFIG, CniError
from netconf.result import Result

if TYPE_CHECKING:
    from cni_plugin.attachment import Addressing
    from cni_plugin.rollback import Rollback
    from cni_plugin.verbs.request import Invocation


def preflight(inv: Invocation) -> None:
    """Code 7 when publishing is on but the node name or kubeconfig is unusable."""
    if not inv.conf.publish.any:
        return
    if not inv.host.node_name:
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


def publish(inv: Invocation, result: Result, plan: Addressing, rollback: Rollback) -> None:
    """Publish BGP state and the EndpointSlice, recording what was created in rollback."""
    if inv.conf.publish.any:
        raise CniError(INVALID_CONFIG, "publishing to Kubernetes is not available in this build",
                       "set \"publish\": {\"bgp\": false, \"endpointSlice\": false}")


def unpublish(inv: Invocation) -> None:
    """Withdraw this container's published state (nothing is published by this build)."""


def published_differences(inv: Invocation, prev: Result) -> list[str]:
    """What CHECK finds changed in the published objects (nothing is published yet)."""
    return []


def publishing_status(inv: Invocation) -> None:
    """STATUS of the publishing path: code 50 when ADD could not publish."""
    if inv.conf.publish.any:
        try:
            preflight(inv)
        except CniError as exc:
            raise CniError(50, exc.msg, exc.details) from None


def collect_garbage(inv: Invocation, valid: set[tuple[str, str]]) -> None:
    """GC of published objects of attachments not in valid (nothing is published yet)."""
