"""The Kubernetes kinds more than one room of vpc-attach reads (Pods, Nodes, Namespaces,
VPCBindings, SelfSubjectAccessReviews, IPAMClaims: KubeVirt's room reads and writes them, IPAM's
cluster blocks list them). A room's own kinds live in it: publishing's BGP kinds and
EndpointSlices in `publish/resources.py`, IPAMBlocks in `ipam/plugin/kubeblocks.py`."""

from __future__ import annotations

from cni_plugin.kube.client import Resource

PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)  # owners of node-bound objects
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
BINDINGS = Resource("vpc-attach.datum.net", "v1alpha1", "vpcbindings", "VPCBinding",
                    namespaced=False)
IPAMCLAIMS = Resource("k8s.cni.cncf.io", "v1alpha1", "ipamclaims", "IPAMClaim")
ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "selfsubjectaccessreviews",
                          "SelfSubjectAccessReview", namespaced=False)
