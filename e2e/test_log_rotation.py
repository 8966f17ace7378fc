"""The operator log rotates by size while the node agent and in-process invocations write the
same file at once (SPEC §12): across many rotations no summary line is lost, split, doubled or
mixed with another, and no file grows past logMaxBytes."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from e2e.harness.agentproc import AgentProcess
from e2e.harness.plugin import NO_AGENT_SOCKET, Plugin, base_conf, host_local

pytestmark = pytest.mark.root
MAX_BYTES = 2048
BACKUPS = 100  # enough to keep every line of the test


def test_agent_and_in_process_writers_share_one_rotating_log(
        plugin: Plugin, vpc: str, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "vpc-attach.log"
    log.parent.mkdir()
    settings = {"VPC_ATTACH_LOG_FILE": str(log), "VPC_ATTACH_LOG_MAX_BYTES": str(MAX_BYTES),
                "VPC_ATTACH_LOG_BACKUPS": str(BACKUPS)}
    conf = base_conf(vpc, "1", ipam=host_local(tmp_path / "ipam", "fd00:1d::/64"))
    (tmp_path / "agent").mkdir()
    with AgentProcess(tmp_path / "agent", env=settings, metrics=True) as agent:
        # DELs of containers that were never added: each writes exactly one summary line.
        jobs = [(f"via-agent-{n}", str(agent.socket)) for n in range(48)] + \
            [(f"in-process-{n}", NO_AGENT_SOCKET) for n in range(16)]

        def delete(job: tuple[str, str]) -> int:
            container_id, socket = job
            return plugin.call("DEL", conf, container_id=container_id,
                               VPC_ATTACH_AGENT_SOCKET=socket, **settings).status

        with ThreadPoolExecutor(max_workers=8) as pool:
            assert list(pool.map(delete, jobs)) == [0] * len(jobs)
        served = agent.scrape()
    # The agent served exactly the calls sent to it; the others ran in their own processes.
    assert 'vpc_attach_verb_duration_seconds_count{outcome="ok",verb="DEL"} 48.0' in served
    files = sorted(log.parent.glob("vpc-attach.log*"))
    logs = [f for f in files if not f.name.endswith(".lock")]
    assert len(logs) >= 5, f"the test must cross several rotations: {files}"
    assert all(f.stat().st_size <= MAX_BYTES for f in logs)
    lines = []
    for file in logs:
        data = file.read_bytes()
        assert data.endswith(b"\n"), f"{file.name} ends mid-line"
        lines += [json.loads(line) for line in data.splitlines()]  # a split line fails here
    summaries = [line["containerID"] for line in lines if line.get("verb") == "DEL"]
    assert sorted(summaries) == sorted(cid for cid, _ in jobs), "lost or doubled lines"
    assert any(line.get("msg", "").startswith("agent listening") for line in lines), \
        "the agent's own records share the file"
