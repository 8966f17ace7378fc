"""CLI: ``python -m e2e.harness.cri build`` prepares the CRI API stubs and the pause image (cached);
prints their paths as JSON."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time

from e2e.harness.cri.cache import BuildError
from e2e.harness.cri.pause import pause_image
from e2e.harness.cri.protos import CRI_API_MODULE, CRI_API_VERSION, stubs_dir


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m e2e.harness.cri", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build (or find cached) CRI stubs and the pause image")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        started = time.monotonic()
        try:
            stubs = stubs_dir()
            pause = pause_image()
        except BuildError as exc:
            print(f"build failed: {exc}", file=sys.stderr)
            return 1
        missing = [tool for tool in ("containerd", "ctr", "runc")
                   if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
        print(json.dumps({
            "cri_api": f"{CRI_API_MODULE}@{CRI_API_VERSION}", "stubs": str(stubs),
            "pause_archive": str(pause.archive), "pause_image": pause.ref,
            "missing_tools": missing, "seconds": round(time.monotonic() - started, 1),
        }, indent=2))
        return 1 if missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
