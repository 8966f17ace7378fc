"""CLI: ``python -m e2e.harness.vm run [--timeout S] [--share DIR] -- CMD...`` runs CMD as root
in the full-kernel VM (this directory, the same paths as here), streams its console, exits with
its status; ``python -m e2e.harness.vm build`` prepares (and caches) the kernel and initramfs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .boot import print_output, run
from .image import ImageError, ensure_image, missing_tools


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.harness.vm", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="prepare the cached kernel and initramfs; print their paths")
    run_parser = sub.add_parser("run", help="boot, run CMD, power off; exit with CMD's status")
    run_parser.add_argument("--timeout", type=float, default=600.0,
                            help="kill the VM after this many seconds (default 600)")
    run_parser.add_argument("--share", type=Path, default=None,
                            help="host directory shared read-write at the same path inside")
    run_parser.add_argument("command", nargs="+", help="the command (after --)")
    args = parser.parse_args(argv)
    unavailable = missing_tools()
    if unavailable:
        print(f"no full-kernel VM here: {unavailable}", file=sys.stderr)
        return 2
    try:
        image = ensure_image()
    except ImageError as exc:
        print(f"cannot prepare the VM: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "build":
        print(f"kernel {image.release}: {image.kernel}\ninitramfs: {image.initramfs}")
        return 0
    result = run(args.command, share=args.share, timeout=args.timeout,
                 on_output=print_output)
    print(f"vpcvm: booted in {result.boot_seconds:.1f} s, {result.total_seconds:.1f} s in all"
          f"{', timed out' if result.timed_out else ''}; exit status {result.returncode}",
          file=sys.stderr)
    return result.returncode if result.returncode >= 0 else 124


if __name__ == "__main__":
    sys.exit(main())
