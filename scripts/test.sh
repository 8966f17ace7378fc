#!/usr/bin/env bash
# Runs the whole test suite (lint, types, unit, e2e on real namespaces). Does its own set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
mypy
python -m pytest -p no:cacheprovider "$@"
# The same e2e tests again, every invocation going through the node agent (SPEC §11).
VPC_ATTACH_E2E_VIA=agent python -m pytest -p no:cacheprovider e2e "$@"
