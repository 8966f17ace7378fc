"""The standalone build (packaging/standalone) for tests: built into a directory outside /tmp,
and staged the way a node's installer stages it."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_SECONDS = 1500
INSTALL_TIMEOUT_SECONDS = 120
# Runs the plugin in a private mount namespace whose /tmp is a bind mount of "$0": anything the
# call writes to /tmp lands there, and nothing other processes write to /tmp is seen. Everything
# the calls need therefore lives outside /tmp (OUTSIDE_TMP).
OUTSIDE_TMP = "/var/tmp"
WATCH_TMP = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount --bind "$0" /tmp && exec "$@"']


class StandaloneError(RuntimeError):
    """The build or the installer failed; the message carries its output."""


def outside_tmp(prefix: str) -> Path:
    """A fresh directory that the /tmp bind mount does not hide."""
    return Path(tempfile.mkdtemp(prefix=f"vpa-{prefix}-", dir=OUTSIDE_TMP))


def build_standalone(out: Path) -> Path:
    """Build (or reuse the cached build of) the standalone dist layout into out: vpc-attach,
    vpc-attach-ipam, vpc-attach.lib/."""
    proc = subprocess.run(
        ["bash", str(REPO / "packaging/standalone/build.sh"), "--out", str(out)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False)
    if proc.returncode != 0:
        raise StandaloneError(f"standalone build into {out} failed:\n{proc.stdout}\n{proc.stderr}")
    return out


def stage_standalone(standalone: Path, work: Path) -> Path:
    """Stage the standalone build as a node's installer does, but with --root / and every host
    path below work, so the launcher's #! line names a path that exists here; the bin dir."""
    bin_dir = work / "opt/cni/bin"
    proc = subprocess.run(
        [str(standalone / "vpc-attach"), "install", "--root", "/", "--no-kubeconfig",
         "--manifest", str(work / "install-manifest.json"), "--cni-bin-dir", str(bin_dir),
         "--cni-conf-dir", str(work / "net.d"), "--host-config", str(work / "host.json"),
         "--node-name", "standalone-node"],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS, check=False)
    if proc.returncode != 0:
        raise StandaloneError(f"installing {standalone} into {work} failed: {proc.stderr}")
    return bin_dir
