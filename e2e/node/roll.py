"""What the upgrade test does on a running node besides rolling it (SPEC §18): Pods that pick
their VPC attachment, the node's installed `vpc-attach` called as Multus calls it (a stand-in:
Multus does not run here), libcni's cached results, a stream of Pods created while the
DaemonSet rolls, and the agent process killed.

Everything names the node's own paths and runs in its mount namespace, so the executable under
test is the one the DaemonSet installed into the node's `/opt/cni/bin`, reading the host file
the installer wrote.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_plugin.agent.protocol import REFUSAL
from cni_plugin.install.binaries import BUNDLES_DIR as BUNDLES
from cni_plugin.tenancy.choice import ANNOTATION as ATTACHMENT_ANNOTATION
from e2e.harness.kube import Kube
from e2e.harness.pace import VERB_STARTS, pace, verb_bound
from e2e.harness.wait import wait_until
from e2e.node.node import Node
from e2e.node.observe import create_pod, pod_manifest, sandbox, sandboxes, wait_running
from e2e.node.state import Pod

PLUGIN = "/opt/cni/bin/vpc-attach"
CNI_PATH = "/opt/cni/bin"
STREAM_PERIOD_S = 1.5  # a new Pod every 1.5 s while the DaemonSet rolls
STREAM_MAX = 20
AGENT_GONE_S = 60.0
DOCTOR_API_S = 30.0  # its requests to the API server, each bounded by doctor itself
METRICS_PORT = 9471  # the DaemonSet's VPC_ATTACH_METRICS_ADDRESS: the node's IP, this port
METRICS_S = 10.0


@dataclass(frozen=True)
class Attached:
    """A Pod running on the node: its object, sandbox (the CNI container ID) and netns."""

    pod: dict[str, Any]
    sandbox_id: str
    netns: str

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def addresses(self) -> list[str]:
        return [entry["ip"] for entry in self.pod["status"].get("podIPs") or []]

    def side(self, *interfaces: str) -> Pod:
        """The Pod's side for a snapshot."""
        return Pod(self.name, self.netns, interfaces or ("eth0",))

    def cni_args(self, namespace: str = "default") -> str:
        """CNI_ARGS as containerd (and Multus after it) send them for this Pod."""
        return (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={self.name};"
                f"K8S_POD_INFRA_CONTAINER_ID={self.sandbox_id};K8S_POD_UID={self.uid}")


def attachment_pod(name: str, node: Node, vpc: str, attachment: str,
                   annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pause Pod whose annotation picks (vpc, attachment) from the node's `vpcFromPod`
    conflist."""
    manifest = pod_manifest(name, node.runtime.pause.ref)
    manifest["metadata"]["annotations"] = {ATTACHMENT_ANNOTATION: f"{vpc}/{attachment}",
                                           **(annotations or {})}
    return manifest


def start(admin: Kube, node: Node, manifest: dict[str, Any]) -> Attached:
    """Create the Pod and wait until it runs; what it got."""
    create_pod(admin, manifest)
    return running(admin, node, manifest["metadata"]["name"])


def running(admin: Kube, node: Node, name: str, timeout: float = 180.0) -> Attached:
    """The Pod once Running, with its ready sandbox."""
    pod = wait_running(admin, name, timeout=timeout)
    box = sandbox(node, pod["metadata"]["uid"])
    assert box.netns, f"sandbox {box.id} of {name} has no netns"
    return Attached(pod, box.id, box.netns)


# -- the node's executable, called as a runtime or Multus calls it ------------------------------


@dataclass(frozen=True)
class Answer:
    """One call of the node's executable."""

    status: int
    answer: dict[str, Any] | None
    stderr: str

    def ok(self) -> dict[str, Any]:
        """The result, or AssertionError with the CNI error."""
        assert self.status == 0, f"exit status {self.status}: {self.answer} {self.stderr}"
        return self.answer or {}


def call(node: Node, verb: str, conf: dict[str, Any], *, container_id: str = "",
         netns: str = "", ifname: str = "", cni_args: str = "", executable: str = PLUGIN,
         agent_socket: str = "") -> Answer:
    """`CNI_COMMAND=verb /opt/cni/bin/vpc-attach` (or another executable) in the node's mount
    namespace, config on stdin, the environment libcni gives a plugin (and the runtime's
    VPC_ATTACH_AGENT_SOCKET when given)."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "CNI_COMMAND": verb, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
           "CNI_IFNAME": ifname, "CNI_ARGS": cni_args, "CNI_PATH": CNI_PATH,
           "VPC_ATTACH_AGENT_SOCKET": agent_socket}
    bound = verb_bound({}, conf)  # the node's host file sets no deadline of its own
    proc = subprocess.run(node.namespace.enter([executable]), input=json.dumps(conf).encode(),
                          env={k: v for k, v in env.items() if v or k == "CNI_NETNS"},
                          capture_output=True, timeout=bound.seconds, check=False)
    text = proc.stdout.decode(errors="replace").strip()
    answer = json.loads(text) if text else None
    return Answer(proc.returncode, answer, proc.stderr.decode(errors="replace"))


def doctor(node: Node) -> dict[str, Any]:
    """`vpc-attach doctor --json` as the node's installed executable answers it, with its exit
    status."""
    bound = pace().plus(VERB_STARTS, DOCTOR_API_S, "doctor's API checks")
    proc = subprocess.run(node.namespace.enter([PLUGIN, "doctor", "--json"]),
                          capture_output=True, text=True, timeout=bound.seconds, check=False,
                          stdin=subprocess.DEVNULL)
    try:
        found: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        found = {"ok": None, "output": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}
    found["exit_status"] = proc.returncode
    return found


def plugin_stanza(conflist: dict[str, Any]) -> dict[str, Any]:
    """vpc-attach's stanza of a conflist as libcni hands it to the plugin (name, cniVersion)."""
    stanza = next(p for p in conflist["plugins"] if p["type"] == "vpc-attach")
    return {"cniVersion": conflist["cniVersion"], "name": conflist["name"], **stanza}


def cached_result(node: Node, network: str, container_id: str, ifname: str) -> dict[str, Any]:
    """The result libcni cached for the attachment (`/var/lib/cni/results/<network>-<id>-<if>`),
    which the runtime sends as prevResult."""
    path = node.host_path("/var/lib/cni") / "results" / f"{network}-{container_id}-{ifname}"
    cached: dict[str, Any] = json.loads(path.read_text())
    result: dict[str, Any] = cached["result"]
    return result


def valid_attachments(conf: dict[str, Any],
                      attachments: list[tuple[str, str]]) -> dict[str, Any]:
    """A GC config: the stanza with the runtime's valid list."""
    return {**conf, "cni.dev/valid-attachments": [{"containerID": c, "ifname": i}
                                                  for c, i in attachments]}


def node_sandbox_attachments(node: Node) -> list[tuple[str, str]]:
    """(container ID, eth0) of every sandbox the node's runtime knows and has not stopped:
    what containerd would list as valid for the node's conflist."""
    return [(box.id, "eth0") for box in sandboxes(node) if box.ready]


# -- Pods created while the DaemonSet rolls ------------------------------------------------------


@dataclass
class AddStream:
    """Creates a Pod every STREAM_PERIOD_S on its own thread until stopped (each picking a new
    attachment of `vpc`, numbered from `first`); their names, in order."""

    admin: Kube
    node: Node
    prefix: str
    vpc: str
    first: int
    names: list[str] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> AddStream:
        self._thread = threading.Thread(target=self._run, name="add-stream", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60.0)

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and len(self.names) < STREAM_MAX:
                name = f"{self.prefix}-{len(self.names)}"
                create_pod(self.admin, attachment_pod(name, self.node, self.vpc,
                                                      str(self.first + len(self.names))))
                self.names.append(name)
                self._stop.wait(STREAM_PERIOD_S)
        except BaseException as exc:  # reported by the test, never swallowed
            self.error = exc


# -- the agent process --------------------------------------------------------------------------


def agent_pids(node: Node) -> list[int]:
    """The node agent's processes: `vpc-attach agent` in the node's kubelet cgroup tree (never
    another test's agent on this machine)."""
    root = node.kubelet.cgroup_root.strip("/")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            cgroups = (proc / "cgroup").read_text()
        except OSError:
            continue
        argv = [part for part in cmdline if part]
        if root in cgroups and len(argv) == 2 and os.path.basename(argv[0]) == b"vpc-attach" \
                and argv[1] == b"agent":
            found.append(int(proc.name))
    return found


def kill_agent(node: Node) -> list[int]:
    """SIGKILL the node's agent (as the kernel's OOM killer or a kubelet past the grace period
    does); the pids killed."""
    pids = agent_pids(node)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until("the killed agent gone", lambda: not set(agent_pids(node)) & set(pids),
               AGENT_GONE_S, interval=0.05)
    return pids


def monotonic_ms() -> float:
    """Now, in milliseconds (for the report's timeline)."""
    return time.monotonic() * 1000.0


# -- the agent's wire protocol across releases --------------------------------------------------


def other_build(node: Node) -> str:
    """The node path of the staged standalone build the launcher does not run: the other
    release's, which the installer keeps for calls that started before its switch."""
    staged = node.cni_bin_dir / BUNDLES
    launcher = (node.cni_bin_dir / "vpc-attach").read_bytes()
    others = [path.name for path in staged.iterdir()
              if path.is_dir() and path.name.encode() not in launcher]
    assert len(others) == 1, f"staged builds besides the launcher's: {others}"
    return f"{CNI_PATH}/{BUNDLES}/{others[0]}/vpc-attach"


def agent_verbs(node: Node, verb: str) -> float:
    """How many `verb`s the node's agent has answered (its /metrics on the node's address)."""
    url = f"http://{node.node_ip}:{METRICS_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=METRICS_S) as answer:
        text = answer.read().decode()
    pattern = re.compile(r'^vpc_attach_verb_duration_seconds_count\{(.*)\} (\S+)$')
    return sum(float(match.group(2)) for line in text.splitlines()
               if (match := pattern.match(line)) and f'verb="{verb}"' in match.group(1))


def refused_frame(node: Node, frame: bytes) -> bytes:
    """What the node's agent answers to `frame` (another protocol version's request)."""
    path = node.host_path("/run") / "vpc-attach" / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(METRICS_S)
        client.connect(str(path))
        client.sendall(frame)
        return client.recv(16)


@contextmanager
def refusing_agent(directory: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A Unix socket answering every request with the protocol's refusal, as an agent of
    another version does; (its path, the first bytes of each request it got)."""
    path = directory / f"refusing-agent-{secrets.token_hex(3)}.sock"
    seen: list[bytes] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(METRICS_S)
                seen.append(conn.recv(4))
                conn.sendall(REFUSAL)

    thread = threading.Thread(target=serve, name="refusing-agent", daemon=True)
    thread.start()
    try:
        yield str(path), seen
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()
        path.unlink(missing_ok=True)
