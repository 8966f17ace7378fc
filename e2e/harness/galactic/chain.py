"""galactic's own CNI chain for a Pod on a simulated node: galactic-veth (the veth, the VRF, the
host gateway; it reads and annotates the Pod's NetworkAttachmentDefinition) then galactic-bgp
(BGP objects, the eBPF datapath's rows, `usid_egress`), built from ``../shared/peers`` and run
by the real libcni client (cnitool) as a node's runtime runs a conflist: what vpc-attach's
registration is compared with (SPEC §15).

galactic-veth finds the reference `host-device` plugin next to its own executable, so both are
copied into a bin dir of their own. The chain reads the node's name, its kubeconfig and its log
file from its `GALACTIC_CNI_*` environment (no `10-galactic.conflist` on these nodes).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cni_plugin.core import naming
from e2e.harness.galactic.build import GalacticBuild
from e2e.harness.galactic.datapath import DatapathNode
from e2e.harness.kernel import run_ip, temporary_netns
from e2e.harness.kube import Kube, crd_established
from e2e.harness.publishing import BGP_NS, create_pod, delete_pod
from e2e.harness.wait import wait_until

NAD_CRD = Path(__file__).resolve().parents[2] / "fixtures" / \
    "network-attachment-definitions.crd.yaml"
NAD_CRD_NAME = "network-attachment-definitions.k8s.cni.cncf.io"
NADS = "/apis/k8s.cni.cncf.io/v1/namespaces/{namespace}/network-attachment-definitions"
CHAIN_TIMEOUT_S = 300.0  # two Go plugins and host-device under emulation, each with API calls


def ensure_nad_crd(kube: Kube) -> None:
    """The NetworkAttachmentDefinition CRD (Multus installs it on a real cluster), served."""
    kube.apply(yaml.safe_load(NAD_CRD.read_text()))
    probe = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
             "metadata": {"name": "probe"}}
    wait_until("the NetworkAttachmentDefinition CRD to be served",
               lambda: crd_established(kube, NAD_CRD_NAME) and bool(kube.object_path(probe)),
               60)


def conflist(name: str, vpc: str, att: str, ipam: dict[str, Any],
             mtu: int | None = None) -> dict[str, Any]:
    """galactic's chain for one attachment, as its VPC operator templates it: galactic-veth
    with the attachment and its IPAM block, then galactic-bgp."""
    veth: dict[str, Any] = {"type": "galactic-veth", "vpc": vpc, "vpcattachment": att,
                            "ipam": ipam}
    if mtu is not None:
        veth["mtu"] = mtu
    return {"cniVersion": "1.0.0", "name": name, "plugins": [
        veth, {"type": "galactic-bgp", "vpc": vpc, "vpcattachment": att}]}


@contextlib.contextmanager
def nad(kube: Kube, namespace: str, chain: dict[str, Any]) -> Iterator[str]:
    """The NetworkAttachmentDefinition galactic-veth reads (named as the conflist, holding
    it); deleted afterwards. Its path."""
    collection = NADS.format(namespace=namespace)
    kube.create(collection, {"apiVersion": "k8s.cni.cncf.io/v1",
                             "kind": "NetworkAttachmentDefinition",
                             "metadata": {"name": chain["name"]},
                             "spec": {"config": json.dumps(chain)}})
    path = f"{collection}/{chain['name']}"
    try:
        yield path
    finally:
        kube.delete(path)


@dataclass(frozen=True)
class GalacticChain:
    """galactic's chain installed for one node: where its plugins and conflists are."""

    node: DatapathNode
    bin_dir: Path
    conf_dir: Path
    cache_dir: Path
    log_file: Path
    kubeconfig: Path

    def environ(self, cni_args: str) -> dict[str, str]:
        """cnitool's environment (CNI_PATH, NETCONFPATH, CNI_ARGS) and the chain's own."""
        from e2e.harness.tools.gotools import cnitool_env
        env = cnitool_env(self.bin_dir, self.conf_dir, ifname="eth0", cni_args=cni_args,
                          base={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        env.update(GALACTIC_CNI_NODE_NAME=self.node.name,
                   GALACTIC_CNI_KUBECONFIG=str(self.kubeconfig),
                   GALACTIC_CNI_LOG_FILE=str(self.log_file), GALACTIC_CNI_LOG_LEVEL="debug")
        return env

    def run(self, verb: str, chain: dict[str, Any], netns: str,
            cni_args: str) -> subprocess.CompletedProcess[str]:
        """`cnitool VERB` of the conflist as a process of the node (its netns and bpffs)."""
        from e2e.harness.tools.gotools import cnitool_command
        (self.conf_dir / f"{chain['name']}.conflist").write_text(json.dumps(chain))
        argv = cnitool_command(verb, chain["name"], netns, cache_dir=self.cache_dir)
        return subprocess.run([*self.node.prefix, *argv], env=self.environ(cni_args),
                              capture_output=True, text=True, timeout=CHAIN_TIMEOUT_S,
                              check=False)

    def ok(self, verb: str, chain: dict[str, Any], netns: str,
           cni_args: str) -> dict[str, Any]:
        """`run`, failing with the chain's output and log when it does; the result (ADD)."""
        done = self.run(verb, chain, netns, cni_args)
        if done.returncode != 0:
            raise AssertionError(f"galactic's chain {verb} failed ({done.returncode}):\n"
                                 f"{done.stdout}\n{done.stderr}\n--- log:\n{self.log_tail()}")
        return json.loads(done.stdout) if done.stdout.strip() else {}

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the chain's log."""
        if not self.log_file.exists():
            return "(no log)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


def install_chain(node: DatapathNode, build: GalacticBuild, reference_plugins: Path,
                  directory: Path, kubeconfig: Path) -> GalacticChain:
    """galactic-veth, galactic-bgp, host-device and the reference IPAM plugins in a bin dir of
    their own (copied: galactic-veth looks for host-device beside its resolved executable)."""
    bin_dir, conf_dir, cache_dir = (directory / "bin", directory / "net.d", directory / "cache")
    for made in (bin_dir, conf_dir, cache_dir):
        made.mkdir(parents=True, exist_ok=True)
    for program in (build.veth, build.bgp):
        shutil.copy2(program, bin_dir / program.name)
    for name in ("host-device", "static", "host-local", "loopback"):
        shutil.copy2(reference_plugins / name, bin_dir / name)
    return GalacticChain(node, bin_dir, conf_dir, cache_dir, directory / "galactic-cni.log",
                         kubeconfig)


def static_ipam(v6: str, v4: str) -> dict[str, Any]:
    """The reference `static` IPAM plugin with one address per family and gateways at ::1 and
    .1: the same addresses whichever chain attaches the Pod."""
    return {"type": "static", "addresses": [
        {"address": f"{v6}/64", "gateway": v6.rsplit(":", 1)[0] + ":1"},
        {"address": f"{v4}/32", "gateway": v4.rsplit(".", 1)[0] + ".1"}]}


@dataclass
class GalacticPod:
    """A Pod galactic's chain attached: its name, netns and addresses; `detach` runs the
    chain's DEL (once)."""

    name: str
    netns: str  # path
    v4: str
    v6: str
    detach: Callable[[], None]

    @property
    def netns_name(self) -> str:
        """Its netns by name."""
        return os.path.basename(self.netns)


@contextlib.contextmanager
def galactic_pod(kube: Kube, chain: GalacticChain, vpc: str, att: str,
                 ipam: dict[str, Any], namespace: str = "default") -> Iterator[GalacticPod]:
    """A Pod attached by galactic's chain through its NAD; the chain's DEL afterwards, then
    what galactic-bgp's DEL leaves to galactic's GC removed here: the VPC's VRF and the
    attachment's BGPAdvertisement (its map rows: `rows.forget`)."""
    name = f"gx-{att}-{os.urandom(2).hex()}"
    create_pod(kube, name, chain.node.name, namespace)
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
    chained = conflist(f"galactic-{vpc.lower()}-{att}", vpc, att, ipam)
    with nad(kube, namespace, chained), temporary_netns("vpa-gx") as netns:
        result = chain.ok("add", chained, netns, args)
        done: list[bool] = []

        def detach() -> None:
            if not done:
                chain.ok("del", chained, netns, args)
                done.append(True)
        four, six = (ip["address"].split("/")[0] for ip in
                     sorted(result["ips"], key=lambda ip: ":" in ip["address"]))
        try:
            yield GalacticPod(name, netns, four, six, detach)
        finally:
            detach()
            run_ip("-n", chain.node.netns, "link", "del", naming.vrf_name(vpc), check=False)
            kube.delete(f"/apis/network.datumapis.com/v1alpha1/namespaces/{BGP_NS}/"
                        f"bgpadvertisements/{naming.shared_advertisement_name(vpc, att)}")
            delete_pod(kube, name, namespace)
