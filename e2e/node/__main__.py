"""``python -m e2e.node {build,up,down}``: a real Kubernetes node running vpc-attach.

``up`` prints exactly one JSON line on stdout (SPEC §13); everything else goes to stderr and
to the logs in the state dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from e2e.harness.cluster import build
from e2e.harness.cluster.cluster import ClusterError
from e2e.harness.cluster.processes import ProcessExited
from e2e.harness.image import build_image
from e2e.harness.kube import ApiError
from e2e.node.node import Node, NodeError, down


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; return the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m e2e.node", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build (if needed) and cache the binaries and the image")
    up_parser = commands.add_parser("up", help="start a node in the background")
    up_parser.add_argument("--state-dir", type=Path, required=True,
                           help="absent or empty directory")
    up_parser.add_argument("--conflist", type=Path,
                           help="the node's CNI conflist (default: the veth-pod example)")
    down_parser = commands.add_parser("down", help="remove everything `up` made")
    down_parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)

    logging.basicConfig(stream=sys.stderr,
                        level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.command == "build":
            for name, path in build.ensure_all_built().items():
                print(f"{name}: {path}", file=sys.stderr)
            archive, ref = build_image()
            print(f"image {ref}: {archive}", file=sys.stderr)
        elif args.command == "up":
            node = Node.up(args.state_dir, args.conflist)
            print(json.dumps(node.info()), flush=True)
        else:
            down(args.state_dir)
    except (build.BuildError, ClusterError, NodeError, ApiError, ProcessExited, TimeoutError,
            OSError, RuntimeError) as exc:
        logging.getLogger("e2e.node").error("%s failed: %s", args.command, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
