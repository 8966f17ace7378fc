#!/bin/busybox sh
# /init of the full-kernel VM (e2e/harness/vm): the host's root filesystem, shared read-only
# over 9p, under a tmpfs overlay becomes the guest's root, so every path (the repository, its
# .venv, the Go builds' cache) is the same as on the host; then the host's job script runs.
# The kernel hands unknown `name=value` parameters to /init as environment: vpcvm_share is the
# host directory shared read-write, mounted at the same path; the job script is in it.
/bin/busybox mkdir -p /proc /sys /dev /lower /rw
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
  echo "vpcvm-init: $*" >/dev/console
  echo o >/proc/sysrq-trigger
  sleep 60
}

while read -r module; do
  insmod "/modules/$module" || fail "insmod $module failed"
done </modules/order
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower \
  || fail "cannot mount the host's root (9p tag hostroot)"
mount -t tmpfs -o mode=0755 overlay-rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
  || fail "cannot mount the overlay root"

mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
# /tmp stays the host's (under the overlay): a repository cloned there is the cwd of the job.
mount -t bpf bpffs /newroot/sys/fs/bpf
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup 2>/dev/null
mkdir -p "/newroot$vpcvm_share"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 vmshare "/newroot$vpcvm_share" \
  || fail "cannot mount the share (9p tag vmshare)"
exec switch_root /newroot /bin/sh "$vpcvm_share/job.sh"
