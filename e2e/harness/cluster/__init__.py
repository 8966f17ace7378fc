"""A real local Kubernetes control plane for e2e tests.

etcd, kube-apiserver and kube-controller-manager (with the garbage collector), built from source.

Python API: ``Cluster.up(state_dir)`` / ``cluster.down()``; CLI: ``python -m e2e.cluster
{build,up,down}``. Binaries are built from Go modules and cached per version outside the
repository (see ``build``).
"""

from e2e.cluster.build import BuildError, ensure_all_built
from e2e.cluster.cluster import BGP_NAMESPACE, Cluster, ClusterError, down
from e2e.cluster.kubeapi import ApiError, KubeApi

__all__ = [
    "BGP_NAMESPACE",
    "ApiError",
    "BuildError",
    "Cluster",
    "ClusterError",
    "KubeApi",
    "down",
    "ensure_all_built",
]
