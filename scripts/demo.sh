#!/usr/bin/env bash
# Attaches a "pod" network namespace through the real plugin and prints what was created,
# then detaches it again. Does its own set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m e2e.demo "$@"
