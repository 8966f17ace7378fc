"""Attach a "pod" network namespace through the real `vpc-attach` plugin and show the result.

    python -m e2e.demo [--keep]

Runs the installed executable exactly as a runtime would (CNI_* env, config on stdin), prints
the CNI result and the kernel objects it created, then runs DEL (unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from e2e.tools.gotools import reference_plugins_dir

NETNS = "vpa-demo-pod"
CONTAINER_ID = "demo-container-1"


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kw)


def _show(title: str, argv: list[str]) -> None:
    print(f"\n$ {' '.join(argv)}    # {title}")
    print(_run(argv).stdout.rstrip() or "(nothing)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the attachment in place")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the demo needs root (network namespaces)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="vpc-attach-demo-"))
    cni_bin = work / "bin"
    cni_bin.mkdir()
    for plugin in reference_plugins_dir().iterdir():
        (cni_bin / plugin.name).symlink_to(plugin)
    for ours in ("vpc-attach", "vpc-attach-ipam"):
        found = shutil.which(ours)
        if found:
            (cni_bin / ours).symlink_to(found)
    conf = {
        "cniVersion": "1.1.0", "name": "demo-vpc", "type": "vpc-attach",
        "vpc": "10", "vpcattachment": "10", "attachment": "veth", "mtu": 1450,
        "isolation": "table", "publish": {"bgp": False, "endpointSlice": False},
        "ipam": {"type": "host-local", "dataDir": str(work / "ipam"),
                 "ranges": [[{"subnet": "fd00:10:ff01::/64"}], [{"subnet": "172.16.10.0/24"}]]},
    }
    _run(["ip", "netns", "add", NETNS])
    env = {**os.environ, "CNI_CONTAINERID": CONTAINER_ID, "CNI_NETNS": f"/var/run/netns/{NETNS}",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(cni_bin),
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=demo",
           "VPC_ATTACH_LOCK_DIR": str(work / "locks"),
           "VPC_ATTACH_HOST_CONFIG": str(work / "host.json")}
    stdin = json.dumps(conf)
    print("network config:\n" + json.dumps(conf, indent=2))
    add = _run(["vpc-attach"], input=stdin, env={**env, "CNI_COMMAND": "ADD"})
    print(f"\nADD exit {add.returncode}:\n" + json.dumps(json.loads(add.stdout), indent=2))
    if add.returncode != 0:
        return 1
    host = json.loads(add.stdout)["interfaces"][0]["name"]
    _show("inside the pod", ["ip", "-n", NETNS, "addr", "show", "eth0"])
    _show("pod routes", ["ip", "-n", NETNS, "route"])
    _show("host side", ["ip", "-d", "addr", "show", host])
    _show("per-VPC policy rule", ["ip", "rule", "show", "iif", host])
    _show("pinned neighbours", ["ip", "neigh", "show", "dev", host])
    _show("routes to the pod in the VPC table", ["ip", "-4", "route", "show", "table", "all",
                                                  "dev", host])
    if args.keep:
        print(f"\nkept: netns {NETNS}, link {host}; config in {work}")
        return 0
    delete = _run(["vpc-attach"], input=json.dumps({**conf, "prevResult": json.loads(add.stdout)}),
                  env={**env, "CNI_COMMAND": "DEL"})
    print(f"\nDEL exit {delete.returncode}; host link present afterwards: "
          f"{_run(['ip', 'link', 'show', host]).returncode == 0}")
    _run(["ip", "netns", "del", NETNS])
    shutil.rmtree(work, ignore_errors=True)
    return delete.returncode


if __name__ == "__main__":
    sys.exit(main())
