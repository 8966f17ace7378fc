"""A real local Kubernetes control plane for e2e tests.

etcd, kube-apiserver and kube-controller-manager (with the garbage collector), built from source.

Python API: ``Cluster.up(state_dir)`` / ``cluster.down()``, ``cluster.admin()`` (a
``e2e.harness.kube.Kube``); CLI: ``python -m e2e.harness.cluster {build,up,down}``. Binaries are
built from Go modules and cached per version outside the repository (see ``build``).
"""

from e2e.harness.cluster.build import BuildError, ensure_all_built
from e2e.harness.cluster.cluster import BGP_NAMESPACE, Cluster, ClusterError, down

__all__ = [
    "BGP_NAMESPACE",
    "BuildError",
    "Cluster",
    "ClusterError",
    "down",
    "ensure_all_built",
]
