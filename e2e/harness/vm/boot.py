"""Boot the full-kernel VM once, run one command in it, stream its output, return its status.

The guest sees the host's root filesystem read-only (9p) under a tmpfs overlay, so the
repository and its .venv are at the same paths as on the host; a host directory (the
`share`) is mounted read-write at its own path, and is where the job script, the exit
status and anything a test leaves for the host go. One vCPU (``VPC_ATTACH_VM_CPUS``),
emulation (TCG) unless KVM is asked for: see `accel()`.
"""

from __future__ import annotations

import codecs
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .image import BUSYBOX, BootImage, ensure_image

QEMU = "/usr/bin/qemu-system-x86_64"
KVM_PROBE_SECONDS = 20.0
WATCH_INTERVAL_S = 1.0  # how often a running VM's watchdog is asked
DEFAULT_MEMORY_MIB = 2048
# Printed by the job script right before the command starts: what "booted" means.
READY_MARK = "vpcvm: ready"
# qemu's user-mode network: the guest's address, and the host's loopback as the guest sees it.
GUEST_ADDRESS, HOST_ADDRESS = "10.0.2.15", "10.0.2.2"
# Host environment the guest inherits; everything else is left behind.
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "CI", "PYTHONPATH")
PASSED_ENV_PREFIXES = ("VPC_ATTACH_",)


@dataclass(frozen=True)
class VMResult:
    """How a command in the VM ended."""

    returncode: int  # the command's exit status; -1 when the VM died before it ended
    boot_seconds: float  # qemu start to the job script's first line
    total_seconds: float
    timed_out: bool  # killed: the timeout passed, or the watchdog said why (in `console`)
    console: str  # everything the guest printed (kernel and command)


def accel(image: BootImage) -> str:
    """``VPC_ATTACH_VM_ACCEL`` (`tcg`, `kvm`), else `kvm` only where this kernel boots under it.

    Not every /dev/kvm runs a stock kernel (a nested one may refuse its MSRs or hang), so the
    default probes once per host kernel and image, and remembers the verdict next to the image.
    """
    chosen = os.environ.get("VPC_ATTACH_VM_ACCEL", "auto")
    if chosen in ("tcg", "kvm"):
        return chosen
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    verdict = image.kernel.with_name(f"kvm-probe-{os.uname().release}")
    if not verdict.exists():
        verdict.write_text(_probe_kvm(image))
    return verdict.read_text().strip()


def _probe_kvm(image: BootImage) -> str:
    """Boot the kernel under KVM to its initramfs's first error (no 9p here): did it get there?"""
    command = [QEMU, "-machine", "pc,accel=kvm", "-cpu", "host", "-smp", "1", "-m", "256",
               "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
               "-serial", "stdio", "-kernel", str(image.kernel), "-initrd", str(image.initramfs),
               "-append", "console=ttyS0 panic=-1 loglevel=3 rdinit=/init"]
    try:
        probe = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=KVM_PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        return "tcg"
    return "kvm" if b"vpcvm-init:" in probe.stdout else "tcg"


def run(argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
        share: Path | None = None, timeout: float = 600.0,
        on_output: Callable[[str], object] | None = None,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        on_start: Callable[[subprocess.Popen[bytes]], object] | None = None,
        host_network: bool = False,
        watchdog: Callable[[], str | None] | None = None) -> VMResult:
    """Boot, run ``argv`` as root in ``cwd`` (default: this process's cwd), power off.

    ``env`` is added to what the guest inherits (PASSED_ENV and VPC_ATTACH_* of this
    process). ``share`` (default: a fresh temporary directory, removed afterwards) is the
    read-write host directory, at the same path inside. What the console prints goes to
    ``on_output`` as it arrives. After ``timeout`` seconds the VM is killed (``timed_out``).
    ``on_start`` gets the qemu process once it runs (a caller that must stop it early kills it).
    ``host_network``: the guest reaches the host's loopback at HOST_ADDRESS (qemu's user-mode
    network, eth0 in the guest's root netns; nothing else is routed there).
    ``watchdog`` is asked every WATCH_INTERVAL_S while the VM runs: a text it returns (why the
    guest is deemed hung) kills the VM like the timeout does, and ends its console.
    """
    image = ensure_image()
    if share is None:
        with tempfile.TemporaryDirectory(prefix="vpc-attach-vm-") as scratch:
            return run(argv, cwd=cwd, env=env, share=Path(scratch), timeout=timeout,
                       on_output=on_output, memory_mib=memory_mib, on_start=on_start,
                       host_network=host_network, watchdog=watchdog)
    share = share.resolve()
    guest_env = _guest_env(env)
    (share / "job.sh").write_text(job_script(argv, cwd or Path.cwd(), guest_env, share,
                                             host_network))
    status_file = share / "exit-status"
    status_file.unlink(missing_ok=True)
    start = time.monotonic()
    console, ready_at, timed_out = _run_qemu(qemu_command(image, share, memory_mib,
                                                          host_network), timeout,
                                             on_output, start, on_start, watchdog)
    total = time.monotonic() - start
    status = status_file.read_text().strip() if status_file.exists() else ""
    boot = ready_at - start if ready_at is not None else total
    return VMResult(int(status) if status.lstrip("-").isdigit() else -1, boot, total, timed_out,
                    console)


def print_output(text: str) -> None:
    """An ``on_output`` that streams the console to this process's stdout."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _guest_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items()
                 if k in PASSED_ENV or k.startswith(PASSED_ENV_PREFIXES)}
    # Inside, the full-kernel tests run natively (see e2e.harness.vm.pytest_plugin).
    return {**inherited, "VPC_ATTACH_FULLKERNEL": "native", **(extra or {})}


def job_script(argv: Sequence[str], cwd: Path, env: Mapping[str, str], share: Path,
               host_network: bool = False) -> str:
    """The guest's PID 1 after switch_root: set the node up, run ``argv``, power off."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    network = ("modprobe virtio_net\n"
               "ip link set eth0 up\n"
               f"ip addr add {GUEST_ADDRESS}/32 dev eth0\n"
               f"ip route add {HOST_ADDRESS}/32 dev eth0 src {GUEST_ADDRESS}\n"
               if host_network else "")
    status = shlex.quote(str(share / "exit-status"))
    return (
        "#!/bin/sh\n"
        "# Written by e2e.harness.vm.boot: runs as PID 1 of the full-kernel VM.\n"
        f"{exports}"
        "hostname vpcvm\n"
        "ip link set lo up\n"
        "modprobe tun 2>/dev/null\n"
        f"{network}"
        f"cd {shlex.quote(str(cwd))} || exit 1\n"
        f"echo {shlex.quote(READY_MARK)}\n"
        f"{shlex.join(argv)} </dev/null 2>&1\n"
        f"echo $? >{status}\n"
        "sync\n"
        # reboot(2) at once: PID 1 must not exit (a kernel panic) nor exec while powering off.
        f"exec {BUSYBOX} poweroff -f\n"
    )


def qemu_command(image: BootImage, share: Path, memory_mib: int,
                 host_network: bool = False) -> list[str]:
    """qemu with the direct-boot kernel, the host's root read-only and ``share`` read-write
    (and, asked for, a user-mode network to the host's loopback)."""
    network = ["-netdev", "user,id=host", "-device", "virtio-net-pci,netdev=host"] \
        if host_network else []
    cmdline = ("console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init mitigations=off "
               f"tsc=reliable no_timer_check net.ifnames=0 vpcvm_share={share}")
    chosen = accel(image)
    return [
        QEMU, "-machine", f"pc,accel={chosen}", "-cpu", "max" if chosen == "tcg" else "host",
        "-smp", os.environ.get("VPC_ATTACH_VM_CPUS", "1"), "-m", str(memory_mib),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-serial", "stdio",
        "-kernel", str(image.kernel), "-initrd", str(image.initramfs), "-append", cmdline,
        "-fsdev", "local,id=hostroot,path=/,security_model=passthrough,readonly=on,"
                  "multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev", f"local,id=vmshare,path={share},security_model=passthrough",
        "-device", "virtio-9p-pci,fsdev=vmshare,mount_tag=vmshare",
        *network,
    ]


def _run_qemu(command: list[str], timeout: float, on_output: Callable[[str], object] | None,
              start: float, on_start: Callable[[subprocess.Popen[bytes]], object] | None,
              watchdog: Callable[[], str | None] | None = None,
              ) -> tuple[str, float | None, bool]:
    """Run qemu, feeding console chunks to ``on_output``; kill it after ``timeout`` or when
    ``watchdog`` says why."""
    chunks: list[str] = []
    ready_at: list[float] = []
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    if on_start is not None:
        on_start(process)
    reader = threading.Thread(target=_read_console,
                              args=(process.stdout, chunks, ready_at, on_output), daemon=True)
    reader.start()
    why = _wait_or_kill(process, timeout, start, watchdog)
    reader.join(timeout=10)
    if why:
        chunks.append(f"vpcvm: killed: {why}")
    return "".join(chunks), (ready_at[0] if ready_at else None), bool(why)


def _wait_or_kill(process: subprocess.Popen[bytes], timeout: float, start: float,
                  watchdog: Callable[[], str | None] | None) -> str:
    """Wait for qemu to exit; kill it once ``timeout`` passed or ``watchdog`` objects, and say
    why ("" when it exited by itself)."""
    why = ""
    while not why:
        left = timeout - (time.monotonic() - start)
        try:
            process.wait(timeout=max(0.0, min(left, WATCH_INTERVAL_S)))
            return ""
        except subprocess.TimeoutExpired:
            if left <= WATCH_INTERVAL_S:
                why = f"after {timeout:.0f} s (its timeout)"
            elif watchdog is not None:
                why = watchdog() or ""
    process.kill()
    process.wait()
    return why


def _read_console(stream: IO[bytes] | None, chunks: list[str], ready_at: list[float],
                  on_output: Callable[[str], object] | None) -> None:
    """Pass on whatever the console printed as soon as it arrives (pytest's progress dots
    come without a newline); note when the job script said it is ready."""
    assert stream is not None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    recent = ""  # the serial console may hand over a line a few bytes at a time
    while raw := os.read(stream.fileno(), 65536):
        text = decoder.decode(raw).replace("\r", "")  # the serial console ends lines \r\n
        chunks.append(text)
        if not ready_at:
            recent = (recent + text)[-2 * len(READY_MARK):]
            if f"{READY_MARK}\n" in recent:
                ready_at.append(time.monotonic())
        if on_output is not None:
            on_output(text)
