#!/usr/bin/env bash
# Installs what the demo and the tests need on a fresh Debian machine (idempotent; seconds when
# everything is there). One part and those before it:
#   setup.sh demo   what scripts/demo.sh's first part uses: Debian packages for the plugin's kernel
#                   work and the Go builds, a virtualenv with the project and its e2e extra, the
#                   control plane's etcd and kube-apiserver
#   setup.sh node   what a node (e2e/node, the demo's second part) runs besides: kubelet,
#                   kube-controller-manager, kube-scheduler, kubectl, containerd, runc, the
#                   reference CNI plugins, and the C toolchain runc and the pause image need
#   setup.sh [all]  what the tests use besides (scripts/test.sh): the test and bench extras,
#                   cnitool, the CRI e2e's containerd and pause image, galactic-router and gobgp,
#                   the full-kernel VM's packages
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
case "$part" in
  demo) level=1 ;;
  node) level=2 ;;
  all) level=3 ;;
  *) echo "usage: setup.sh [demo|node|all]" >&2; exit 2 ;;
esac

need_apt=()
want_cmd() {  # want_cmd PACKAGE COMMAND: PACKAGE unless COMMAND is on PATH or in /usr/sbin
  command -v "$2" >/dev/null || [ -x "/usr/sbin/$2" ] || need_apt+=("$1")
}
want_pkg() {  # want_pkg PACKAGE: PACKAGE unless it is installed
  dpkg -s "$1" >/dev/null 2>&1 || need_apt+=("$1")
}
apt_install() {  # apt_install [APT-GET OPTION...]: installs the packages wanted so far
  if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" "${need_apt[@]}" >/dev/null
    need_apt=()
  fi
}

# The plugin's kernel work (ip; nft for its host protection), the Go builds.
want_cmd iproute2 ip
want_cmd nftables nft
want_cmd golang-go go
if [ $level -ge 2 ]; then
  # A node: mount namespaces (unshare, nsenter); runc is built with cgo against libseccomp
  # (e2e/harness/cluster), the pause image is static C (gcc and a static libc).
  want_cmd util-linux unshare
  want_cmd gcc gcc
  want_pkg libc6-dev
  want_pkg libseccomp-dev
  want_cmd pkg-config pkg-config
fi
if [ $level -ge 3 ]; then
  want_cmd iputils-ping ping
  # containerd + runc for the CRI e2e; the datapath bench and tests use iperf3.
  want_cmd containerd containerd
  want_cmd runc runc
  want_cmd iperf3 iperf3
  # The tests' independent reader of a link's offloads (vpc-attach itself uses ethtool's netlink).
  want_cmd ethtool ethtool
  # galactic-router's generated eBPF objects (e2e/harness/galactic): clang-14, llvm-strip-14,
  # libbpf; bpftool: the tests' independent reader of galactic's pinned eBPF maps and programs.
  want_cmd clang-14 clang-14
  want_cmd llvm-14 llvm-strip-14
  want_pkg libbpf-dev
  want_cmd bpftool bpftool
  # Asked of tests by name (under CI=true a test that skips for want of one fails the run):
  # readelf reads the image's ELF files, linux/bpf.h is what clang-14 checks our layouts against.
  want_cmd binutils readelf
  want_pkg linux-libc-dev
fi
apt_install
if [ $level -ge 3 ]; then
  # The full-kernel VM for the fullkernel tests (e2e/harness/vm): Debian's kernel (its files
  # only: the running kernel does not change), qemu, and busybox for the VM's initramfs.
  want_pkg linux-image-amd64
  want_cmd qemu-system-x86 qemu-system-x86_64
  want_pkg busybox-static
  apt_install --no-install-recommends
  [ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# The stamp of every extra keeps its old name, so an existing .venv is not reinstalled.
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
extras=test,e2e,bench
if [ $level -lt 3 ]; then
  extras=e2e  # the harness: the control plane's certificates, its client, the CRI client
  [ -e "$stamp" ] || stamp=$stamp-e2e
fi
if [ ! -e "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  # compat: a plain .pth path entry; the default editable finder costs every start ~10 ms.
  .venv/bin/pip install -q -e ".[$extras]" --config-settings editable_mode=compat
  touch "$stamp"
fi

# Go builds, cached outside the repository keyed by version (a cache hit runs no go at all).
# The demo's first part runs only etcd and kube-apiserver (kube-controller-manager, a quarter of
# a cold build's CPU, comes with the node's binaries); a node also chains reference CNI plugins
# (and the tests run cnitool), built while the cluster's binaries are: on 2 cores one go build
# leaves a core idle while it downloads modules or links.
cluster=(build --api-server)
tools_pid=
if [ $level -ge 2 ]; then
  cluster=(build)
  tools=(build --plugins)
  if [ $level -ge 3 ]; then tools=(build); fi
  .venv/bin/python -m e2e.harness.tools "${tools[@]}" >&2 &
  tools_pid=$!
fi
if ! .venv/bin/python -m e2e.harness.cluster "${cluster[@]}" >&2; then
  if [ -n "$tools_pid" ]; then kill "$tools_pid" 2>/dev/null || true; fi
  exit 1
fi
if [ -n "$tools_pid" ]; then wait "$tools_pid"; fi
if [ $level -ge 3 ]; then
  # The CRI API stubs and the local pause image for the containerd e2e.
  .venv/bin/python -m e2e.harness.cri build >&2
  # galactic-router, galactic-cni (its eBPF uSID datapath) and our programs on galactic's code
  # (sidecar verdict, eBPF vrf_table sweep) from ../shared/peers' source archives, and
  # gobgpd/gobgp for the route collector (e2e/test_galactic_router.py), same cache.
  .venv/bin/python -m e2e.harness.galactic build >&2
fi
