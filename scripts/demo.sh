#!/usr/bin/env bash
# Attaches a "pod" network namespace through the real plugin and prints what was created, then
# detaches it again; then the same through a real node: kubelet starts a Pod through vpc-attach
# installed by its own DaemonSet. Does its own set-up, each part only what it uses
# (scripts/setup.sh demo, then node). Options go to the first part (--keep).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
.venv/bin/python -m e2e.demo "$@"
echo
echo "=== the same through a real node (kubelet, containerd, the DaemonSet) ==="
bash scripts/setup.sh node
exec .venv/bin/python -m e2e.demo_node
