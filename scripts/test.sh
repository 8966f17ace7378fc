#!/usr/bin/env bash
# Runs the whole test suite (lint, types, unit, e2e on real namespaces). Does its own set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
mypy
python -m pytest -p no:cacheprovider "$@"
# The same e2e tests again, every invocation going through the node agent (SPEC §11): all of
# e2e/, or only the test paths given.
agent_args=(e2e "$@")
for arg in "$@"; do
  case "$arg" in e2e*|tests*) agent_args=("$@"); break ;; esac
done
VPC_ATTACH_E2E_VIA=agent python -m pytest -p no:cacheprovider "${agent_args[@]}"
