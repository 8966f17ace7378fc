"""Attach a "pod" network namespace through the real `vpc-attach` plugin, against a local
control plane, and show everything it created; then detach and tear it all down.

    python -m e2e.demo [--keep]

Starts etcd + kube-apiserver (e2e/harness/cluster; no kube-controller-manager: attaching needs
none, and its build would delay the first part on a cold machine), creates this node's
BGPRouter and a Pod object, runs the installed executable exactly as a runtime would (CNI_* env,
config on stdin, authenticated as the plugin's ServiceAccount), prints the CNI result, the kernel
objects and the published Kubernetes objects, then runs DEL (unless --keep).
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

from e2e.harness import cnibin

NETNS = "vpa-demo-pod"
CONTAINER_ID = "demo-container-1"
NODE = "demo-node"


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kw)


def _show(title: str, argv: list[str]) -> None:
    print(f"\n$ {' '.join(argv)}    # {title}")
    print(_run(argv).stdout.rstrip() or "(nothing)")


def _show_object(title: str, obj: dict[str, Any] | None) -> None:
    print(f"\n--- {title}")
    if obj is None:
        print("(absent)")
        return
    meta = obj["metadata"]
    shown = {"metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations",
                                               "ownerReferences") if k in meta}}
    shown.update({k: v for k, v in obj.items() if k in ("spec", "addressType", "endpoints")})
    print(json.dumps(shown, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave everything running")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the demo needs root (network namespaces)", file=sys.stderr)
        return 2
    from e2e.harness.cluster import Cluster
    from e2e.harness.publishing import (
        advertisement,
        create_pod,
        create_router,
        endpoint_slice,
        vrf_instance,
    )

    work = Path(tempfile.mkdtemp(prefix="vpc-attach-demo-"))
    print(f"starting etcd and kube-apiserver in {work / 'cluster'} ...", flush=True)
    cluster = Cluster.up(work / "cluster", controller_manager=False)
    try:
        kube = cluster.admin()
        create_router(kube, NODE, locator="2001:db8:ff01::/48", node_id=1)
        pod_uid = create_pod(kube, "demo", NODE)
        conf = {
            "cniVersion": "1.1.0", "name": "vpc21", "type": "vpc-attach",
            "vpc": "21", "vpcattachment": "21", "attachment": "veth", "mtu": 1450,
            "isolation": "table",
            "ipam": {"type": "vpc-attach-ipam", "dataDir": str(work / "ipam"),
                     "ipv6_subnet": "fd00:21:ff01::/48", "ipv4_subnet": "172.21.1.0/24"},
        }
        # The network is vpc-attach with vpc-attach-ipam alone: no reference plugin to build.
        cni_bin = cnibin.populate(work / "bin", None)
        plugin = [str(cni_bin / "vpc-attach")]  # as a runtime runs it: from CNI_PATH
        _run(["ip", "netns", "add", NETNS])
        env = {**os.environ, "CNI_CONTAINERID": CONTAINER_ID,
               "CNI_NETNS": f"/var/run/netns/{NETNS}", "CNI_IFNAME": "eth0",
               "CNI_PATH": str(cni_bin),
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=demo;"
                           f"K8S_POD_UID={pod_uid}",
               "VPC_ATTACH_NODE_NAME": NODE,
               "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
               "VPC_ATTACH_LOCK_DIR": str(work / "locks"),
               "VPC_ATTACH_LOG_FILE": str(work / "vpc-attach.log"),
               "VPC_ATTACH_HOST_CONFIG": str(work / "host.json"),
               "VPC_ATTACH_IPAM_DATA_ROOT": str(work / "ipam")}
        # Tenancy (SPEC §14): the plugin attaches namespace default to VPC 21 only once a
        # VPCBinding admits it.
        from cni_plugin.kube.kinds import BINDINGS
        binding = {"apiVersion": "vpc-attach.datum.net/v1alpha1", "kind": "VPCBinding",
                   "metadata": {"name": "demo-vpc21"},
                   "spec": {"vpc": "21", "attachments": ["21"], "allowedUses": ["veth"],
                            "namespaceSelector": {"matchLabels": {
                                "kubernetes.io/metadata.name": "default"}}}}
        kube.create(BINDINGS.path(), binding)
        print("VPCBinding:\n" + json.dumps(binding, indent=2))
        print("network config:\n" + json.dumps(conf, indent=2))
        add = _run(plugin, input=json.dumps(conf), env={**env, "CNI_COMMAND": "ADD"})
        print(f"\nADD exit {add.returncode}:\n" + json.dumps(json.loads(add.stdout), indent=2))
        if add.returncode != 0:
            return 1
        result = json.loads(add.stdout)
        host = result["interfaces"][0]["name"]
        _show("inside the pod", ["ip", "-n", NETNS, "addr", "show", "eth0"])
        _show("pod routes", ["ip", "-n", NETNS, "route"])
        _show("host side", ["ip", "addr", "show", host])
        _show("per-VPC policy rules (one per family, whatever the attachments)",
              ["ip", "rule", "show", "pref", "1000"])
        _show("pinned neighbours", ["ip", "neigh", "show", "dev", host])
        from cni_plugin.core import naming
        from cni_plugin.publish.endpointslice import slice_name
        _show_object("BGPVRFInstance", vrf_instance(kube, naming.vrf_instance_name("21", NODE)))
        _show_object("BGPAdvertisement",
                     advertisement(kube, naming.advertisement_name("21", "21", NODE)))
        _show_object("EndpointSlice", endpoint_slice(kube, slice_name("demo", "21", "21", "IPv6")))
        print(f"\noperator log ({work / 'vpc-attach.log'}):")
        print((work / "vpc-attach.log").read_text().rstrip())
        if args.keep:
            print(f"\nkept: netns {NETNS}, link {host}, cluster state {work / 'cluster'} "
                  f"(stop with: python -m e2e.harness.cluster down --state-dir {work / 'cluster'})")
            return 0
        delete = _run(plugin, input=json.dumps({**conf, "prevResult": result}),
                      env={**env, "CNI_COMMAND": "DEL"})
        print(f"\nDEL exit {delete.returncode}; host link left: "
              f"{_run(['ip', 'link', 'show', host]).returncode == 0}; advertisement left: "
              f"{advertisement(kube, naming.advertisement_name('21', '21', NODE)) is not None}")
        return delete.returncode
    finally:
        if not args.keep:
            _run(["ip", "netns", "del", NETNS])
            cluster.down()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
