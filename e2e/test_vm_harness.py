"""The full-kernel VM harness boots Debian's kernel, runs a command with this repository at its
own path, returns the command's status, shares a directory back, and kills a hung guest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from e2e.harness import vm
from e2e.harness.kernel import IS_ROOT

REPO_ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not IS_ROOT, reason="the VM's read-write share needs root (9p passthrough)"),
    pytest.mark.skipif(vm.missing_tools() is not None, reason=f"no VM: {vm.missing_tools()}"),
]


def test_command_sees_the_repository_and_a_full_kernel_and_its_status_comes_back(
        tmp_path: Path) -> None:
    image = vm.ensure_image()
    probe = ('uname -r >"$VPC_ATTACH_VM_OUT/release"; '
             '.venv/bin/python -c "import cni_plugin" && '
             'ip link add vrf-probe type vrf table 7 && ip -d link show vrf-probe '
             '>"$VPC_ATTACH_VM_OUT/vrf"; exit 3')
    chunks: list[str] = []
    result = vm.run(["sh", "-c", probe], cwd=REPO_ROOT, share=tmp_path, timeout=120,
                    env={"VPC_ATTACH_VM_OUT": str(tmp_path)}, on_output=chunks.append)
    assert result.returncode == 3 and not result.timed_out, result.console
    assert (tmp_path / "release").read_text().strip() == image.release
    assert "vrf table 7" in (tmp_path / "vrf").read_text()
    assert 0 < result.boot_seconds < result.total_seconds
    assert "".join(chunks) == result.console


def test_a_hung_guest_is_killed_at_the_timeout(tmp_path: Path) -> None:
    result = vm.run(["sleep", "600"], cwd=REPO_ROOT, share=tmp_path, timeout=20)
    assert result.timed_out and result.returncode == -1
    assert result.total_seconds < 40


def test_cli_streams_the_console_and_exits_with_the_command_status() -> None:
    cli = subprocess.run([sys.executable, "-m", "e2e.harness.vm", "run", "--timeout", "120",
                          "--", "sh", "-c", "echo from-the-guest; exit 5"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert cli.returncode == 5, cli.stderr
    assert "from-the-guest" in cli.stdout
    assert "booted in" in cli.stderr
