"""`vpc-attach doctor` run as an operator runs it on a node, and its report read.

`run_doctor` runs any executable (a node's CNI bin dir, the standalone build) under any argv
prefix (a node's namespace); `doctor_on` runs it inside a simulated node with the settings the
node's plugin has; `doctor_node` is a node made for the doctor's own tests (host file, CNI
config dir, agent serving /readyz, BGPRouter). `DoctorReport.findings(check)` fails when the
check did not report at all, so a test asserting on a check's findings cannot pass because the
check never ran.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni_plugin.kernel.netns import entered
from cni_plugin.publish.resources import ROUTERS
from e2e.harness.agentproc import AgentProcess
from e2e.harness.kube import Kube
from e2e.harness.nodes import api_port, in_node, node_namespace
from e2e.harness.plugin import Plugin
from e2e.harness.publishing import BGP_NS, create_router
from e2e.harness.tenancy import bound
from e2e.harness.wait import wait_until

# The doctor asks the API server and the agent, each within its own bound; on a busy machine
# (or in the emulated VM) a run took tens of seconds.
DOCTOR_TIMEOUT_S = 120.0
DOCTOR_NODE_METRICS = "127.0.0.1:9471"  # the default: free inside the node's own namespace
AGENT_READY_S = 60.0

Finding = dict[str, str]


@dataclass(frozen=True)
class DoctorReport:
    """One `doctor --json` run: its exit status, the report, and its findings by check."""

    returncode: int
    report: dict[str, Any]
    stderr: str

    @property
    def by_check(self) -> dict[str, list[Finding]]:
        """Every finding, by its check's name, in report order."""
        found: dict[str, list[Finding]] = {}
        for finding in self.report["checks"]:
            found.setdefault(finding["check"], []).append(finding)
        return found

    def findings(self, check: str) -> list[Finding]:
        """The findings of ``check``; it must have reported (a missing check is a failure)."""
        found = self.by_check.get(check)
        assert found, f"doctor reported nothing for {check!r}: it reported " \
            f"{sorted(self.by_check)}"
        return found

    def statuses(self, check: str) -> list[str]:
        """The status of each finding of ``check`` (which must have reported)."""
        return [finding["status"] for finding in self.findings(check)]

    def starting(self, *prefixes: str) -> dict[str, list[Finding]]:
        """The findings of the checks whose names start with one of ``prefixes``."""
        return {check: found for check, found in self.by_check.items()
                if check.startswith(prefixes)}

    def failed(self) -> list[Finding]:
        """Every finding that is not ok or a warning."""
        return [f for found in self.by_check.values() for f in found
                if f["status"] not in ("ok", "warn")]


def run_doctor(argv: Sequence[str], env: dict[str, str], *args: str,
               timeout: float = DOCTOR_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`<argv> doctor <args>` (argv: a prefix and the executable) to its end."""
    return subprocess.run([*argv, "doctor", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def doctor_report(argv: Sequence[str], env: dict[str, str], *args: str,
                  timeout: float = DOCTOR_TIMEOUT_S) -> DoctorReport:
    """`doctor --json <args>`, its report parsed; the report's `ok` agrees with the exit
    status."""
    done = run_doctor(argv, env, "--json", *args, timeout=timeout)
    assert done.stdout.strip(), f"doctor printed no report (exit {done.returncode}): " \
        f"{done.stderr}"
    report = json.loads(done.stdout)
    assert report["ok"] == (done.returncode == 0), (report["ok"], done.returncode)
    return DoctorReport(done.returncode, report, done.stderr)


def node_env(plugin: Plugin) -> dict[str, str]:
    """The node's settings as its plugin's verbs get them (lock dir, agent socket, kubeconfig,
    node name, ipamDataRoot…), without a verb's CNI_* variables."""
    return {key: value for key, value in plugin.env("", "", "", "").items()
            if not key.startswith("CNI_")}


def doctor_on(plugin: Plugin, *args: str, executable: Path | None = None,
              timeout: float = DOCTOR_TIMEOUT_S) -> DoctorReport:
    """`vpc-attach doctor --json` inside the plugin's node (its argv prefix) with the node's
    settings, as an operator runs it there."""
    binary = executable or plugin.cni_bin / "vpc-attach"
    return doctor_report([*plugin.prefix, str(binary)], node_env(plugin), *args,
                         timeout=timeout)


# A node made for the doctor ---------------------------------------------------------------

@dataclass
class DoctorNode:
    """A node for the doctor: netns, name, router, host file, CNI config and a running agent."""

    netns: str
    name: str
    router: str
    tmp: Path
    cni_bin: Path
    host: dict[str, Any]
    stanza: dict[str, Any]
    agent: AgentProcess

    @property
    def host_file(self) -> Path:
        return self.tmp / "host.json"

    @property
    def conf_dir(self) -> Path:
        return self.tmp / "net.d"

    def write_host(self, **changes: Any) -> None:
        self.host_file.write_text(json.dumps({**self.host, **changes}))

    def write_conflist(self, name: str, stanza: dict[str, Any]) -> None:
        self.conf_dir.mkdir(exist_ok=True)
        (self.conf_dir / f"{name}.conflist").write_text(json.dumps(
            {"cniVersion": "1.1.0", "name": name, "plugins": [stanza, {"type": "tuning"}]}))

    def _argv(self) -> list[str]:
        return [*in_node(self.netns), str(self.cni_bin / "vpc-attach")]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "VPC_ATTACH_HOST_CONFIG": str(self.host_file),
                "VPC_ATTACH_METRICS_ADDRESS": DOCTOR_NODE_METRICS}

    def _dirs(self) -> list[str]:
        return ["--cni-conf-dir", str(self.conf_dir), "--cni-bin-dir", str(self.cni_bin),
                "--ipam-data-dir", str(self.tmp / "ipam")]

    def doctor(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`vpc-attach doctor` run inside the node, as an operator runs it there."""
        return run_doctor(self._argv(), self._env(), *self._dirs(), *args)

    def report(self) -> DoctorReport:
        """`doctor --json` inside the node: its exit status and findings."""
        return doctor_report(self._argv(), self._env(), *self._dirs())

    def ready(self) -> bool:
        """Whether the node's agent answers /readyz with 200 (asked inside the node)."""
        host, port = DOCTOR_NODE_METRICS.split(":")
        with entered(f"/var/run/netns/{self.netns}"):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                conn.request("GET", "/readyz")
                return conn.getresponse().status == 200
            finally:
                conn.close()


@contextlib.contextmanager
def doctor_node(kube: Kube, cluster: Any, cni_bin: Path,
                directory: Path) -> Iterator[DoctorNode]:
    """A healthy node for the doctor in ``directory``: its agent ready, its network valid, its
    router in place."""
    with node_namespace(api_port(cluster.server)) as netns:
        name = f"doc-{secrets.token_hex(3)}"
        router = create_router(kube, name)
        (directory / "agent").mkdir()
        host = {"nodeName": name, "kubeconfig": str(cluster.plugin_kubeconfig),
                "agentSocket": str(directory / "agent" / "agent.sock"),
                "lockDir": str(directory / "locks"), "logFile": str(directory / "vpc-attach.log"),
                "ipamDataRoot": str(directory)}
        stanza = {"type": "vpc-attach", "vpc": "jU", "vpcattachment": "1", "isolation": "table",
                  "ipam": {"type": "vpc-attach-ipam", "dataDir": str(directory / "ipam"),
                           "ipv6_subnet": "fd00:d0c::/48"}}
        agent = AgentProcess(directory / "agent", prefix=in_node(netns),
                             metrics=DOCTOR_NODE_METRICS,
                             env={"VPC_ATTACH_HOST_CONFIG": str(directory / "host.json")})
        doctor_node = DoctorNode(netns, name, router, directory, cni_bin, host, stanza, agent)
        doctor_node.write_host()
        doctor_node.write_conflist("vpc-jU", stanza)
        with agent, bound(kube, "jU"):
            wait_until("the node's agent to be ready", doctor_node.ready, AGENT_READY_S)
            try:
                yield doctor_node
            finally:
                kube.delete(ROUTERS.path(BGP_NS, router))
                kube.delete(ROUTERS.path(BGP_NS, f"{router}-second"))
