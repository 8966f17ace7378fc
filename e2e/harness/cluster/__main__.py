"""``python -m e2e.harness.cluster {build,up,down}``: manage a local test control plane.

``up`` prints exactly one JSON line on stdout,
``{"admin_kubeconfig": ..., "plugin_kubeconfig": ...}``; everything else goes to stderr and to
the logs in the state dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from e2e.harness import ipamclaims
from e2e.harness.cluster import build
from e2e.harness.cluster.cluster import Cluster, ClusterError, down
from e2e.harness.cluster.processes import ProcessExited
from e2e.harness.kube import ApiError


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; return the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m e2e.harness.cluster", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser(
        "build",
        help="build (if needed) and cache the control plane (etcd, kube-apiserver, "
        "kube-controller-manager) and the node (kubelet, kube-scheduler, kubectl, containerd, "
        "containerd-shim-runc-v2, ctr, runc)",
    )
    only = build_parser.add_mutually_exclusive_group()
    only.add_argument(
        "--control-plane",
        action="store_true",
        help="only the control plane (what Cluster.up runs)",
    )
    only.add_argument(
        "--api-server",
        action="store_true",
        help="only etcd and kube-apiserver (what the demo's first part runs)",
    )
    pin_parser = commands.add_parser(
        "pin-kubernetes",
        help="rewrite gomod/kubernetes/go.mod for another k8s.io/kubernetes version",
    )
    pin_parser.add_argument("version", help="e.g. v1.36.3")
    pin_parser.add_argument("--module-dir", type=Path, default=build.KUBERNETES.module_dir)
    up_parser = commands.add_parser("up", help="start a control plane in the background")
    up_parser.add_argument(
        "--state-dir", type=Path, required=True, help="absent or empty directory"
    )
    down_parser = commands.add_parser(
        "down", help="stop the control plane and remove its state dir"
    )
    down_parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        if args.command == "build":
            if args.control_plane or args.api_server:
                built = build.ensure_control_plane_built(controller_manager=args.control_plane)
            else:
                built = build.ensure_all_built()
            for name, path in built.items():
                print(f"{name}: {path}", file=sys.stderr)
            # What `up` applies besides packaging/: fetched now, so `up` needs no network.
            print(f"ipamclaims: {ipamclaims.module_dir()}", file=sys.stderr)
        elif args.command == "pin-kubernetes":
            print(build.pin_kubernetes(args.version, args.module_dir), file=sys.stderr)
        elif args.command == "up":
            cluster = Cluster.up(args.state_dir)
            print(
                json.dumps(
                    {
                        "admin_kubeconfig": str(cluster.admin_kubeconfig),
                        "plugin_kubeconfig": str(cluster.plugin_kubeconfig),
                    }
                ),
                flush=True,
            )
        else:
            down(args.state_dir)
    except (build.BuildError, ClusterError, ApiError, ProcessExited, TimeoutError, OSError,
            ipamclaims.ModuleError) as exc:
        logging.getLogger("e2e.harness.cluster").error("%s failed: %s", args.command, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
