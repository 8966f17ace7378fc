#!/usr/bin/env bash
# Attaches a "pod" network namespace through the real plugin and prints what was created, then
# detaches it again; then the same through a real node: kubelet starts a Pod through vpc-attach
# installed by its own DaemonSet. Does its own set-up. Options go to the first part (--keep).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m e2e.demo "$@"
echo
echo "=== the same through a real node (kubelet, containerd, the DaemonSet) ==="
exec .venv/bin/python -m e2e.demo_node
