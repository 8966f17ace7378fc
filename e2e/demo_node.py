"""The same attachment made by a real kubelet: a node (e2e.node) runs vpc-attach from its own
DaemonSet and image; a Pod created through the API gets its VPC interface from the plugin.

    python -m e2e.demo_node [--keep]

Prints the node, the Pod's Pod IPs, its eth0 from inside its network namespace, its
EndpointSlice and the BGP objects; then deletes the Pod and shows what is left (nothing of the
Pod), and brings the node down (unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from e2e.node import Node
from e2e.node.observe import (
    advertisements,
    create_pod,
    delete_pod,
    pod_manifest,
    pod_slices,
    sandbox,
    vrf_instances,
    wait_running,
)

POD = "demo-web"


def _show(title: str, objects: list[dict[str, Any]]) -> None:
    print(f"\n--- {title}: {len(objects) or 'none'}")
    for obj in objects:
        meta = obj["metadata"]
        shown: dict[str, Any] = {"metadata": {k: meta[k] for k in (
            "name", "namespace", "labels", "annotations", "ownerReferences") if k in meta}}
        shown.update({k: v for k, v in obj.items() if k in ("spec", "addressType", "endpoints")})
        print(json.dumps(shown, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the node running")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the demo needs root (mounts, cgroups, network namespaces)", file=sys.stderr)
        return 2
    state_dir = Path(tempfile.mkdtemp(prefix="vpc-attach-node-")) / "node"
    print(f"starting a node in {state_dir} (control plane, containerd, kubelet, the DaemonSet)"
          " ...", flush=True)
    node = Node.up(state_dir)
    try:
        print(json.dumps(node.info(), indent=2))
        conflist = node.loaded_conflist()
        print("\nthe node's CNI conflist (containerd's view):\n" + json.dumps(conflist, indent=2))
        with node.admin() as kube:
            create_pod(kube, pod_manifest(POD, node.runtime.pause.ref))
            pod = wait_running(kube, POD)
            print(f"\nPod default/{POD} Running on {node.node_name}; Pod IPs: "
                  f"{[entry['ip'] for entry in pod['status']['podIPs']]}")
            box = sandbox(node, pod["metadata"]["uid"])
            print(f"\n$ nsenter --net={box.netns} ip addr show eth0    # inside the Pod")
            print(node.namespace.run(["nsenter", f"--net={box.netns}", "ip", "addr", "show",
                                      "eth0"]).rstrip())
            _show("EndpointSlices owned by Pods", pod_slices(kube))
            _show("BGPAdvertisements", advertisements(node, kube))
            _show("BGPVRFInstances", vrf_instances(node, kube))
            if args.keep:
                print(f"\nkept: the node and its Pod (stop with: python -m e2e.node down "
                      f"--state-dir {state_dir})")
                return 0
            delete_pod(kube, POD)
            print(f"\nPod deleted (kubelet ran the CNI DEL); EndpointSlices owned by Pods: "
                  f"{len(pod_slices(kube))}; advertisements: "
                  f"{[a['metadata']['name'] for a in advertisements(node, kube)]}; "
                  f"VRF instances (kept until GC finds them unused): "
                  f"{[i['metadata']['name'] for i in vrf_instances(node, kube)]}")
        return 0
    finally:
        if not args.keep:
            node.down()
            state_dir.parent.rmdir()


if __name__ == "__main__":
    sys.exit(main())
