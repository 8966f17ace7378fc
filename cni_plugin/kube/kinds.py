"""The Kubernetes kinds every room of vpc-attach reads (Pods, Nodes, Namespaces, VPCBindings,
SelfSubjectAccessReviews). A room's own kinds live in it: publishing's BGP kinds and
EndpointSlices in `publish/resources.py`, IPAMBlocks in `ipam/plugin/kubeblocks.py`, KubeVirt's
IPAMClaims with its claims."""

from __future__ import annotations

from cni_plugin.kube.client import Resource

PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)  # owners of node-bound objects
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
BINDINGS = Resource("vpc-attach.datum.net", "v1alpha1", "vpcbindings", "VPCBinding",
                    namespaced=False)
ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "selfsubjectaccessreviews",
                          "SelfSubjectAccessReview", namespaced=False)
