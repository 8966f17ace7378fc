"""Run a `vpc-attach agent` for tests: started on a private socket, stopped exactly."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from e2e.harness.cnibin import installed
from e2e.harness.pace import agent_bound
from e2e.harness.wait import wait_until

HTTP_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port free on the host's loopback now (for an agent's metrics endpoint)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class AgentProcess:
    """A node agent process listening on `<directory>/agent.sock`.

    Its metrics endpoint is off unless `metrics` is set (test agents must not collide on the
    default 127.0.0.1:9471): True serves it on a free loopback port, a string is the address.
    """

    def __init__(self, directory: Path, prefix: list[str] | None = None,
                 env: dict[str, str] | None = None, executable: str | None = None,
                 metrics: bool | str = False) -> None:
        self.directory = directory
        self.socket = directory / "agent.sock"
        self.log = directory / "agent.log"
        self._argv = [*(prefix or []), executable or installed("vpc-attach"), "agent",
                      "--socket", str(self.socket)]
        if metrics is True:
            metrics = f"127.0.0.1:{free_port()}"
        self.metrics_address = metrics or None
        self._env = {**os.environ, "VPC_ATTACH_LOG_FILE": str(self.log),
                     "VPC_ATTACH_METRICS_ADDRESS": self.metrics_address or "", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def http_get(self, path: str) -> tuple[int, str]:
        """GET path from the agent's metrics endpoint: (status, body)."""
        assert self.metrics_address, "this agent serves no metrics"
        host, _, port = self.metrics_address.rpartition(":")
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=HTTP_TIMEOUT_S)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def scrape(self) -> str:
        """The agent's /metrics text (exposition format 0.0.4)."""
        status, body = self.http_get("/metrics")
        assert status == 200, body
        return body

    def start(self) -> AgentProcess:
        """Start and wait until the socket accepts (a killed agent's socket file may still be
        there: it must be this agent that answers), for as long as `pace.agent_bound` allows
        (a number of the plugin's cold starts measured here, and its lock deadline)."""
        self.proc = subprocess.Popen(self._argv, env=self._env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.directory / "agent.stderr", "ab"))  # noqa: SIM115
        proc = self.proc

        def running() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"agent did not start: it exited with status "
                                   f"{proc.returncode}: {self._stderr()}")

        try:
            wait_until(f"the agent accepting on {self.socket}", self._accepts,
                       agent_bound(self._env), interval=0.05, alive=running)
        except TimeoutError as exc:
            raise RuntimeError(f"agent did not start: {exc}: {self._stderr()}") from exc
        return self

    def _stderr(self) -> str:
        return (self.directory / "agent.stderr").read_text(errors="replace")

    def _accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(str(self.socket))
            except OSError:
                return False
        return True

    def kill(self) -> None:
        """SIGKILL the agent (a crash: no drain, its socket file and retired links stay) and
        reap it. Usable as a fault proxy rule's hook, to kill it at a chosen request."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        """Signal the agent and wait for it to exit; its exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def verb_lines(self) -> list[dict[str, Any]]:
        """The operator log lines the agent wrote (one per verb it served)."""
        if not self.log.exists():
            return []
        records = [json.loads(line) for line in self.log.read_text().splitlines()
                   if line.startswith("{")]
        return [record for record in records if "verb" in record]

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@dataclass
class OwnAgents:
    """The agents tests start for nodes of their own (conftest's `own_agents`), counted: the
    session's agent serving no invocation is then not taken for a misrouted agent pass."""

    started: int = 0

    def enter(self, stack: contextlib.ExitStack, directory: Path, prefix: list[str] | None = None,
              env: dict[str, str] | None = None) -> AgentProcess:
        """An agent for a test's node on `<directory>/agent.sock`, stopped when `stack` closes."""
        agent = stack.enter_context(AgentProcess(directory, prefix=prefix, env=env))
        self.started += 1
        return agent
