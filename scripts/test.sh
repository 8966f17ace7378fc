#!/usr/bin/env bash
# Runs the whole test suite (lint, types, unit, e2e on real namespaces). Does its own set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
mypy
python -m pytest -p no:cacheprovider "$@"
