"""The operator log's size rotation (`logMaxBytes`, `logBackups`): writers in several processes
and threads at once lose, split and mix no line, however often the file rotates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cni_plugin.core.logfile import LogFile, log_file
from cni_plugin.core.oplog import LogSettings, settings
from cni_plugin.core.request import Request

WRITER = """
import json, sys, threading
from cni_plugin.core.logfile import log_file
path, name, lines, threads, max_bytes, backups = sys.argv[1:]
file = log_file(path, int(max_bytes), int(backups))
def write(thread):
    for seq in range(int(lines)):
        pad = "x" * ((seq * 37 + thread * 11) % 300)  # lines of many lengths
        file.write(json.dumps({"writer": f"{name}/{thread}", "seq": seq, "pad": pad}).encode())
workers = [threading.Thread(target=write, args=(t,)) for t in range(int(threads))]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
"""


def _all_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + "*"), key=lambda p: p.name)


def _lines(path: Path) -> list[dict[str, object]]:
    found = []
    for file in _all_files(path):
        if file.name.endswith(".lock"):
            continue
        data = file.read_bytes()
        assert data.endswith(b"\n"), f"{file.name} ends mid-line"
        found += [json.loads(line) for line in data.splitlines()]  # a split line fails here
    return found


def test_processes_and_threads_writing_at_once_lose_no_line_across_rotations(
        tmp_path: Path) -> None:
    log = tmp_path / "vpc-attach.log"
    max_bytes, backups, processes, threads, lines = 4096, 200, 4, 3, 150
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(log), f"p{n}", str(lines),
                                 str(threads), str(max_bytes), str(backups)])
               for n in range(processes)]
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    written = _lines(log)
    keys = [(line["writer"], line["seq"]) for line in written]
    expected = {(f"p{n}/{t}", seq) for n in range(processes) for t in range(threads)
                for seq in range(lines)}
    assert len(keys) == len(expected) and set(keys) == expected, "a line was lost or doubled"
    rotated = [f for f in _all_files(log) if f.name[len(log.name):].lstrip(".").isdigit()]
    assert len(rotated) > 10, "the test must cross many rotations"
    assert all(f.stat().st_size <= max_bytes for f in _all_files(log)
               if not f.name.endswith(".lock"))
    # Each writer's lines keep their order from the oldest file to the newest.
    files = [log.with_name(f"{log.name}.{n}") for n in range(len(rotated), 0, -1)] + [log]
    ordered = [json.loads(line) for f in files for line in f.read_bytes().splitlines()]
    for writer in {line["writer"] for line in ordered}:
        seqs = [line["seq"] for line in ordered if line["writer"] == writer]
        assert seqs == sorted(seqs), writer


def test_only_the_configured_number_of_backups_is_kept(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    file = LogFile(str(log), max_bytes=100, backups=2)
    for seq in range(30):
        file.write(json.dumps({"seq": seq, "pad": "y" * 40}).encode())
    names = sorted(f.name for f in _all_files(log) if not f.name.endswith(".lock"))
    assert names == ["x.log", "x.log.1", "x.log.2"]
    newest = [json.loads(line)["seq"] for name in ("x.log.2", "x.log.1", "x.log")
              for line in (tmp_path / name).read_bytes().splitlines()]
    assert newest == list(range(30 - len(newest), 30)), "the oldest lines were dropped"


def test_without_backups_a_full_file_starts_over(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    file = LogFile(str(log), max_bytes=100, backups=0)
    for seq in range(10):
        file.write(f'{{"seq": {seq}, "pad": "{"z" * 30}"}}'.encode())
    assert [f.name for f in _all_files(log) if not f.name.endswith(".lock")] == ["x.log"]
    assert log.stat().st_size <= 100


def test_zero_max_bytes_never_rotates_and_a_line_longer_than_the_limit_is_kept_whole(
        tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    LogFile(str(log), max_bytes=0, backups=3).write(b"a" * 5000)
    big = LogFile(str(tmp_path / "y.log"), max_bytes=100, backups=3)
    big.write(b"b" * 500)
    big.write(b"c" * 10)
    assert log.read_bytes() == b"a" * 5000 + b"\n"
    assert (tmp_path / "y.log.1").read_bytes() == b"b" * 500 + b"\n"
    assert (tmp_path / "y.log").read_bytes() == b"c" * 10 + b"\n"


def test_a_file_rotated_by_another_writer_is_reopened(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    first = LogFile(str(log), max_bytes=0, backups=3)
    first.write(b"one")
    os.replace(log, tmp_path / "x.log.1")  # what another process's rotation does
    first.write(b"two")
    assert log.read_bytes() == b"two\n"
    assert (tmp_path / "x.log.1").read_bytes() == b"one\n"


def test_an_unwritable_log_never_raises(tmp_path: Path) -> None:
    LogFile(str(tmp_path / "missing-dir" / "x.log"), 100, 1).write(b"lost quietly")


def test_one_writer_per_path_per_process_with_the_latest_limits(tmp_path: Path) -> None:
    path = str(tmp_path / "x.log")
    first = log_file(path, 100, 1)
    assert log_file(path, 200, 5) is first and (first.max_bytes, first.backups) == (200, 5)


@pytest.mark.parametrize(("environ", "stanza", "host", "expected"), [
    ({}, {}, {}, (10 * 1024 * 1024, 3)),
    ({"VPC_ATTACH_LOG_MAX_BYTES": "2048", "VPC_ATTACH_LOG_BACKUPS": "7"}, {}, {}, (2048, 7)),
    ({"VPC_ATTACH_LOG_MAX_BYTES": "2048"}, {"logMaxBytes": 512}, {}, (2048, 3)),  # refused
    ({"VPC_ATTACH_LOG_MAX_BYTES": "2048", "VPC_ATTACH_STANZA_HOST_SETTINGS": "allow"},
     {"logMaxBytes": 512}, {}, (512, 3)),
    ({"VPC_ATTACH_LOG_MAX_BYTES": "2048"}, {"logMaxBytes": 512},
     {"stanzaHostSettings": "allow"}, (512, 3)),
    ({"VPC_ATTACH_STANZA_HOST_SETTINGS": "yes"}, {"logMaxBytes": 512}, {}, (10 * 1024**2, 3)),
    ({}, {}, {"logMaxBytes": 4096, "logBackups": 0}, (4096, 0)),
    ({"VPC_ATTACH_LOG_BACKUPS": "many"}, {}, {"logBackups": 2}, (10 * 1024 * 1024, 3)),
])
def test_log_settings_follow_the_host_settings_precedence(
        tmp_path: Path, environ: dict[str, str], stanza: dict[str, object],
        host: dict[str, object], expected: tuple[int, int]) -> None:
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps({"logFile": str(tmp_path / "x.log"), **host}))
    request = Request({**environ, "VPC_ATTACH_HOST_CONFIG": str(host_file)},
                      json.dumps(stanza).encode())
    chosen = settings(request)
    assert chosen == LogSettings(str(tmp_path / "x.log"), "info", *expected)
