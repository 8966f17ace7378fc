"""`vpc-attach install` / `uninstall` against a temporary root (no root privileges needed)."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.install import cli, engine, files, launcher
from cni_plugin.install.credentials import api_server, token_expiry
from cni_plugin.install.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    InstallError,
)
from cni_plugin.install.targets import Root
from cni_plugin.kube.config import load_kubeconfig
from netconf.host import HOST_CONFIG_ENV, resolve_host_settings
from tests.polling import poll_until

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "var/lib/vpc-attach/install-manifest.json"
INSTALLER_ENV = ("NODE_NAME", "VPC_ATTACH_NODE_NAME", "VPC_ATTACH_NAMESPACE",
                 "VPC_ATTACH_LOG_FILE", "VPC_ATTACH_LOG_LEVEL", "VPC_ATTACH_AGENT_SOCKET",
                 "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
CA_PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def jwt(expiry: float, marker: str = "a") -> bytes:
    """A token shaped like a projected ServiceAccount token (signature not checked)."""
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    return f"{part({'alg': 'RS256'})}.{part({'exp': expiry, 'sub': marker})}.sig".encode()


@dataclass
class Host:
    """A temporary host root plus the installer's inputs."""

    root: Path
    sa_dir: Path
    bundle: Path
    plain: Path

    def path(self, host_path: str) -> Path:
        """Where a host path lives below the root."""
        return self.root / host_path.lstrip("/")

    def base_args(self, *extra: str) -> list[str]:
        """install with every path below the temp root and inputs from the temp dirs."""
        return ["install", "--root", str(self.root), "--source", str(self.bundle),
                "--serviceaccount-dir", str(self.sa_dir), *extra]


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    """An empty root, a ServiceAccount dir, a fake standalone bundle and a plain source."""
    for name in INSTALLER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NODE_NAME", "worker-1")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    root = tmp_path / "host"
    root.mkdir()
    sa_dir = tmp_path / "sa"
    sa_dir.mkdir()
    (sa_dir / "token").write_bytes(jwt(time.time() + 3600))
    (sa_dir / "ca.crt").write_bytes(CA_PEM)
    (sa_dir / "namespace").write_text("kube-system")
    bundle = make_bundle(tmp_path / "bundle", b"v1")
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("vpc-attach", "vpc-attach-ipam"):
        (plain / name).write_bytes(b"#!/bin/sh\necho " + name.encode() + b"\n")
        (plain / name).chmod(0o755)
    return Host(root, sa_dir, bundle, plain)


def make_bundle(directory: Path, version: bytes) -> Path:
    """A directory shaped like a standalone build (executable + vpc-attach.lib/)."""
    lib = directory / "vpc-attach.lib"
    (lib / "pkg").mkdir(parents=True)
    (directory / "vpc-attach").write_bytes(b"#!/bin/sh\necho bundle " + version + b" $0\n")
    (directory / "vpc-attach").chmod(0o755)
    (directory / "vpc-attach-ipam").symlink_to("vpc-attach")
    (lib / "libpython.so").write_bytes(b"lib " + version)
    (lib / "pkg" / "module.py").write_bytes(b"x = 1\n")
    (lib / "libalias.so").symlink_to("libpython.so")
    return directory


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the installer's main; (status, stdout, stderr)."""
    status = cli.main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out, captured.err


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every path below root: (inode, mtime_ns, link target or '')."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        found[str(path.relative_to(root))] = (
            info.st_ino, info.st_mtime_ns, os.readlink(path) if path.is_symlink() else "")
    return found


# install ----------------------------------------------------------------------------------

def test_install_stages_bundle_behind_relative_links(host: Host,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(host.base_args(), capsys)
    assert status == EXIT_OK, out
    for name in ("vpc-attach", "vpc-attach-ipam"):
        link = host.path(f"/opt/cni/bin/{name}")
        assert link.is_symlink() and not os.readlink(link).startswith("/")
        assert os.readlink(link).startswith("vpc-attach.bundle/")
        assert link.resolve().read_bytes().startswith(b"#!/bin/sh\necho bundle v1")
    staged = host.path("/opt/cni/bin/vpc-attach").resolve().parent
    assert (staged / "vpc-attach.lib/pkg/module.py").read_bytes() == b"x = 1\n"
    assert os.readlink(staged / "vpc-attach.lib/libalias.so") == "libpython.so"
    assert os.access(staged / "vpc-attach", os.X_OK)
    ran = subprocess.run([str(host.path("/opt/cni/bin/vpc-attach-ipam"))], capture_output=True,
                         check=True)
    assert ran.stdout.strip().endswith(b"vpc-attach-ipam")  # the name it runs as survives


def test_bundle_with_an_interpreter_gets_a_launcher_and_upgrades_switch_it(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(host.base_args(), capsys)  # an older build without an interpreter: links
    assert host.path("/opt/cni/bin/vpc-attach").is_symlink()
    newer = make_bundle(tmp_path / "newer", b"v2")
    (newer / "vpc-attach.lib/bin").mkdir()
    (newer / "vpc-attach.lib/bin/python3").write_bytes(b"\x7fELF interpreter")
    (newer / "vpc-attach.lib/bin/python3").chmod(0o755)
    status, out, err = run(["install", "--root", str(host.root), "--source", str(newer),
                            "--serviceaccount-dir", str(host.sa_dir)], capsys)
    assert status == EXIT_OK, err
    staged = host.path("/opt/cni/bin/vpc-attach")
    assert not staged.is_symlink() and staged.stat().st_mode & 0o777 == 0o755
    bundles = sorted(p.name for p in host.path("/opt/cni/bin/vpc-attach.bundle").iterdir())
    (digest,) = [b for b in bundles
                 if host.path(f"/opt/cni/bin/vpc-attach.bundle/{b}/vpc-attach.lib/bin").exists()]
    bundle = f"/opt/cni/bin/vpc-attach.bundle/{digest}"  # host paths: the #! line runs there
    assert staged.read_text().splitlines() == [
        f"#!{bundle}/vpc-attach.lib/bin/python3 -IS",
        "# vpc-attach: written by `vpc-attach install` (cni_plugin/install/launcher.py).",
        "from cni_plugin.cli import main",
        f"main(full='{bundle}/vpc-attach')"]
    assert os.readlink(host.path("/opt/cni/bin/vpc-attach-ipam")) == \
        f"vpc-attach.bundle/{digest}/vpc-attach"
    assert "updated /opt/cni/bin/vpc-attach\n" in out
    status, _, err = run(["uninstall", "--root", str(host.root)], capsys)
    assert status == EXIT_OK, err
    assert not host.path("/opt/cni/bin").exists() or \
        list(host.path("/opt/cni/bin").iterdir()) == []


def test_install_writes_host_settings_the_plugin_reads(host: Host,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = run(host.base_args("--log-level", "debug", "--namespace", "bgp"), capsys)
    assert status == EXIT_OK
    host_file = host.path("/etc/vpc-attach/host.json")
    assert json.loads(host_file.read_text()) == {
        "formatVersion": 1, "nodeName": "worker-1", "kubeconfig": "/etc/vpc-attach/kubeconfig",
        "logFile": "/var/log/vpc-attach/vpc-attach.log", "logLevel": "debug",
        "agentSocket": "/run/vpc-attach/agent.sock", "namespace": "bgp"}
    settings = resolve_host_settings({}, {HOST_CONFIG_ENV: str(host_file)})
    assert (settings.node_name, settings.kubeconfig, settings.namespace, settings.log_level) == \
        ("worker-1", "/etc/vpc-attach/kubeconfig", "bgp", "debug")


def test_settings_come_from_flags_then_environment(host: Host, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VPC_ATTACH_LOG_LEVEL", "warning")
    monkeypatch.setenv("VPC_ATTACH_AGENT_SOCKET", "/run/env.sock")
    status, _, _ = run(host.base_args("--agent-socket", "/run/flag.sock"), capsys)
    assert status == EXIT_OK
    written = json.loads(host.path("/etc/vpc-attach/host.json").read_text())
    assert (written["logLevel"], written["agentSocket"]) == ("warning", "/run/flag.sock")


def test_log_rotation_settings_reach_the_host_file_only_when_set(
        host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VPC_ATTACH_LOG_BACKUPS", "0")
    status, _, _ = run(host.base_args("--log-max-bytes", "1048576"), capsys)
    assert status == EXIT_OK
    host_file = host.path("/etc/vpc-attach/host.json")
    written = json.loads(host_file.read_text())
    assert (written["logMaxBytes"], written["logBackups"]) == (1048576, 0)
    settings = resolve_host_settings({}, {HOST_CONFIG_ENV: str(host_file)})
    assert (settings.log_max_bytes, settings.log_backups) == (1048576, 0)
    monkeypatch.delenv("VPC_ATTACH_LOG_BACKUPS")
    status, _, err = run(host.base_args("--log-backups", "lots", "--force"), capsys)
    assert status != EXIT_OK and "--log-backups 'lots' is not a whole number" in err


def test_the_tenancy_mode_reaches_the_host_file_only_when_set(
        host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = run(host.base_args(), capsys)
    assert status == EXIT_OK
    host_file = host.path("/etc/vpc-attach/host.json")
    assert "tenancy" not in json.loads(host_file.read_text())
    assert resolve_host_settings({}, {HOST_CONFIG_ENV: str(host_file)}).tenancy_mode == "enforce"
    monkeypatch.setenv("VPC_ATTACH_TENANCY", "audit")
    status, _, _ = run(host.base_args("--force"), capsys)
    assert status == EXIT_OK and json.loads(host_file.read_text())["tenancy"] == "audit"
    status, _, err = run(host.base_args("--tenancy", "lenient", "--force"), capsys)
    assert status != EXIT_OK and "invalid tenancy 'lenient'" in err


def test_kubeconfig_references_the_refreshed_token_file(host: Host,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = run(host.base_args(), capsys)
    assert status == EXIT_OK
    kubeconfig = host.path("/etc/vpc-attach/kubeconfig")
    credentials = load_kubeconfig(str(kubeconfig))  # the plugin's own loader
    assert credentials.server == "https://10.96.0.1:443"
    assert credentials.ca_pem == CA_PEM.decode()
    assert credentials.token is None and credentials.token_file == "/etc/vpc-attach/token"
    token_copy = host.path("/etc/vpc-attach/token")
    assert token_copy.read_bytes().strip() == (host.sa_dir / "token").read_bytes()
    assert token_copy.stat().st_mode & 0o777 == 0o600
    assert kubeconfig.stat().st_mode & 0o777 == 0o600
    assert b"token:" not in kubeconfig.read_bytes()  # never the credential itself


def test_second_run_changes_nothing_and_says_so(host: Host,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    conflist = host.root.parent / "10-vpc.conflist"
    conflist.write_text(json.dumps({"cniVersion": "1.1.0", "name": "vpc",
                                    "plugins": [{"type": "vpc-attach"}]}))
    args = host.base_args("--conflist", str(conflist))
    assert run(args, capsys)[0] == EXIT_OK
    before = snapshot(host.root)
    status, out, _ = run(args, capsys)
    assert status == EXIT_OK
    assert "nothing to change" in out and "created" not in out and "updated" not in out
    assert snapshot(host.root) == before


def test_plain_source_copies_both_executables(host: Host,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = run(host.base_args("--source", str(host.plain), "--no-kubeconfig"), capsys)
    assert status == EXIT_OK
    for name in ("vpc-attach", "vpc-attach-ipam"):
        staged = host.path(f"/opt/cni/bin/{name}")
        assert not staged.is_symlink() and os.access(staged, os.X_OK)
        assert staged.read_bytes() == (host.plain / name).read_bytes()


def test_every_host_path_can_be_moved(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    conflist = host.root.parent / "vpc.conflist"
    conflist.write_text(json.dumps({"name": "vpc", "plugins": [{"type": "vpc-attach"}]}))
    status, _, _ = run(host.base_args(
        "--cni-bin-dir", "/bin2", "--cni-conf-dir", "/conf2", "--host-config", "/cfg/h.json",
        "--kubeconfig", "/cfg/kc", "--token-file", "/cfg/tok", "--manifest", "/state/m.json",
        "--conflist", str(conflist), "--conflist-name", "05-vpc.conflist"), capsys)
    assert status == EXIT_OK
    assert sorted(p.name for p in host.root.iterdir()) == ["bin2", "cfg", "conf2", "state"]
    assert (host.root / "conf2/05-vpc.conflist").read_bytes() == conflist.read_bytes()
    assert json.loads((host.root / "cfg/h.json").read_text())["kubeconfig"] == "/cfg/kc"
    assert load_kubeconfig(str(host.root / "cfg/kc")).token_file == "/cfg/tok"


# ownership --------------------------------------------------------------------------------

def test_refuses_file_it_did_not_write_and_writes_nothing(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    foreign = host.path("/opt/cni/bin/vpc-attach")
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"someone else's plugin")
    before = snapshot(host.root)
    status, _, err = run(host.base_args(), capsys)
    assert status == EXIT_REFUSED
    assert "/opt/cni/bin/vpc-attach exists and was not written by vpc-attach install" in err
    assert "--force" in err
    assert snapshot(host.root) == before  # no manifest, no settings, no bundle


def test_refuses_file_modified_since_install_unless_forced(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(host.base_args(), capsys)[0] == EXIT_OK
    host_file = host.path("/etc/vpc-attach/host.json")
    original = host_file.read_bytes()
    host_file.write_text('{"nodeName": "edited"}')
    status, _, err = run(host.base_args(), capsys)
    assert status == EXIT_REFUSED
    assert "/etc/vpc-attach/host.json was modified after vpc-attach install wrote it" in err
    assert host_file.read_text() == '{"nodeName": "edited"}'
    status, out, _ = run(host.base_args("--force"), capsys)
    assert status == EXIT_OK and "updated /etc/vpc-attach/host.json" in out
    assert host_file.read_bytes() == original


def test_forced_overwrite_makes_the_file_ours(host: Host,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    foreign = host.path("/etc/vpc-attach/host.json")
    foreign.parent.mkdir(parents=True)
    foreign.write_text("{}")
    assert run(host.base_args("--force"), capsys)[0] == EXIT_OK
    assert run(["uninstall", "--root", str(host.root)], capsys)[0] == EXIT_OK
    assert not foreign.exists()


def test_tampered_bundle_is_refused(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(host.base_args(), capsys)[0] == EXIT_OK
    staged = host.path("/opt/cni/bin/vpc-attach").resolve().parent
    (staged / "vpc-attach.lib/pkg/module.py").write_bytes(b"x = 2\n")
    status, _, err = run(host.base_args(), capsys)
    assert status == EXIT_REFUSED and "(bundle) does not match" in err
    assert run(host.base_args("--force"), capsys)[0] == EXIT_OK
    assert (staged / "vpc-attach.lib/pkg/module.py").read_bytes() == b"x = 1\n"


def test_identical_file_not_in_manifest_is_still_refused(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(host.base_args(), capsys)[0] == EXIT_OK
    (host.root / MANIFEST).unlink()
    status, _, err = run(host.base_args(), capsys)
    assert status == EXIT_REFUSED and "not written by vpc-attach install" in err


# upgrades and interruptions ---------------------------------------------------------------

def test_upgrade_switches_links_and_keeps_one_previous_bundle(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    staged_dirs = []
    for version in (b"v1", b"v2", b"v3"):
        source = make_bundle(tmp_path / f"bundle-{version.decode()}", version)
        status, _, _ = run(host.base_args("--source", str(source)), capsys)
        assert status == EXIT_OK
        staged_dirs.append(host.path("/opt/cni/bin/vpc-attach").resolve().parent)
        assert host.path("/opt/cni/bin/vpc-attach").read_bytes().startswith(
            b"#!/bin/sh\necho bundle " + version)
    first, second, third = staged_dirs
    assert not first.exists()  # retired
    assert second.exists() and third.exists()  # calls that started before the switch finish
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([second.name, third.name])


def test_interrupted_write_is_still_recognised_as_ours(
        host: Host, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run(host.base_args(), capsys)[0] == EXIT_OK
    real_write = files.write_atomic

    def write_then_die(path: Path, content: bytes | Path, mode: int) -> None:
        real_write(path, content, mode)
        raise OSError("killed")

    monkeypatch.setattr(engine, "write_atomic", write_then_die)
    status, _, err = run(host.base_args("--log-level", "error"), capsys)
    assert status == EXIT_FAILED and "cannot write /etc/vpc-attach/host.json: killed" in err
    monkeypatch.setattr(engine, "write_atomic", real_write)
    status, out, _ = run(host.base_args("--log-level", "error"), capsys)
    assert status == EXIT_OK and "nothing to change" in out
    status, out, _ = run(host.base_args(), capsys)  # and back: the old content is ours too
    assert status == EXIT_OK and "updated /etc/vpc-attach/host.json" in out


def test_held_lock_is_a_clear_error(host: Host, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl
    monkeypatch.setattr(engine, "LOCK_TIMEOUT_SECONDS", 0.2)
    lock_dir = host.root / MANIFEST
    lock_dir.parent.mkdir(parents=True)
    fd = os.open(lock_dir.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # flock locks are per open file description: a second open in this process conflicts
        status, _, err = run(host.base_args(), capsys)
    finally:
        os.close(fd)
    assert status == EXIT_FAILED and "another vpc-attach install holds the lock" in err


# uninstall --------------------------------------------------------------------------------

def test_uninstall_removes_only_unmodified_files_it_wrote(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    (host.root / "etc").mkdir()
    (host.root / "etc/keep-me").write_text("not ours")
    assert run(host.base_args(), capsys)[0] == EXIT_OK
    host.path("/etc/vpc-attach/host.json").write_text('{"edited": true}')
    host.path("/etc/vpc-attach/extra").write_text("added by an admin")
    status, out, err = run(["uninstall", "--root", str(host.root)], capsys)
    assert status == EXIT_OK
    assert "kept /etc/vpc-attach/host.json: modified after vpc-attach install wrote it" in err
    assert "removed /opt/cni/bin/vpc-attach.bundle/" in out and "(4 files)" in out
    remaining = sorted(str(p.relative_to(host.root)) for p in host.root.rglob("*"))
    assert remaining == ["etc", "etc/keep-me", "etc/vpc-attach", "etc/vpc-attach/extra",
                         "etc/vpc-attach/host.json"]


def test_uninstall_after_uninstall_has_nothing_to_do(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(host.base_args(), capsys)[0] == EXIT_OK
    assert run(["uninstall", "--root", str(host.root)], capsys)[0] == EXIT_OK
    assert list(host.root.iterdir()) == []
    status, out, _ = run(["uninstall", "--root", str(host.root)], capsys)
    assert status == EXIT_OK and "nothing to remove" in out


# clear errors -----------------------------------------------------------------------------

def test_missing_serviceaccount_token_names_the_file(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    (host.sa_dir / "token").unlink()
    status, _, err = run(host.base_args(), capsys)
    assert status == EXIT_FAILED
    assert f"ServiceAccount token {host.sa_dir / 'token'} not found" in err
    assert "--no-kubeconfig" in err
    assert list(host.root.iterdir()) == []


def test_missing_node_name_is_a_clear_error(host: Host, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME")
    status, _, err = run(host.base_args(), capsys)
    assert status == EXIT_FAILED and "node name unknown" in err and "spec.nodeName" in err


def test_without_a_source_stages_launchers_for_this_environment(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["install", "--root", str(host.root), "--no-kubeconfig"], capsys)
    assert status == EXIT_OK and "/opt/cni/bin/vpc-attach" in out, err
    for name, module in (("vpc-attach", "cni_plugin.cli"),
                         ("vpc-attach-ipam", "cni_plugin.ipam_cli")):
        staged = host.path(f"/opt/cni/bin/{name}")
        assert staged.stat().st_mode & 0o777 == 0o755
        lines = staged.read_text().splitlines()
        assert lines[0] == f"#!{sys.executable} -IS" and f"from {module} import main" in lines
        # Runs from anywhere and ignores PYTHONPATH (-I); the kernel passes -IS from the #! line.
        proc = subprocess.run([str(staged)], input=b"", capture_output=True, timeout=60,
                              check=False, cwd="/", env={"CNI_COMMAND": "VERSION",
                                                         "PYTHONPATH": "/nonexistent"})
        assert proc.returncode == 0, proc.stderr
        assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"]
    probe = subprocess.run([str(host.path("/opt/cni/bin/vpc-attach"))], capture_output=True,
                           timeout=60, check=False, env={"CNI_COMMAND": "NOPE"})
    assert b"NOPE" in probe.stdout  # the plugin itself answered: a CNI error naming the verb
    status, _, err = run(["uninstall", "--root", str(host.root)], capsys)
    assert status == EXIT_OK, err
    assert not host.path("/opt/cni/bin/vpc-attach").exists()


def test_launcher_refuses_an_interpreter_no_shebang_can_name() -> None:
    with pytest.raises(InstallError, match="cannot be a #! line"):
        launcher.launcher("vpc-attach", "/" + "x" * 300, ["/lib"])
    with pytest.raises(InstallError, match="cannot be a #! line"):
        launcher.launcher("vpc-attach", "/opt/my python/bin/python3", ["/lib"])


def test_a_plain_source_needs_both_executables(host: Host,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["install", "--root", str(host.root), "--no-kubeconfig",
                          "--source", str(host.sa_dir)], capsys)
    assert status == EXIT_FAILED and f"no executable vpc-attach in {host.sa_dir}" in err


@pytest.mark.parametrize(("name", "content", "message"), [
    ("10-vpc.conflist", "{not json", "is not JSON"),
    ("10-vpc.conflist", '{"plugins": []}', 'has no "name"'),
    ("10-vpc.conflist", '{"name": "vpc", "plugins": []}', "neither a non-empty"),
    ("10-vpc.yaml", '{"name": "vpc", "type": "vpc-attach"}', "must be a file name ending"),
])
def test_bad_conflist_is_rejected_before_anything_is_written(
        host: Host, name: str, content: str, message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    conflist = host.root.parent / name
    conflist.write_text(content)
    status, _, err = run(host.base_args("--conflist", str(conflist)), capsys)
    assert status == EXIT_FAILED and message in err
    assert list(host.root.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["install", "--bogus"],
    ["install", "--cni-bin-dir", "relative/bin"],
    ["install", "--cni-bin-dir", "/opt/../etc"],
    ["install", "--refresh-interval", "0"],
    ["reinstall"],
    [],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(argv, capsys)[0] == EXIT_USAGE


def test_invalid_log_level_is_rejected(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(host.base_args("--log-level", "loud"), capsys)
    assert status == EXIT_FAILED and "invalid log level 'loud'" in err


def test_api_server_comes_from_the_service_environment() -> None:
    assert api_server(None, {"KUBERNETES_SERVICE_HOST": "fd00::1",
                             "KUBERNETES_SERVICE_PORT": "6443"}) == "https://[fd00::1]:6443"
    assert api_server("https://api.example:6443/", {}) == "https://api.example:6443"


# token refresh ----------------------------------------------------------------------------

class Reported(io.StringIO):
    """A stream the watcher writes to; `seen` is set by the first write holding `expected`."""

    def __init__(self, expected: str) -> None:
        super().__init__()
        self.expected = expected
        self.seen = threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.expected in text:
            self.seen.set()
        return written


def watch_in_thread(host: Host, err: TextIO | None = None
                    ) -> tuple[threading.Thread, threading.Event, list[int]]:
    """`install --watch` on the host, refreshing every 50 ms, in a thread; its errors go to
    `err` (to /dev/null without one)."""
    args = cli._parser("install").parse_args(
        host.base_args("--watch", "--refresh-interval", "0.05")[1:])
    stop = threading.Event()
    status: list[int] = []
    devnull = open(os.devnull, "w")  # noqa: SIM115 (closed with the thread's end)

    def body() -> None:
        with devnull:
            status.append(cli.install(args, dict(os.environ), devnull, err or devnull, stop))

    thread = threading.Thread(target=body)
    thread.start()
    return thread, stop, status


def wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Until condition holds (a file being replaced may be missing for a moment)."""
    poll_until("the watcher's copy", condition, seconds)


def test_watch_copies_the_rotated_token(host: Host) -> None:
    thread, stop, status = watch_in_thread(host)
    token_copy = host.path("/etc/vpc-attach/token")
    try:
        wait_for(token_copy.exists)
        rotated = jwt(time.time() + 7200, marker="rotated")
        (host.sa_dir / "token").write_bytes(rotated)
        wait_for(lambda: token_copy.read_bytes().strip() == rotated)
        manifest = json.loads((host.root / MANIFEST).read_text())
        assert manifest["files"]["/etc/vpc-attach/token"]["fingerprint"].startswith("sha256:")
    finally:
        stop.set()
        thread.join(10)
    assert status == [EXIT_OK]
    # the refreshed copy is the installer's own: a plain run afterwards changes nothing
    assert cli.main(host.base_args()) == EXIT_OK


def test_watch_survives_a_missing_token_and_recovers(host: Host) -> None:
    token = host.sa_dir / "token"
    err = Reported(f"refreshing credentials: ServiceAccount token {token} not found")
    thread, stop, status = watch_in_thread(host, err)
    token_copy = host.path("/etc/vpc-attach/token")
    try:
        wait_for(token_copy.exists)
        token.unlink()  # the kubelet swaps projected volumes by symlink: a gap is possible
        assert err.seen.wait(10), f"the watcher never reported the missing token: {err.getvalue()}"
        assert thread.is_alive(), "the watcher ended on a missing token"
        rotated = jwt(time.time() + 7200, marker="after-gap")
        token.write_bytes(rotated)
        wait_for(lambda: token_copy.read_bytes().strip() == rotated)
    finally:
        stop.set()
        thread.join(10)
    assert status == [EXIT_OK]


def test_watch_process_stops_cleanly_on_sigterm(host: Host) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cni_plugin.cli", *host.base_args(
            "--watch", "--refresh-interval", "0.05")],
        cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        token_copy = host.path("/etc/vpc-attach/token")
        wait_for(token_copy.exists, 30)
        rotated = jwt(time.time() + 7200, marker="subprocess")
        (host.sa_dir / "token").write_bytes(rotated)
        wait_for(lambda: token_copy.read_bytes().strip() == rotated)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_OK, err
    assert b"refreshed /etc/vpc-attach/token" in out and b"stopped watching" in out
    assert rotated not in out + err  # never the credential


def test_token_expiry_reads_the_jwt_exp_claim() -> None:
    assert token_expiry(jwt(1_900_000_000)) == 1_900_000_000
    assert token_expiry(b"opaque-legacy-token") is None


@given(st.binary(max_size=200))
def test_token_expiry_never_raises_on_arbitrary_bytes(token: bytes) -> None:
    result = token_expiry(token)
    assert result is None or isinstance(result, float)


@given(st.lists(st.sampled_from(["opt", "cni", "bin", "etc", "a b", "x.y"]), max_size=5))
def test_root_maps_host_paths_both_ways(parts: list[str]) -> None:
    root = Root(Path("/host"))
    host_path = "/" + "/".join(parts)
    assert root.host(root.local(host_path)) == os.path.normpath(host_path)


def test_an_environment_that_does_not_import_vpc_attach_from_a_path_is_refused(
        tmp_path: Path) -> None:
    # An empty venv stands in for one whose editable install is an import hook: -I -S with
    # the baked path cannot import the entry points there, so no launcher is written.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")],
                   check=True, timeout=120)
    with pytest.raises(InstallError, match="does not import vpc-attach from a path") as caught:
        launcher.environment_launchers(str(tmp_path / "env/bin/python"))
    assert "editable_mode=compat" in (caught.value.hint or "")


def test_watch_without_credentials_is_refused_before_anything_is_written(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run([*host.base_args(), "--no-kubeconfig", "--watch"], capsys)
    assert status == EXIT_FAILED and "--watch refreshes the kubeconfig's token" in err
    assert list(host.root.iterdir()) == []
