#!/usr/bin/env bash
# Runs the whole test suite (lint, types, unit, e2e on real namespaces). Does its own set-up.
# Prints each phase's wall time at the end, and each pytest pass its ten slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
phases=()
phase() {  # phase NAME CMD...: runs CMD, records its wall time (also when it fails)
  local name=$1 start rc=0
  shift
  start=$SECONDS
  "$@" || rc=$?
  phases+=("$(printf '%-22s %4d s' "$name" $((SECONDS - start)))")
  return $rc
}
report() {
  echo "== time per phase (nproc $(nproc)) =="
  printf '%s\n' "${phases[@]}"
  printf '%-22s %4d s\n' total "$SECONDS"
}
trap report EXIT
phase setup bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
phase ruff ruff check .
phase mypy mypy
phase "pytest in-process" python -m pytest -p no:cacheprovider --durations=10 "$@"
# The e2e tests marked both_paths again, every invocation going through the node agent
# (SPEC §11): all of e2e/, or only the test paths given.
agent_args=(e2e "$@")
for arg in "$@"; do
  case "$arg" in e2e*|tests*) agent_args=("$@"); break ;; esac
done
# VPC_ATTACH_VM_ONCE_RAN: the full-kernel tests marked once_through_agent ran through an agent
# in the in-process pass's VM already (e2e/harness/vm/pytest_plugin.py).
VPC_ATTACH_E2E_VIA=agent VPC_ATTACH_VM_ONCE_RAN=1 phase "pytest agent" \
  python -m pytest -p no:cacheprovider --durations=10 "${agent_args[@]}"
