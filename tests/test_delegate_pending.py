"""delegate.ExecIpam.start_add: an IPAM delegate started before the kernel work and collected later,
with small shell-script plugins (real processes, no root)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.ipam import delegate
from netconf.errors import IO_FAILURE, TRY_AGAIN_LATER, CniError
from netconf.runtime import RuntimeEnv
from tests.polling import poll_until

RESULT = {"cniVersion": "1.1.0", "ips": [{"address": "10.1.2.3/24"}]}


def plugin(directory: Path, name: str, body: str) -> RuntimeEnv:
    """A CNI_PATH holding one executable shell script; the env that finds it."""
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return RuntimeEnv(command="ADD", container_id="c1", netns="/var/run/netns/x",
                      ifname="eth0", cni_path=(str(directory),))


def test_the_delegate_runs_while_the_caller_works(tmp_path: Path) -> None:
    # The plugin reads its stdin, then answers only once the caller (busy with the kernel
    # work) lets it through a FIFO: it ran before result() was asked for.
    go = tmp_path / "go"
    os.mkfifo(go)
    env = plugin(tmp_path, "slow-ipam", f"cat > {tmp_path}/stdin; read _ < {go}; "
                 f"echo '{json.dumps(RESULT)}'")
    pending = delegate.backend("slow-ipam", env).start_add(b'{"name": "n"}', Deadline(30))
    writer: list[int] = []

    def plugin_waits() -> bool:
        # A FIFO opens for writing without blocking only once its reader has it open (ENXIO).
        writer.append(os.open(go, os.O_WRONLY | os.O_NONBLOCK))
        return True

    poll_until("the delegate waiting on the FIFO after its stdin", plugin_waits, 20,
               interval=0.01)
    os.write(writer[0], b"go\n")
    os.close(writer[0])
    result = pending.result()
    assert [str(ip.address) for ip in result.ips] == ["10.1.2.3/24"]
    assert (tmp_path / "stdin").read_bytes() == b'{"name": "n"}'
    assert not pending.failed


def test_stdin_larger_than_a_pipe_is_written_when_collected(tmp_path: Path) -> None:
    env = plugin(tmp_path, "ipam", f"cat > {tmp_path}/stdin; echo '{json.dumps(RESULT)}'")
    big = b"x" * (3 * 65536)  # three times what a pipe holds
    pending = delegate.backend("ipam", env).start_add(big, Deadline(10))
    pending.result()
    assert (tmp_path / "stdin").read_bytes() == big


def test_a_refusal_is_the_delegates_error_and_marks_nothing_allocated(tmp_path: Path) -> None:
    env = plugin(tmp_path, "ipam", "cat >/dev/null; "
                 "echo '{\"cniVersion\": \"1.1.0\", \"code\": 102, \"msg\": \"pool full\"}'; "
                 "exit 1")
    pending = delegate.backend("ipam", env).start_add(b"{}", Deadline(10))
    with pytest.raises(CniError) as caught:
        pending.result()
    assert caught.value.code == 102 and "pool full" in caught.value.msg
    assert pending.failed


def test_settle_ends_a_delegate_that_outlives_the_deadline(tmp_path: Path) -> None:
    env = plugin(tmp_path, "ipam", "exec sleep 30")
    pending = delegate.backend("ipam", env).start_add(b"{}", Deadline(0.3))
    began = time.monotonic()
    with pytest.raises(CniError) as caught:
        pending.result()
    assert caught.value.code == TRY_AGAIN_LATER
    assert time.monotonic() - began < 10  # killed, not waited for
    assert not pending.failed  # unknown: the rollback still releases


def test_a_missing_or_unrunnable_plugin_fails_at_start(tmp_path: Path) -> None:
    env = plugin(tmp_path, "ipam", "true")
    with pytest.raises(CniError) as caught:
        delegate.backend("absent", env).start_add(b"{}", Deadline(10))
    assert "not found in CNI_PATH" in caught.value.msg
    (tmp_path / "broken").write_text("#!/nonexistent/interpreter\n")
    (tmp_path / "broken").chmod(0o755)
    with pytest.raises(CniError) as caught:
        delegate.backend("broken", env).start_add(b"{}", Deadline(10))
    assert caught.value.code == IO_FAILURE


def test_a_delegate_that_never_reads_its_stdin_cannot_hang_the_add(tmp_path: Path) -> None:
    env = plugin(tmp_path, "ipam", "exec sleep 30")  # never reads stdin
    began = time.monotonic()
    pending = delegate.backend("ipam", env).start_add(b"x" * (4 * 65536), Deadline(0.5))
    assert time.monotonic() - began < 2  # starting it did not block on the full pipe
    with pytest.raises(CniError) as caught:
        pending.result()
    assert caught.value.code == TRY_AGAIN_LATER
    assert time.monotonic() - began < 10


def test_settle_lets_a_running_delegate_finish_before_its_release(tmp_path: Path) -> None:
    # A rollback before the result was collected: the ADD must be over before its DEL runs.
    env = plugin(tmp_path, "ipam", f"cat >/dev/null; sleep 0.3; touch {tmp_path}/finished; "
                 f"echo '{json.dumps(RESULT)}'")
    pending = delegate.backend("ipam", env).start_add(b"{}", Deadline(10))
    pending.settle(Deadline(10))
    assert (tmp_path / "finished").exists()
    assert not pending.failed
