"""The Go CNI tools build (or come from the cache) and speak CNI 1.1.0."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import uuid

import pytest

from e2e.harness.tools import gotools

REQUIRED = [
    "ptp",
    "host-local",
    "static",
    "tuning",
    "portmap",
    "bandwidth",
    "loopback",
    "bridge",
    "tap",
]


@pytest.fixture(scope="session")
def plugins_dir() -> pathlib.Path:
    return gotools.reference_plugins_dir()


@pytest.fixture(scope="session")
def cnitool() -> pathlib.Path:
    return gotools.cnitool_path()


@pytest.mark.parametrize("name", REQUIRED)
def test_plugin_supports_cni_1_1_0(plugins_dir: pathlib.Path, name: str) -> None:
    binary = plugins_dir / name
    assert os.access(binary, os.X_OK), binary
    proc = subprocess.run(
        [str(binary)],
        input='{"cniVersion":"1.1.0"}',
        capture_output=True,
        text=True,
        timeout=10,
        env={"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"]


def test_cnitool_is_executable(cnitool: pathlib.Path) -> None:
    assert cnitool.is_file() and os.access(cnitool, os.X_OK)
    proc = subprocess.run([str(cnitool), "--help"], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0 and "status" in proc.stdout


def test_build_plugins_builds_no_cnitool(plugins_dir: pathlib.Path) -> None:
    # What the demo's set-up asks for (python -m e2e.harness.tools build --plugins).
    paths = gotools.build_plugins()
    assert paths["plugins_dir"] == str(plugins_dir) and "cnitool" not in paths
    assert gotools.build_all().items() >= paths.items()


def test_second_call_is_cached(plugins_dir: pathlib.Path, cnitool: pathlib.Path) -> None:
    # Fast path must not need go at all.
    env_path = os.environ.get("PATH", "")
    os.environ["PATH"] = "/nonexistent"
    try:
        assert gotools.reference_plugins_dir() == plugins_dir
        assert gotools.cnitool_path() == cnitool
    finally:
        os.environ["PATH"] = env_path


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"),
    reason="needs root, iproute2 and unshare",
)
def test_cnitool_ptp_host_local_roundtrip(
    plugins_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    ns = f"gotools-{uuid.uuid4().hex[:8]}"
    netconf = tmp_path / "net.d"
    netconf.mkdir()
    cache = tmp_path / "cnicache"
    cache.mkdir()
    (netconf / "10-gt.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.1.0",
                "name": "gt",
                "plugins": [
                    {
                        "type": "ptp",
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(tmp_path / "ipam"),
                            "ranges": [[{"subnet": "10.99.0.0/24"}]],
                        },
                    }
                ],
            }
        )
    )
    env = gotools.cnitool_env(plugins_dir, netconf)
    netns = f"/var/run/netns/{ns}"

    def cnitool(verb: str) -> subprocess.CompletedProcess[str]:
        cmd = gotools.cnitool_command(verb, "gt", netns, cache_dir=cache)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
        return proc

    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        result = json.loads(cnitool("add").stdout)
        assert result["cniVersion"] == "1.1.0"
        assert result["ips"][0]["address"].startswith("10.99.0.")
        assert list((cache / "results").iterdir()), "result not cached in the private cache dir"
        cnitool("check")
        cnitool("status")
        cnitool("del")
        assert not list((cache / "results").iterdir())
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=10)
