"""Policy scenes: MultiNetworkPolicy cases on a simulated node, the Pods' networks attached by
calling the plugin as Multus would (Multus does not run here).

A node is a network namespace where `vpc-attach` runs (in-process, or through the node's agent
started in it), with the cluster's plugin kubeconfig and its own node name, lock directory and
log. A case is a list of manifests: namespaces, NetworkAttachmentDefinitions, Pods and
policies, as a user writes them (the upstream cases are e2e/fixtures/multinetworkpolicy's, see
its README). For each Pod the scene does what kube-scheduler, the kubelet and Multus would: it
creates the Pod object and binds it to the node, makes its sandbox netns, and for each element
of its `k8s.v1.cni.cncf.io/networks` runs ADD with the NAD's config, CNI_IFNAME `net<n>` (or the
element's interface), `runtimeConfig.ips` from the element where the config has the `ips`
capability, and the Pod in CNI_ARGS; then it starts what the Pod's containers run (`nc`
listeners). Reachability is asked with real packets from one sandbox to another.

vpc-attach holds one Pod per (VPC, attachment) on a node, so a scene makes every
NetworkAttachmentDefinition a vpc-attach network whose Pods choose their attachment
(`vpcFromPod`) and gives each Pod the annotation `vpc-attach.datum.net/attachment` naming the
case's VPC and an attachment of its own, as an operator's admission webhook would; the NAD
keeps its name, IPAM block (with a test data directory) and capabilities, the policies and the
rest of the Pod are left as written.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import json
import re
import secrets
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.agentproc import AgentProcess, OwnAgents
from e2e.harness.kernel import run_ip
from e2e.harness.kube import Kube, crd_established
from e2e.harness.nodes import api_port, node_namespace
from e2e.harness.packets import Listener, in_netns, listener, send
from e2e.harness.plugin import Answer, Plugin, with_prev
from e2e.harness.tapguest import Guest, guest_on_tap
from e2e.harness.wait import wait_until

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "multinetworkpolicy"
# Multus' CRD (Multus does not run here; its CRD is what users' NADs are objects of).
NAD_CRD = FIXTURES.parent / "network-attachment-definitions.crd.yaml"
NAD_CRD_NAME = "network-attachment-definitions.k8s.cni.cncf.io"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NETWORKS = "k8s.v1.cni.cncf.io/networks"
ATTACHMENT_ANNOTATION = "vpc-attach.datum.net/attachment"
NAD_API = "/apis/k8s.cni.cncf.io/v1"
MNP_API = "/apis/k8s.cni.cncf.io/v1beta1"
SA_READY_S = 60.0
NAMESPACE_GONE_S = 120.0  # the namespace controller empties it first


@dataclass
class PolicyNode:
    """A simulated node running vpc-attach (and, with `agent`, its agent)."""

    name: str  # the node name the plugin publishes under
    netns: str
    plugin: Plugin
    lock_dir: Path
    work: Path
    environ: dict[str, str]
    agent: AgentProcess | None  # its metrics endpoint served on a free port
    prefix: list[str]  # argv prefix running a process of the node


@contextlib.contextmanager
def policy_node(cluster: Any, cni_bin: Path, work: Path, own_agents: OwnAgents, *,
                via_agent: bool, extra_env: dict[str, str] | None = None,
                netns: str | None = None, prefix: list[str] | None = None,
                name: str | None = None) -> Iterator[PolicyNode]:
    """A node netns with the plugin (and its agent, `via_agent`) inside; removed after. An
    existing node (a galactic scene's: its `netns`, the `prefix` running its processes and its
    `name`) is used as it is."""
    with ExitStack() as stack:
        if netns is None:  # its own, the API server forwarded into it
            netns = name = stack.enter_context(node_namespace(api_port(cluster.server)))
        assert name is not None
        prefix = prefix or in_netns(netns)
        lock_dir = work / "locks"
        lock_dir.mkdir(parents=True)
        environ = {"VPC_ATTACH_NODE_NAME": name,
                   "VPC_ATTACH_KUBECONFIG": str(cluster.plugin_kubeconfig),
                   "VPC_ATTACH_LOCK_DIR": str(lock_dir),
                   "VPC_ATTACH_LOG_FILE": str(work / "vpc-attach.log"),
                   "VPC_ATTACH_HOST_CONFIG": str(work / "absent-host.json"),
                   "VPC_ATTACH_MULTI_NETWORK_POLICY": "enforce",
                   **(extra_env or {})}
        plugin = Plugin(cni_bin, lock_dir, dict(environ), prefix=prefix)
        agent = None
        if via_agent:
            agent_dir = work / "agent"
            agent_dir.mkdir()
            agent = stack.enter_context(AgentProcess(agent_dir, prefix=prefix, env=environ,
                                                     metrics=True))
            own_agents.started += 1
            plugin.agent_socket = str(agent.socket)
        yield PolicyNode(name, netns, plugin, lock_dir, work, environ, agent, prefix)


def load_case(path: Path) -> list[dict[str, Any]]:
    """A case's manifests, in file order."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@dataclass
class Attached:
    """One network of a Pod as ADD left it."""

    ifname: str
    conf: dict[str, Any]
    result: dict[str, Any]
    args: str

    def address(self, version: int) -> str | None:
        """Its address of that IP version."""
        return next((ip["address"].split("/")[0] for ip in self.result.get("ips", [])
                     if ipaddress.ip_interface(ip["address"]).version == version), None)


@dataclass
class PodRun:
    """A Pod of the scene: its object, sandbox and attachments."""

    namespace: str
    name: str
    uid: str
    netns: str  # sandbox name
    attached: list[Attached] = field(default_factory=list)
    ears: dict[tuple[str, int], Listener] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The sandbox's path, CNI_NETNS."""
        return f"/var/run/netns/{self.netns}"


def nc_listeners(pod: dict[str, Any]) -> list[tuple[str, int]]:
    """(tcp|udp, port) of every `nc` a Pod's containers start listening (an argv, or several
    started by `sh -c "nc … & nc … & wait"`)."""
    found = []
    for container in pod.get("spec", {}).get("containers", []):
        argv = [str(word) for word in container.get("command") or []]
        commands = [shlex.split(part) for part in re.split(r"[&;]", argv[2])] \
            if argv[:2] == ["sh", "-c"] and len(argv) > 2 else [argv]
        for words in commands:
            listens = any(w == "--listen" or (w.startswith("-") and not w.startswith("--")
                                              and "l" in w) for w in words)
            numbers = [w for w in words if w.isdigit()]
            if words[:1] != ["nc"] or not listens or not numbers:
                continue
            udp = any(w in ("--udp", "-u") or (w.startswith("-") and not w.startswith("--")
                                                and "u" in w) for w in words)
            found.append(("udp" if udp else "tcp", int(numbers[-1])))
    return found


class AddRefused(AssertionError):
    """An ADD of the scene answered an error (`answer`: what the plugin said)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"ADD failed: {answer.stdout} {answer.stderr}")
        self.answer = answer


class Scene:
    """One case on one node: what it created, so it can all be removed again."""

    def __init__(self, kube: Kube, node: PolicyNode, vpc: str, work: Path, *,
                 isolation: str = "table", bgp: bool = False) -> None:
        self.kube = kube
        self.node = node
        work.mkdir(parents=True, exist_ok=True)
        self.isolation, self.bgp = isolation, bgp
        self.node_of: dict[tuple[str, str], PolicyNode] = {}
        self.vpc = vpc
        self.work = work
        self.pods: dict[tuple[str, str], PodRun] = {}
        self._created: list[str] = []  # API paths, deleted newest first
        self._nads: dict[tuple[str, str], dict[str, Any]] = {}
        self._next_attachment = 1
        self._stack = ExitStack()

    # API objects ---------------------------------------------------------------------------

    def namespace(self, manifest: dict[str, Any]) -> None:
        """Create a namespace (labels as written) and wait for its default ServiceAccount."""
        name = manifest["metadata"]["name"]
        self._create("/api/v1/namespaces", manifest, f"/api/v1/namespaces/{name}")
        wait_until(f"the default ServiceAccount of {name}", lambda: self.kube.get(
            f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None, SA_READY_S)

    def nad(self, manifest: dict[str, Any], attachment: str = "veth") -> None:
        """The NAD as a vpc-attach network (see the module's docstring); `tap`: its Pods are
        VMs on taps."""
        ensure_nad_crd(self.kube)
        converted = vpc_attach_nad(manifest, self.work / "ipam", attachment, self.isolation,
                                   self.bgp)
        namespace = converted["metadata"].get("namespace", "default")
        name = converted["metadata"]["name"]
        self._nads[(namespace, name)] = json.loads(converted["spec"]["config"])
        path = f"{NAD_API}/namespaces/{namespace}/network-attachment-definitions"
        existing = self.kube.get(f"{path}/{name}")
        if existing is not None:  # the same NAD of an earlier case (the default namespace's)
            self.kube.delete(f"{path}/{name}")
        self._create(path, converted, f"{path}/{name}")

    def policy(self, manifest: dict[str, Any]) -> str:
        """Create a MultiNetworkPolicy (or NetworkPolicy) as written; its path."""
        namespace = manifest["metadata"].get("namespace", "default")
        path = self.kube.object_path(manifest)
        created = self._create(path.rsplit("/", 1)[0], {**manifest, "metadata": {
            **manifest["metadata"], "namespace": namespace}}, path)
        dropped = dropped_fields(manifest.get("spec") or {}, created.get("spec") or {}, "spec")
        # A field the CRD's schema lacks is pruned by the API server: no node ever sees it.
        assert not dropped, f"the API server dropped {dropped} of {path} (its CRD's schema " \
            "lacks them): the policy as stored is not the one written"
        return path

    def pod(self, manifest: dict[str, Any], *, conflist: dict[str, Any] | None = None,
            listen_first: bool = False, node: PolicyNode | None = None) -> PodRun:
        """The Pod object, bound to the node, its sandbox attached to every network it asks
        for (first to `conflist` on eth0, as the runtime does for the Pod's primary network,
        when given), its listeners started (before any ADD with `listen_first`)."""
        pod = copy.deepcopy(manifest)
        namespace = pod["metadata"].setdefault("namespace", "default")
        name = pod["metadata"]["name"]
        node = node or self.node
        self.node_of[(namespace, name)] = node
        pod["metadata"].setdefault("annotations", {})[ATTACHMENT_ANNOTATION] = \
            f"{self.vpc}/{self._next_attachment}"
        self._next_attachment += 1
        path = f"/api/v1/namespaces/{namespace}/pods"
        created = self._create(path, pod, f"{path}/{name}")
        self.kube.create(f"{path}/{name}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node.name}})
        sandbox = f"vpa-ps-{secrets.token_hex(4)}"
        run_ip("netns", "add", sandbox)
        self._stack.callback(run_ip, "netns", "del", sandbox, check=False)
        run_ip("-n", sandbox, "link", "set", "lo", "up")
        run = PodRun(namespace, name, str(created["metadata"]["uid"]), sandbox)
        self.pods[(namespace, name)] = run
        if listen_first:
            self._listen(run, pod)
        if conflist is not None:
            self._add(run, conflist, "eth0")
        for position, element in enumerate(network_elements(pod, namespace)):
            self._attach(run, element, position)
        if not listen_first:
            self._listen(run, pod)
        return run

    def listen(self, key: tuple[str, str], kind: str, port: int) -> None:
        """A listener of the scene's own in a Pod on a port its containers leave free: a check
        to that port then sees the policy, not a refused connection (upstream's `nc` to a port
        nothing listens on fails whatever the policy says)."""
        run = self.pods[key]
        if (kind, port) not in run.ears:
            run.ears[(kind, port)] = self._stack.enter_context(
                listener(run.netns, kind, port, self.work))

    def _listen(self, run: PodRun, pod: dict[str, Any]) -> None:
        for kind, port in nc_listeners(pod):
            run.ears[(kind, port)] = self._stack.enter_context(
                listener(run.netns, kind, port, self.work))

    def _attach(self, run: PodRun, element: dict[str, Any], position: int) -> None:
        """ADD for one network element, as Multus runs it."""
        conf = copy.deepcopy(self._nads[(element["namespace"], element["name"])])
        ifname = element.get("interface") or f"net{position + 1}"
        stanza = conf["plugins"][0]
        if element.get("ips") and (stanza.get("capabilities") or {}).get("ips"):
            stanza["runtimeConfig"] = {"ips": element["ips"]}
        net = {**{k: v for k, v in conf.items() if k != "plugins"}, **stanza}
        self._add(run, net, ifname)

    def _add(self, run: PodRun, net: dict[str, Any], ifname: str) -> None:
        args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={run.namespace};K8S_POD_NAME={run.name};"
                f"K8S_POD_INFRA_CONTAINER_ID={run.netns};K8S_POD_UID={run.uid}")
        node = self.node_of[(run.namespace, run.name)]
        answer = node.plugin.call("ADD", net, container_id=run.netns, netns=run.path,
                                  ifname=ifname, CNI_ARGS=args)
        if answer.status != 0:
            raise AddRefused(answer)
        run.attached.append(Attached(ifname, net, answer.body, args))

    def _create(self, collection: str, body: dict[str, Any], path: str) -> dict[str, Any]:
        created = self.kube.create(collection, body)
        self._created.append(path)
        return created

    # Packets -------------------------------------------------------------------------------

    def address(self, namespace: str, pod: str, version: int = 4, ifname: str = "net1") -> str:
        """A Pod's address on one interface."""
        attached = next(a for a in self.pods[(namespace, pod)].attached if a.ifname == ifname)
        found = attached.address(version)
        assert found is not None, f"{namespace}/{pod} has no IPv{version} on {ifname}"
        return found

    def reaches(self, src: tuple[str, str], dst: tuple[str, str], kind: str, port: int,
                version: int = 4, timeout: float = 1.0, ifname: str = "net1") -> bool:
        """Whether one datagram or connection from src reaches dst's listener (at its address
        on `ifname`)."""
        source, target = self.pods[src], self.pods[dst]
        ear = target.ears[(kind, port)]
        payload = f"{src[1]}-{secrets.token_hex(3)}"
        sent = send(source.netns, kind, self.address(*dst, version, ifname), port, payload,
                    timeout=timeout)
        if kind == "tcp":
            return sent and _heard(ear, payload, timeout)
        return _heard(ear, payload, timeout)

    def reaches_address(self, src: tuple[str, str], address: str, ear: Listener, kind: str,
                        port: int, timeout: float = 1.0) -> bool:
        """Whether one datagram or connection from src reaches `ear` listening at address."""
        payload = f"{src[1]}-{secrets.token_hex(3)}"
        sent = send(self.pods[src].netns, kind, address, port, payload, timeout=timeout)
        return (sent or kind == "udp") and _heard(ear, payload, timeout)

    @contextlib.contextmanager
    def guest(self, namespace: str, pod: str) -> Iterator[Guest]:
        """The VM stand-in on a Pod's tap (its first attachment)."""
        attached = self.pods[(namespace, pod)].attached[0]
        tap = attached.result["interfaces"][0]["name"]
        node = self.node_of[(namespace, pod)]
        mtu = attached.result["interfaces"][0].get("mtu")
        with guest_on_tap(tap, attached.result, node_prefix=node.prefix, mtu=mtu) as vm:
            yield vm

    def guest_listener(self, guest: Guest, kind: str, port: int) -> Listener:
        """A listener in the VM stand-in, stopped with the scene."""
        return self._stack.enter_context(listener(guest.netns, kind, port, self.work))

    def close(self) -> None:
        """DEL every attachment as Multus would, then remove every object made."""
        for run in reversed(list(self.pods.values())):
            node = self.node_of[(run.namespace, run.name)]
            for attached in reversed(run.attached):
                node.plugin.call("DEL", with_prev(attached.conf, attached.result),
                                      container_id=run.netns, netns=run.path,
                                      ifname=attached.ifname, CNI_ARGS=attached.args)
        self._stack.close()
        for path in reversed(self._created):
            if "/pods/" in path:
                self.kube.delete(path, grace_period_seconds=0)
            else:
                self.kube.delete(path)
        # A later case may make a namespace of the same name: this one gone first.
        for path in self._created:
            if path.startswith("/api/v1/namespaces/") and path.count("/") == 4:
                self._wait_gone(path)

    def _wait_gone(self, path: str) -> None:
        wait_until(f"{path} deleted", lambda: self.kube.get(path) is None, NAMESPACE_GONE_S)


def dropped_fields(written: Any, stored: Any, where: str) -> list[str]:
    """The paths of what was written and is not stored (defaults the server adds aside)."""
    if isinstance(written, dict) and isinstance(stored, dict):
        return [found for key, value in written.items()
                for found in ([f"{where}.{key}"] if key not in stored else
                              dropped_fields(value, stored[key], f"{where}.{key}"))]
    if isinstance(written, list) and isinstance(stored, list) and len(written) == len(stored):
        return [found for index, (a, b) in enumerate(zip(written, stored, strict=True))
                for found in dropped_fields(a, b, f"{where}[{index}]")]
    return []


def ensure_nad_crd(kube: Kube) -> None:
    """Multus' NetworkAttachmentDefinition CRD, installed (and left) unless the cluster has it."""
    if kube.get(f"{CRDS}/{NAD_CRD_NAME}") is None:
        kube.apply(yaml.safe_load(NAD_CRD.read_text()))
    probe = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
             "metadata": {"name": "probe"}}
    wait_until("the NetworkAttachmentDefinition CRD served", lambda: crd_established(
        kube, NAD_CRD_NAME) and bool(kube.object_path(probe)), SA_READY_S)


def _heard(ear: Listener, payload: str, timeout: float) -> bool:
    try:
        wait_until(f"{payload!r} at the listener", lambda: payload in ear.payloads(), timeout,
                   interval=0.05)
    except TimeoutError:
        return False
    return True


def network_elements(pod: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    """A Pod's network-selection elements, each with its namespace filled in."""
    value = (pod["metadata"].get("annotations") or {}).get(NETWORKS, "")
    if not str(value).strip():
        return []
    if value.lstrip().startswith("["):
        elements = json.loads(value)
    else:
        elements = []
        for item in value.split(","):
            ns, _, rest = item.strip().rpartition("/")
            name, _, interface = rest.partition("@")
            elements.append({"name": name, "namespace": ns or namespace,
                             **({"interface": interface} if interface else {})})
    return [{**e, "namespace": e.get("namespace") or namespace} for e in elements]


def vpc_attach_nad(manifest: dict[str, Any], data_dir: Path, attachment: str = "veth",
                   isolation: str = "table", bgp: bool = False) -> dict[str, Any]:
    """The NetworkAttachmentDefinition as a vpc-attach network: Pods choose their attachment,
    the IPAM block and capabilities kept (host-local's data directory the test's)."""
    config = json.loads(manifest["spec"]["config"])
    first = (config.get("plugins") or [config])[0]
    ipam = dict(first.get("ipam") or {})
    if ipam.get("type") == "host-local":
        ipam["dataDir"] = str(data_dir)
    stanza: dict[str, Any] = {
        "type": "vpc-attach", "vpcFromPod": True, "isolation": isolation,
        "publish": {"bgp": bgp, "endpointSlice": True,
                    "endpointSliceFamilies": ["IPv6", "IPv4"]},
        "ipam": ipam}
    if attachment != "veth":
        stanza["attachment"] = attachment
    if first.get("capabilities"):
        stanza["capabilities"] = first["capabilities"]
    converted = copy.deepcopy(manifest)
    converted["spec"]["config"] = json.dumps({
        "cniVersion": config.get("cniVersion", "0.3.1"),
        "name": config.get("name") or manifest["metadata"]["name"],
        "plugins": [stanza]})
    return converted


_SCRAPE = r"""
import sys, urllib.request
print(urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode())
"""


def scrape(node: PolicyNode) -> dict[str, float]:
    """The node agent's metrics without labels, read from inside the node's netns."""
    assert node.agent is not None and node.agent.metrics_address
    done = subprocess.run([*node.prefix, sys.executable, "-c", _SCRAPE,
                           node.agent.metrics_address],
                          capture_output=True, text=True, timeout=60, check=True)
    found = {}
    for line in done.stdout.splitlines():
        if line and not line.startswith("#") and " " in line:
            name, _, value = line.rpartition(" ")
            try:
                found[name] = float(value)
            except ValueError:
                continue
    return found


def manifest_nad(name: str, subnet: str, namespace: str = "default",
                 capabilities: dict[str, bool] | None = None) -> dict[str, Any]:
    """A NetworkAttachmentDefinition as a user of upstream's cases writes it (host-local over
    `subnet`, or static with the `ips` capability when `subnet` is empty); the scene makes it
    a vpc-attach network."""
    ipam = {"type": "host-local", "subnet": subnet} if subnet else {"type": "static"}
    plugin: dict[str, Any] = {"type": "macvlan", "mode": "bridge", "ipam": ipam}
    if capabilities or not subnet:
        plugin["capabilities"] = capabilities or {"ips": True}
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"config": json.dumps({"cniVersion": "0.3.1", "name": name,
                                           "plugins": [plugin]})}}


def manifest_pod(name: str, namespace: str, labels: dict[str, str], networks: str, *,
                 listen: tuple[tuple[str, int], ...] = (("tcp", 5555),),
                 ports: tuple[tuple[str, int], ...] = ()) -> dict[str, Any]:
    """A Pod whose container listens with nc on `listen` (and names `ports`)."""
    commands = " & ".join(f"nc -kl{'u' if kind == 'udp' else ''}p {port}"
                          for kind, port in listen)
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/nc:1",
                                 "command": ["sh", "-c", f"{commands} & wait"]}
    if ports:
        container["ports"] = [{"name": port_name, "containerPort": number}
                              for port_name, number in ports]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": {NETWORKS: networks}},
            "spec": {"containers": [container]}}


def manifest_namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Namespace."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}}}


def manifest_policy(name: str, namespace: str, policy_for: str | None,
                    spec: dict[str, Any], kind: str = "MultiNetworkPolicy") -> dict[str, Any]:
    """A MultiNetworkPolicy for `policy_for` (or a NetworkPolicy)."""
    api = "k8s.cni.cncf.io/v1beta1" if kind == "MultiNetworkPolicy" else "networking.k8s.io/v1"
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if policy_for is not None:
        meta["annotations"] = {"k8s.v1.cni.cncf.io/policy-for": policy_for}
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec}


def agentless_order(manifests: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The case's Pods in an order a node without an agent enforces it in: each Pod after the
    Pods its policies' peers select (ADD reads the peers there are then; nothing follows
    later), None when the peers depend on each other in a circle."""
    from cni_plugin.policy.model import parse_policy
    pods = {_key(m): m for m in manifests if m["kind"] == "Pod"}
    spaces = {m["metadata"]["name"]: m["metadata"].get("labels") or {}
              for m in manifests if m["kind"] == "Namespace"}
    policies = [parse_policy(m) for m in manifests
                if m["kind"] in ("MultiNetworkPolicy", "NetworkPolicy")]
    needs: dict[tuple[str, str], set[tuple[str, str]]] = {key: set() for key in pods}
    for key, pod in pods.items():
        labels = pod["metadata"].get("labels") or {}
        for policy in policies:
            if policy.namespace != key[0] or policy.pod_selector is None or \
                    not policy.pod_selector.matches(labels):
                continue
            for peer in (p for rule in (*policy.ingress, *policy.egress)
                         for p in rule.peers or () if not p.never and p.ip_block is None):
                for other, candidate in pods.items():
                    in_space = other[0] == policy.namespace if peer.namespace_selector is None \
                        else peer.namespace_selector.matches(spaces.get(other[0], {}))
                    if other != key and in_space and (peer.pod_selector is None or
                                                      peer.pod_selector.matches(
                                                          candidate["metadata"].get("labels")
                                                          or {})):
                        needs[key].add(other)
    ordered: list[tuple[str, str]] = []
    while len(ordered) < len(needs):
        ready = [key for key in needs if key not in ordered and needs[key] <= set(ordered)]
        if not ready:
            return None
        ordered.extend(ready)
    return [pods[key] for key in ordered]


def _key(manifest: dict[str, Any]) -> tuple[str, str]:
    return (manifest["metadata"].get("namespace", "default"), manifest["metadata"]["name"])
