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
  phases+=("$(printf '%-27s %4d s' "$name" $((SECONDS - start)))")
  return $rc
}
report() {
  echo "== time per phase (nproc $(nproc)) =="
  printf '%s\n' "${phases[@]}"
  printf '%-27s %4d s\n' total "$SECONDS"
}
trap report EXIT
phase setup bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
phase ruff ruff check .
phase mypy mypy
if [ $# -gt 0 ]; then  # the tests given: one pass in-process, then those marked both_paths again
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
  exit
fi
# The whole suite: two lanes side by side. Lane 1 here: the in-process pass, but for LANE_2's
# modules. Lane 2 (scripts/lane.sh, a network and mount namespace of its own): those modules
# in-process, then the agent pass — the e2e tests marked both_paths again, every invocation
# going through the node agent (SPEC §11); without the once_through_agent full-kernel tests,
# which lane 1's VM ran through an agent already (e2e/harness/vm/pytest_plugin.py). One
# full-kernel VM runs at a time (the VM plugin's lock); lane 2's output comes after lane 1's.
LANE_2=(e2e/test_fault_matrix.py e2e/test_policy_upstream_cases_with_pods_attached_as_multus_would.py
        e2e/test_ipam_plugin_e2e.py)
lane_dir=$(mktemp -d /tmp/vpa-lane.XXXXXX)
echo "lane 2 (its output follows lane 1's): $lane_dir/log"
unshare --net --mount --propagation private \
  bash scripts/lane.sh "$lane_dir" "in-process=${LANE_2[*]}" "agent=e2e" >"$lane_dir/log" 2>&1 &
lane_2=$!
rc=0
ignore=()
for module in "${LANE_2[@]}"; do ignore+=(--ignore "$module"); done
phase "pytest in-process" python -m pytest -p no:cacheprovider --durations=10 "${ignore[@]}" \
  || rc=$?
lane_start=$SECONDS
wait "$lane_2" || rc=$?
phases+=("$(printf '%-27s %4d s' "lane 2 after lane 1" $((SECONDS - lane_start)))")
echo "== lane 2 =="
cat "$lane_dir/log"
mapfile -t -O "${#phases[@]}" phases <"$lane_dir/phases" || true
exit $rc
