"""Fixtures for tests on the real kernel: namespaces, a CNI bin dir, the plugin as a subprocess.

Every fixture creates what it needs and removes exactly that; nothing else on the host is
touched. Tests that need root skip with the reason when not run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from e2e import cnibin
from netconf import base62

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root for network namespaces")


def run_ip(*args: str, check: bool = True) -> str:
    """Run `ip` and return stdout."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


@pytest.fixture(scope="session")
def reference_plugins() -> Path:
    """The Go reference plugins (built once and cached by e2e.tools)."""
    from e2e.tools.gotools import reference_plugins_dir
    return reference_plugins_dir()


@pytest.fixture(scope="session")
def cni_bin(tmp_path_factory: pytest.TempPathFactory, reference_plugins: Path) -> Path:
    """A CNI_PATH dir: the reference plugins and launchers of `vpc-attach`, `vpc-attach-ipam`."""
    return cnibin.populate(tmp_path_factory.mktemp("cni-bin"), reference_plugins)


def installed(executable: str) -> str:
    """Our console script next to this interpreter (not a pyenv shim found on PATH)."""
    found = cnibin.console_script(executable)
    if found is None:
        pytest.fail(f"{executable} is not installed (run scripts/setup.sh)")
    return found


# Which path the plugin takes (SPEC §11): VPC_ATTACH_E2E_VIA=agent runs the e2e suite through a
# node agent; otherwise every invocation runs in-process (the socket named never exists).
VIA_AGENT = os.environ.get("VPC_ATTACH_E2E_VIA") == "agent"
AGENT_SOCKET = {"path": "/nonexistent/vpc-attach-e2e/agent.sock"}


def pytest_report_header() -> str:
    """Say which path this run exercises."""
    return "vpc-attach path: " + ("through the node agent" if VIA_AGENT else "in-process")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Through the agent, run only the tests that invoke the plugin (the rest ran already)."""
    if not VIA_AGENT:
        return
    keep = [i for i in items if "plugin" in getattr(i, "fixturenames", ())]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """The node agent serving this session's invocations (agent mode only)."""
    if not VIA_AGENT:
        yield None
        return
    from e2e.agentproc import AgentProcess
    with AgentProcess(tmp_path_factory.mktemp("agent")) as running:
        AGENT_SOCKET["path"] = str(running.socket)
        yield str(running.socket)
        assert running.verb_lines(), "no invocation reached the agent"


@contextlib.contextmanager
def temporary_netns(prefix: str) -> Iterator[str]:
    """A fresh network namespace (its path, as a runtime passes CNI_NETNS), deleted after."""
    if not IS_ROOT:
        pytest.skip("needs root for network namespaces")
    name = f"{prefix}-{secrets.token_hex(4)}"
    run_ip("netns", "add", name)
    try:
        yield f"/var/run/netns/{name}"
    finally:
        run_ip("netns", "del", name, check=False)


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace for one test."""
    with temporary_netns("vpa-test") as path:
        yield path


@pytest.fixture
def vpc() -> Iterator[str]:
    """A random VPC id; its links and rules are removed after the test."""
    value = base62.encode_base62(secrets.randbelow(base62.VPC_LIMIT - 10**6) + 10**6)
    yield value
    prefix = "G" + naming.pad_base62(value, naming.VPC_WIDTH)
    for line in run_ip("-o", "link", "show").splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if link.startswith(prefix):
            run_ip("link", "del", link, check=False)
    for family in ("-4", "-6"):
        for line in run_ip(family, "rule", "show").splitlines():
            if f"iif {prefix}" in line:
                iif = line.split("iif ")[1].split()[0]
                run_ip(family, "rule", "del", "iif", iif, check=False)


@dataclass
class Answer:
    """What the plugin answered."""

    status: int
    body: Any
    stdout: str
    stderr: str

    @property
    def code(self) -> int | None:
        """The CNI error code, if it failed."""
        return self.body.get("code") if isinstance(self.body, dict) else None


@dataclass
class Plugin:
    """Runs the real `vpc-attach` executable the way a runtime does."""

    cni_bin: Path
    lock_dir: Path
    environ: dict[str, str] = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)  # e.g. ip netns exec NODE

    def env(self, command: str, container_id: str, netns: str, ifname: str,
            **extra: str) -> dict[str, str]:
        """The CNI environment of one call."""
        env = {
            **os.environ,
            "CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
            "CNI_IFNAME": ifname, "CNI_PATH": str(self.cni_bin),
            "VPC_ATTACH_HOST_CONFIG": str(self.lock_dir / "absent-host.json"),
            "VPC_ATTACH_LOCK_DIR": str(self.lock_dir),
            "VPC_ATTACH_AGENT_SOCKET": AGENT_SOCKET["path"],
            **self.environ,
        }
        env.update(extra)
        return env

    def call(self, command: str, conf: dict[str, Any], *, container_id: str = "c1",
             netns: str = "", ifname: str = "eth0", executable: str = "vpc-attach",
             **extra: str) -> Answer:
        """Run one verb and parse its single JSON document."""
        proc = subprocess.run(
            [*self.prefix, str(self.cni_bin / executable)], input=json.dumps(conf).encode(),
            env=self.env(command, container_id, netns, ifname, **extra),
            capture_output=True, timeout=60, check=False)
        out = proc.stdout.decode()
        body = json.loads(out) if out.strip() else None
        return Answer(proc.returncode, body, out, proc.stderr.decode())

    def ok(self, command: str, conf: dict[str, Any], **kw: Any) -> Any:
        """Run a verb that must succeed; return its parsed answer."""
        answer = self.call(command, conf, **kw)
        assert answer.status == 0, f"{command} failed: {answer.stdout} {answer.stderr}"
        return answer.body


@pytest.fixture
def plugin(cni_bin: Path, tmp_path: Path) -> Plugin:
    """The plugin runner, with host settings isolated from the machine's."""
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    return Plugin(cni_bin=cni_bin, lock_dir=lock_dir)


def base_conf(vpc: str, att: str = "1", **overrides: Any) -> dict[str, Any]:
    """A valid veth stanza with publishing off and `table` isolation (works on any kernel)."""
    conf: dict[str, Any] = {
        "cniVersion": "1.1.0", "name": f"net-{vpc}", "type": "vpc-attach", "vpc": vpc,
        "vpcattachment": att, "isolation": "table",
        "publish": {"bgp": False, "endpointSlice": False},
    }
    conf.update(overrides)
    return conf


def host_local(data_dir: Path, *subnets: str) -> dict[str, Any]:
    """An ipam block for the reference host-local plugin."""
    return {"type": "host-local", "dataDir": str(data_dir),
            "ranges": [[{"subnet": s}] for s in subnets]}


def with_prev(conf: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """conf with prevResult, as a runtime sends CHECK and DEL."""
    return {**conf, "prevResult": result}


def links_in(netns: str | None = None) -> set[str]:
    """Names of links in a netns (host when None)."""
    args = ["-o", "link", "show"] if netns is None else \
        ["-n", os.path.basename(netns), "-o", "link", "show"]
    return {line.split(":")[1].strip().split("@")[0] for line in run_ip(*args).splitlines()}


def host_local_reservations(data_dir: Path, network: str) -> list[str]:
    """Addresses host-local holds for network."""
    net_dir = data_dir / network
    if not net_dir.exists():
        return []
    return sorted(p.name for p in net_dir.iterdir()
                  if p.name not in ("lock",) and not p.name.startswith("last_reserved_ip"))


# The local control plane --------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real etcd + kube-apiserver + kube-controller-manager for the whole session."""
    from e2e.cluster import Cluster
    running = Cluster.up(tmp_path_factory.mktemp("cluster"))
    try:
        yield running
    finally:
        running.down()


class Kube:
    """Admin access for arranging and inspecting the cluster in tests (our own client)."""

    def __init__(self, kubeconfig: Path) -> None:
        from cni_plugin.kube.client import KubeClient
        from cni_plugin.kube.config import load_kubeconfig
        self.client = KubeClient(load_kubeconfig(str(kubeconfig)))

    def _deadline(self) -> Any:
        from cni_plugin.core.deadline import Deadline
        return Deadline(30)

    def get(self, path: str) -> dict[str, Any] | None:
        """An object or None."""
        return self.client.get(path, self._deadline())

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to a collection."""
        created: dict[str, Any] = self.client.request("POST", path, self._deadline(), body=body)
        return created

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT an object."""
        updated: dict[str, Any] = self.client.request("PUT", path, self._deadline(), body=body)
        return updated

    def delete(self, path: str) -> bool:
        """DELETE an object."""
        return self.client.delete(path, self._deadline())

    def list(self, path: str, labels: str | None = None) -> list[dict[str, Any]]:
        """Items of a collection."""
        return self.client.list(path, self._deadline(), labels=labels)


@pytest.fixture(scope="session")
def kube(cluster: Any) -> Kube:
    """Cluster-admin access (for arranging tests, never for the plugin)."""
    admin = Kube(cluster.admin_kubeconfig)
    for _ in range(300):  # Pods need the namespace's default ServiceAccount (made by KCM)
        if admin.get("/api/v1/namespaces/default/serviceaccounts/default") is not None:
            break
        time.sleep(0.1)
    return admin


# The standalone build (packaging/standalone) -------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_SECONDS = 1500
# Runs the plugin in a private mount namespace whose /tmp is a bind mount of "$0": anything the
# call writes to /tmp lands there, and nothing other processes write to /tmp is seen. Everything
# the calls need therefore lives outside /tmp (OUTSIDE_TMP).
OUTSIDE_TMP = "/var/tmp"
WATCH_TMP = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount --bind "$0" /tmp && exec "$@"']


def outside_tmp(prefix: str) -> Path:
    """A fresh directory that the /tmp bind mount does not hide."""
    return Path(tempfile.mkdtemp(prefix=f"vpa-{prefix}-", dir=OUTSIDE_TMP))


@pytest.fixture(scope="session")
def standalone() -> Iterator[Path]:
    """The standalone build (dist layout: vpc-attach, vpc-attach-ipam, vpc-attach.lib/)."""
    if not IS_ROOT:
        pytest.skip("needs root for network namespaces")
    work = outside_tmp("standalone")
    try:
        out = work / "dist"
        proc = subprocess.run(
            ["bash", str(REPO / "packaging/standalone/build.sh"), "--out", str(out)],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False)
        assert proc.returncode == 0, f"standalone build failed:\n{proc.stdout}\n{proc.stderr}"
        yield out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def stage_standalone(standalone: Path, work: Path) -> Path:
    """Stage the standalone build as a node's installer does, but with --root / and every host
    path below work, so the launcher's #! line names a path that exists here; the bin dir."""
    bin_dir = work / "opt/cni/bin"
    proc = subprocess.run(
        [str(standalone / "vpc-attach"), "install", "--root", "/", "--no-kubeconfig",
         "--manifest", str(work / "install-manifest.json"), "--cni-bin-dir", str(bin_dir),
         "--cni-conf-dir", str(work / "net.d"), "--host-config", str(work / "host.json"),
         "--node-name", "standalone-node"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return bin_dir
