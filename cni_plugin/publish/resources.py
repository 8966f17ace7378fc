"""The Kubernetes resources publishing reads and writes (BGP kinds, EndpointSlices), and the
keys it puts on them; the kinds every room reads are in `cni_plugin/kube/kinds.py`."""

from __future__ import annotations

from cni_plugin.kube.client import Resource

GROUP = "network.datumapis.com"
VERSION = "v1alpha1"
ROUTERS = Resource(GROUP, VERSION, "bgprouters", "BGPRouter")
VRF_INSTANCES = Resource(GROUP, VERSION, "bgpvrfinstances", "BGPVRFInstance")
ADVERTISEMENTS = Resource(GROUP, VERSION, "bgpadvertisements", "BGPAdvertisement")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")

ANNOTATION_PREFIX = "galactic.datum.net/"
NETNS_KEY = ANNOTATION_PREFIX + "netns."
SUBNET_V6_KEY = ANNOTATION_PREFIX + "allocated-subnet-ipv6."
SUBNET_V4_KEY = ANNOTATION_PREFIX + "allocated-subnet-ipv4."
# Which node recorded a container's annotations: only that node may prune them.
NODE_KEY = ANNOTATION_PREFIX + "node."
CONTAINER_KEYS = (NETNS_KEY, SUBNET_V6_KEY, SUBNET_V4_KEY, NODE_KEY)

TENANT_LABEL = "galactic.datum.net/tenant-id"  # galactic's sidecar selects on it: IPv6 slices only
ATTACHMENT_LABEL = "vpc-attach.datum.net/tenant-id"  # every slice of ours: {vpc}-{att}
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "vpc-attach"
SRV6_SID_ANNOTATION = "galactic.datum.net/srv6-sid"
CONTAINER_ID_ANNOTATION = "vpc-attach.datum.net/container-id"
IFNAME_ANNOTATION = "vpc-attach.datum.net/ifname"

# What the plugin needs, for STATUS's SelfSubjectAccessReviews: (group, resource, verbs).
REQUIRED_PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, "bgprouters", ("get", "list")),
    (GROUP, "bgpvrfinstances", ("get", "list", "create", "update", "delete")),
    (GROUP, "bgpadvertisements", ("get", "list", "create", "update", "delete")),
    ("discovery.k8s.io", "endpointslices", ("get", "list", "create", "update", "delete")),
    ("", "pods", ("get",)),
    ("", "nodes", ("get",)),  # ownerReferences of node-owned objects; cluster IPAM
)
