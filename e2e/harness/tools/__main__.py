"""CLI: ``python -m e2e.harness.tools build`` builds the Go CNI tools; prints their paths as JSON.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from . import gotools


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.harness.tools", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    build = sub.add_parser(
        "build", help="build (or find cached) reference CNI plugins and cnitool; print JSON"
    )
    build.add_argument(
        "--plugins", action="store_true", help="only the reference plugins (no cnitool)"
    )
    args = parser.parse_args(argv)
    if args.cmd == "build":
        # SIGTERM -> SystemExit: subprocess.run kills go, finally-blocks drop the staging dir.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        start = time.monotonic()
        try:
            paths = gotools.build_plugins() if args.plugins else gotools.build_all()
        except gotools.GoToolsError as exc:
            print(f"build failed: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({**paths, "seconds": round(time.monotonic() - start, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
