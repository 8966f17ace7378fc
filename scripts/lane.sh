#!/usr/bin/env bash
# scripts/test.sh's second lane: pytest passes that run beside its in-process pass on a host of
# their own — a network namespace (links, routes, nftables, conntrack, ports, the control
# plane's loopback) and a mount namespace (/run with its netns mounts and lock dirs, /var/lib/cni,
# /sys with its own bpffs) — so that two passes never see each other's state. Most of a pass's
# time is waiting on processes (the machine is ~2/3 idle during the fault matrix), so a second
# pass beside the first costs little of its time.
#
#   lane.sh OUT_DIR [NAME=PYTEST-ARGS...]
#     runs under `unshare --net --mount` (scripts/test.sh does that); each NAME=ARGS is one pytest
#     pass (ARGS split on spaces; VIA=agent in front of NAME runs it through the node agent), its
#     wall time appended to OUT_DIR/phases, its base temp under OUT_DIR. Exits non-zero if any
#     pass failed; all passes run.
set -uo pipefail
out=$1
shift

# This lane's host: its loopback up, private mounts where vpc-attach and the tests keep node state.
mount --make-rprivate /
ip link set lo up
mount -t tmpfs -o mode=0755 lane-run /run
mkdir -p /run/lock /run/netns /run/user
chmod 1777 /run/lock
ln -s /dev/shm /run/shm
for dir in /var/lib/cni /var/log/vpc-attach /etc/vpc-attach /etc/cni/net.d; do
  [ -d "$dir" ] && mount -t tmpfs -o mode=0755 lane-state "$dir"
done
# sysfs shows the namespace that mounted it: this lane's links under /sys/class/net. Its own
# bpffs (pinned maps are per mount); the host's cgroup mounts, whatever their version.
mkdir /run/lane-host-sys
mount --rbind /sys /run/lane-host-sys
mount -t sysfs lane-sys /sys
mount -t bpf lane-bpf /sys/fs/bpf
mount --rbind /run/lane-host-sys/fs/cgroup /sys/fs/cgroup
umount -l /run/lane-host-sys
rmdir /run/lane-host-sys

rc=0
for pass in "$@"; do
  name=${pass%%=*}
  read -r -a args <<<"${pass#*=}"
  env=()
  case "$name" in agent*) env=(VPC_ATTACH_E2E_VIA=agent VPC_ATTACH_VM_ONCE_RAN=1) ;; esac
  echo "== lane 2: pytest $name: ${args[*]}"
  start=$SECONDS
  env "${env[@]}" python -m pytest -p no:cacheprovider --durations=10 \
    --basetemp "$out/$name" "${args[@]}" || rc=1
  printf '%-27s %4d s\n' "pytest $name (lane 2)" $((SECONDS - start)) >>"$out/phases"
done
exit $rc
