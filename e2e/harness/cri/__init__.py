"""containerd + runc with its CRI, for tests that go through a real container runtime.

- `protos`: the CRI API (`k8s.io/cri-api`) compiled to Python gRPC stubs, cached by version;
- `pause`: a pause image built locally (a static binary packed as an OCI image archive);
- `containerd`: one isolated containerd (own root, state, socket, config), started and stopped
  exactly;
- `control`: reaching one containerd (CRI client, `ctr`, readiness, image import), shared with
  the node's containerd (`e2e/node/runtime.py`);
- `client`: a small CRI client (RunPodSandbox, StopPodSandbox, RemovePodSandbox, status) with a
  timeout on every call.

`python -m e2e.harness.cri build` prepares the stubs and the pause image (set-up runs it).
"""

from __future__ import annotations

from e2e.harness.cri.client import CriClient, CriError, SandboxConfig, SandboxStatus
from e2e.harness.cri.containerd import Containerd, ContainerdError

__all__ = [
    "Containerd",
    "ContainerdError",
    "CriClient",
    "CriError",
    "SandboxConfig",
    "SandboxStatus",
]
