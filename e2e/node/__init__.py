"""A real Kubernetes node for tests (SPEC §13): ``python -m e2e.node up|down --state-dir DIR``.

```python
from e2e.node import Node

node = Node.up(tmp_path / "node")        # control plane, scheduler, containerd v2, kubelet,
node.info()                              # vpc-attach's DaemonSet Ready; the SPEC §13 JSON
with node.admin() as kube: ...           # e2e.harness.kube.Kube, cluster-admin
node.down()                              # everything `up` made is gone
```
"""

from e2e.node.node import Node, NodeError, down

__all__ = ["Node", "NodeError", "down"]
