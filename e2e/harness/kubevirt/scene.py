"""A VM network on one node (`Scene`): its config with `allowPersistentIPs`, the node, a
namespace of the test's own, the claims and virt-launcher Pods KubeVirt would make in it, and one
Pod's ADD and DEL as the runtime runs them (`Launcher`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from e2e.harness.kernel import temporary_netns
from e2e.harness.kube import Kube
from e2e.harness.kubevirt.standins import (
    IFNAME,
    VM,
    claims_namespace,
    kubelet_reports_succeeded,
    kubevirt_creates_claim,
    kubevirt_starts_launcher,
)
from e2e.harness.plugin import Answer, Plugin, base_conf, with_prev
from e2e.harness.publishing import Node, make_node
from tests.ipam_files import IpamFiles


class Launcher:
    """ADD and DEL of one virt-launcher Pod's attachment, as the runtime runs them."""

    def __init__(self, plugin: Plugin, node: Node, namespace: str, pod: tuple[str, str],
                 container: str, netns: str) -> None:
        self.plugin, self.node, self.namespace = plugin, node, namespace
        self.pod, self.uid = pod
        self.container, self.netns = container, netns

    def call(self, verb: str, conf: dict[str, Any]) -> Answer:
        """One verb of the Pod's element (net1), whatever it answers."""
        return self.plugin.call(verb, conf, container_id=self.container, netns=self.netns,
                                ifname=IFNAME,
                                CNI_ARGS=self.node.cni_args(self.pod, self.uid, self.namespace))

    def add(self, conf: dict[str, Any]) -> Answer:
        """The runtime's ADD, whatever it answers."""
        return self.call("ADD", conf)

    def ok(self, verb: str, conf: dict[str, Any]) -> Any:
        """A verb that must succeed; its answer."""
        answer = self.call(verb, conf)
        assert answer.status == 0, f"{verb} failed: {answer.stdout} {answer.stderr}"
        return answer.body


class Scene:
    """One test's VM network: its config, node, namespace and the claims and Pods in it."""

    def __init__(self, kube: Kube, plugin: Plugin, node: Node, namespace: str,
                 conf: dict[str, Any], data_dir: Path) -> None:
        self.kube, self.plugin, self.node, self.namespace = kube, plugin, node, namespace
        self.conf, self.data_dir = conf, data_dir

    def claim(self, network_config: str | None = None, vm: str = VM) -> str:
        """The claim ipam-extensions makes for ``vm`` on this network (or another config's
        name); its name."""
        made = kubevirt_creates_claim(self.kube, self.namespace,
                                      network_config or self.conf["name"], vm)
        return str(made["metadata"]["name"])

    def pod(self, claim: str | None) -> tuple[str, str]:
        """A virt-launcher Pod on the node naming the claim (or none), labelled with the
        claim's VM; (name, uid)."""
        return kubevirt_starts_launcher(self.kube, self.namespace, self.node.name, claim)

    def launcher(self, pod: tuple[str, str], container: str, netns: str) -> Launcher:
        """The runtime's calls for the Pod's sandbox ``container`` in ``netns``."""
        return Launcher(self.plugin, self.node, self.namespace, pod, container, netns)

    def attached_and_detached(self, pod: tuple[str, str], container: str) -> dict[str, Any]:
        """ADD then DEL of the Pod's container in a netns of its own, and the Pod completed
        (its VM stopped: the phase kubelet gives a virt-launcher Pod that exited, so it holds
        the claim no more); the ADD's result."""
        with temporary_netns("vpa-pip") as netns:
            launcher = self.launcher(pod, container, netns)
            result: dict[str, Any] = launcher.ok("ADD", self.conf)
            launcher.ok("DEL", with_prev(self.conf, result))
        kubelet_reports_succeeded(self.kube, self.namespace, pod[0])
        return result

    def files(self) -> IpamFiles:
        """vpc-attach-ipam's state on the node, read independently of its store."""
        return IpamFiles.read(self.data_dir)


def vm_network(vpc: str, data_dir: Path, **extra: Any) -> dict[str, Any]:
    """A tap-less VM network stanza (veth, publishing off) with allowPersistentIPs and
    vpc-attach-ipam pools in data_dir; `ipam` in extra adds to the pools' keys."""
    ipam = {"type": "vpc-attach-ipam", "dataDir": str(data_dir),
            "ipv6_subnet": "fd00:61::/64", "ipv4_subnet": "10.61.0.0/24"}
    ipam.update(extra.pop("ipam", {}))
    return base_conf(vpc, "61", name=f"vms-{vpc}", allowPersistentIPs=True, ipam=ipam,
                     capabilities={"ips": True}, **extra)


@contextmanager
def vm_scene(kube: Kube, cluster: Any, plugin: Plugin, vpc: str,
             directory: Path) -> Iterator[Scene]:
    """A node, a namespace of its own and a VM network; the node's ipamDataRoot is directory
    (so its notes of claims are the test's own)."""
    plugin.environ["VPC_ATTACH_IPAM_DATA_ROOT"] = str(directory)
    node = make_node(kube, cluster, plugin)
    with claims_namespace(kube) as namespace:
        yield Scene(kube, plugin, node, namespace, vm_network(vpc, directory / "ipam"),
                    directory / "ipam")
