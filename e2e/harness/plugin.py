"""The plugin as a runtime runs it: the real `vpc-attach` executable from a CNI bin dir, CNI_*
environment, config on stdin, one JSON answer; and the network configs the tests hand it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.harness.pace import verb_bound
from netconf import base62

# Which path the plugin takes (SPEC §11): VPC_ATTACH_E2E_VIA=agent runs the e2e tests marked
# `both_paths` through a node agent; otherwise every invocation runs in-process (the socket
# named never exists).
VIA_AGENT = os.environ.get("VPC_ATTACH_E2E_VIA") == "agent"
NO_AGENT_SOCKET = "/nonexistent/vpc-attach-e2e/agent.sock"
# The tests' node confines vpc-attach-ipam's dataDir (SPEC §14's ipamDataRoot) to the temporary
# directory every test's dataDir is made in; e2e/test_stanza_host_settings.py checks the
# confinement itself with roots of its own.
IPAM_DATA_ROOT = tempfile.gettempdir()


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
    """Runs the real `vpc-attach` executable the way a runtime does: through the agent on
    `agent_socket` when one listens there (`environ` may name another), else in-process."""

    cni_bin: Path
    lock_dir: Path
    environ: dict[str, str] = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)  # e.g. ip netns exec NODE
    agent_socket: str = NO_AGENT_SOCKET  # the session's agent (conftest's `agent_socket`)

    def env(self, command: str, container_id: str, netns: str, ifname: str,
            **extra: str) -> dict[str, str]:
        """The CNI environment of one call."""
        env = {
            **os.environ,
            "CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
            "CNI_IFNAME": ifname, "CNI_PATH": str(self.cni_bin),
            "VPC_ATTACH_HOST_CONFIG": str(self.lock_dir / "absent-host.json"),
            "VPC_ATTACH_LOCK_DIR": str(self.lock_dir),
            "VPC_ATTACH_AGENT_SOCKET": self.agent_socket,
            "VPC_ATTACH_IPAM_DATA_ROOT": IPAM_DATA_ROOT,
            **self.environ,
        }
        env.update(extra)
        return env

    def call(self, command: str, conf: dict[str, Any], *, container_id: str = "c1",
             netns: str = "", ifname: str = "eth0", executable: str = "vpc-attach",
             **extra: str) -> Answer:
        """Run one verb and parse its single JSON document. It may take as long as its own
        deadline allows, and the starts of its process (`pace.verb_bound`)."""
        env = self.env(command, container_id, netns, ifname, **extra)
        bound = verb_bound(env, conf)
        try:
            proc = subprocess.run(
                [*self.prefix, str(self.cni_bin / executable)], input=json.dumps(conf).encode(),
                env=env, capture_output=True, timeout=bound.seconds, check=False)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"{executable} {command} did not answer within {bound}; its "
                               f"stderr: {_text(exc.stderr)[-2000:]}") from None
        out = proc.stdout.decode()
        body = json.loads(out) if out.strip() else None
        return Answer(proc.returncode, body, out, proc.stderr.decode())

    def ok(self, command: str, conf: dict[str, Any], **kw: Any) -> Any:
        """Run a verb that must succeed; return its parsed answer."""
        answer = self.call(command, conf, **kw)
        assert answer.status == 0, f"{command} failed: {answer.stdout} {answer.stderr}"
        return answer.body


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def random_vpc() -> str:
    """A VPC id no other test on the host is likely to use (above 10**6)."""
    return base62.encode_base62(secrets.randbelow(base62.VPC_LIMIT - 10**6) + 10**6)


def random_wide_vpc() -> str:
    """A `random_vpc` whose route target is wider than galactic's CRD takes: its low 32 bits
    have 10 digits (so an ADD asks the CRD first: cni_plugin/publish/bgp/crd_fit.py)."""
    low = 10**9 + secrets.randbelow(2**32 - 10**9)
    return base62.encode_base62(secrets.randbelow(base62.VPC_LIMIT >> 32) << 32 | low)


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


def host_local_reservations(data_dir: Path, network: str) -> list[str]:
    """Addresses host-local holds for network."""
    net_dir = data_dir / network
    if not net_dir.exists():
        return []
    return sorted(p.name for p in net_dir.iterdir()
                  if p.name not in ("lock",) and not p.name.startswith("last_reserved_ip"))
