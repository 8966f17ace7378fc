#!/usr/bin/env bash
# Installs everything the demo and the tests need on a fresh Debian machine (idempotent):
# Debian packages, a virtualenv with the project and its extras, the Go-built CNI tools.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v ping >/dev/null || need_apt+=(iputils-ping)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v go >/dev/null || need_apt+=(golang-go)
# containerd + runc for the CRI e2e; gcc and a static libc for its pause image.
command -v containerd >/dev/null || need_apt+=(containerd)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need_apt+=(runc)
command -v gcc >/dev/null || need_apt+=(gcc)
dpkg -s libc6-dev >/dev/null 2>&1 || need_apt+=(libc6-dev)
# runc for the test node is built with cgo against libseccomp (e2e/harness/cluster).
dpkg -s libseccomp-dev >/dev/null 2>&1 || need_apt+=(libseccomp-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# Host protection writes its nftables table with nft; the datapath bench and tests use iperf3.
command -v nft >/dev/null || [ -x /usr/sbin/nft ] || need_apt+=(nftables)
command -v iperf3 >/dev/null || need_apt+=(iperf3)
# galactic-router's generated eBPF objects (e2e/harness/galactic): clang-14, llvm-strip-14, libbpf.
command -v clang-14 >/dev/null || need_apt+=(clang-14)
command -v llvm-strip-14 >/dev/null || need_apt+=(llvm-14)
dpkg -s libbpf-dev >/dev/null 2>&1 || need_apt+=(libbpf-dev)
# bpftool: the tests' independent reader of galactic's pinned eBPF maps and programs.
command -v bpftool >/dev/null || [ -x /usr/sbin/bpftool ] || need_apt+=(bpftool)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# The full-kernel VM for the fullkernel tests (e2e/harness/vm): Debian's kernel (its files
# only: the running kernel does not change), qemu, and busybox for the VM's initramfs.
need_vm=()
dpkg -s linux-image-amd64 >/dev/null 2>&1 || need_vm+=(linux-image-amd64)
command -v qemu-system-x86_64 >/dev/null || need_vm+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need_vm+=(busybox-static)
if [ ${#need_vm[@]} -gt 0 ]; then
  echo "setup: installing ${need_vm[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_vm[@]}" >/dev/null
fi
[ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  # compat: a plain .pth path entry; the default editable finder costs every start ~10 ms.
  .venv/bin/pip install -q -e '.[test,e2e,bench]' --config-settings editable_mode=compat
  touch "$stamp"
fi
# Reference CNI plugins and cnitool, built from Go modules and cached outside the repo.
.venv/bin/python -m e2e.harness.tools build >&2
# The local control plane (etcd, kube-apiserver, kube-controller-manager) and the node's
# binaries (kubelet, kube-scheduler, kubectl, containerd, runc), same cache.
.venv/bin/python -m e2e.harness.cluster build >&2
# The CRI API stubs and the local pause image for the containerd e2e.
.venv/bin/python -m e2e.harness.cri build >&2
# galactic-router, galactic-cni (its eBPF uSID datapath) and our programs on galactic's code
# (sidecar verdict, eBPF vrf_table sweep) from ../shared/peers' source archives, and
# gobgpd/gobgp for the route collector (e2e/test_galactic_router.py), same cache.
.venv/bin/python -m e2e.harness.galactic build >&2
