"""A real local Kubernetes control plane for e2e tests.

etcd, kube-apiserver and kube-controller-manager (with the garbage collector), built from source;
the same build cache also holds a node's binaries (``ensure_node_built``: kubelet, kube-scheduler,
kubectl, containerd, containerd-shim-runc-v2, ctr, runc).

Python API: ``Cluster.up(state_dir)`` / ``cluster.down()``, ``cluster.admin()`` (a
``e2e.harness.kube.Kube``); CLI: ``python -m e2e.harness.cluster {build,up,down}``. Binaries are
built from Go modules and cached per version outside the repository (see ``build``).
"""

from e2e.harness.cluster.build import BuildError, ensure_all_built, ensure_node_built
from e2e.harness.cluster.cluster import BGP_NAMESPACE, Cluster, ClusterError, down

__all__ = [
    "BGP_NAMESPACE",
    "BuildError",
    "Cluster",
    "ClusterError",
    "down",
    "ensure_all_built",
    "ensure_node_built",
]
