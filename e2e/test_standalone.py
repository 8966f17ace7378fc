"""The standalone executable (packaging/standalone) on real namespaces, as a host without Python
would run it: VERSION, ADD/CHECK/DEL with IPAM delegated to host-local and to the bundled
vpc-attach-ipam, no file in /tmp or $TMPDIR per call, and staged by its own installer.

The build is cached by packaging/standalone/build.sh (keyed by a hash of the sources); a cold
build takes about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.agent.protocol import MAGIC, REFUSAL, recv_exact
from cni_plugin.core import naming
from e2e.harness import cnibin
from e2e.harness.agentproc import AgentProcess
from e2e.harness.doctor import doctor_report
from e2e.harness.kernel import links_in
from e2e.harness.plugin import (
    Answer,
    Plugin,
    base_conf,
    host_local,
    host_local_reservations,
    with_prev,
)
from e2e.harness.standalone import WATCH_TMP, outside_tmp, stage_standalone
from e2e.harness.victims import planted_victims

pytestmark = pytest.mark.root


@pytest.fixture
def work() -> Iterator[Path]:
    """This test's directory outside /tmp, removed afterwards."""
    path = outside_tmp("test")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class WatchedPlugin(Plugin):
    """A Plugin whose every call must leave /tmp and $TMPDIR empty."""

    def __init__(self, cni_bin: Path, work: Path) -> None:
        self.tmp_view = work / "tmp-view"
        self.tmpdir = work / "tmpdir"
        for directory in (self.tmp_view, self.tmpdir, work / "locks"):
            directory.mkdir()
        super().__init__(cni_bin=cni_bin, lock_dir=work / "locks",
                         environ={"TMPDIR": str(self.tmpdir),
                                  "VPC_ATTACH_AGENT_SOCKET": str(work / "no-agent.sock"),
                                  "VPC_ATTACH_IPAM_DATA_ROOT": str(work)},
                         prefix=[*WATCH_TMP, str(self.tmp_view)])

    def call(self, command: str, conf: dict[str, Any], **kw: Any) -> Answer:
        """Run the verb, then check it left nothing behind in either temp dir."""
        answer = super().call(command, conf, **kw)
        leaked = [str(p) for d in (self.tmp_view, self.tmpdir) for p in d.iterdir()]
        assert leaked == [], f"{command} left files in the temp dirs: {leaked}"
        return answer


@pytest.fixture
def standalone_plugin(standalone: Path, reference_plugins: Path, work: Path) -> WatchedPlugin:
    """The standalone executables, run the way a runtime runs them."""
    cni_bin = cnibin.populate(work / "cni-bin", reference_plugins, ours=standalone)
    return WatchedPlugin(cni_bin, work)


def add_check_del(plugin: Plugin, conf: dict[str, Any], netns: str, vpc: str,
                  att: str, **env: str) -> dict[str, Any]:
    """A full life cycle; returns the ADD result."""
    result: dict[str, Any] = plugin.ok("ADD", conf, container_id="standalone-pod",
                                          netns=netns, **env)
    assert naming.host_link_name(vpc, att) in links_in()
    assert "eth0" in links_in(netns)
    checked = with_prev(conf, result)
    plugin.ok("CHECK", checked, container_id="standalone-pod", netns=netns, **env)
    plugin.ok("DEL", checked, container_id="standalone-pod", netns=netns, **env)
    assert naming.host_link_name(vpc, att) not in links_in()
    plugin.ok("DEL", checked, container_id="standalone-pod", netns=netns, **env)  # idempotent
    return result


def test_standalone_version_needs_no_python(standalone: Path,
                                            standalone_plugin: WatchedPlugin) -> None:
    for name in ("vpc-attach", "vpc-attach-ipam"):
        answer = standalone_plugin.call("VERSION", {}, executable=name)
        assert answer.status == 0, answer.stderr
        assert answer.body["cniVersion"] == "1.1.0"
        assert "0.3.0" in answer.body["supportedVersions"]
    # The bundle carries its own interpreter: nothing on the host's Python is used.
    env = {"PATH": "/nonexistent", "CNI_COMMAND": "VERSION"}
    proc = subprocess.run([str(standalone / "vpc-attach")], env=env, capture_output=True,
                          timeout=30, check=True)
    assert json.loads(proc.stdout)["cniVersion"] == "1.1.0"
    assert (standalone / "vpc-attach.lib").is_dir()


def test_standalone_error_is_one_json_document(standalone_plugin: WatchedPlugin, vpc: str) -> None:
    answer = standalone_plugin.call("ADD", base_conf(vpc, "1", bogus=True), netns="/nonexistent")
    assert answer.status != 0 and answer.code == 7 and "bogus" in answer.body["msg"]
    assert "Traceback" not in answer.stderr


def test_standalone_add_check_del_with_host_local(standalone_plugin: WatchedPlugin, netns: str,
                                                  vpc: str, work: Path) -> None:
    ipam_dir = work / "ipam"
    conf = base_conf(vpc, "5", ipam=host_local(ipam_dir, "fd00:55::/64", "10.55.0.0/24"))
    result = add_check_del(standalone_plugin, conf, netns, vpc, "5")
    assert sorted(ip["address"] for ip in result["ips"]) == ["10.55.0.2/32", "fd00:55::2/64"]
    assert host_local_reservations(ipam_dir, f"net-{vpc}") == []


def test_standalone_delegates_to_the_bundled_ipam(standalone_plugin: WatchedPlugin, netns: str,
                                                  vpc: str, work: Path) -> None:
    data = work / "pool"
    conf = base_conf(vpc, "6", ipam={"type": "vpc-attach-ipam", "dataDir": str(data),
                                     "ipv6_subnet": "fd00:56:ff01::/48",
                                     "ipv4_subnet": "172.30.56.0/24"})
    result = add_check_del(standalone_plugin, conf, netns, vpc, "6")
    assert any(ip["address"].endswith("/96") for ip in result["ips"])
    assert not [p for p in data.rglob("*") if p.is_file() and "standalone-pod" in p.read_text()]


def test_installer_stages_the_standalone_build_under_a_root(standalone: Path,
                                                            work: Path) -> None:
    # As the DaemonSet's init container does it: the host's / mounted at --root.
    root = work / "host"
    root.mkdir()
    install = [str(standalone / "vpc-attach"), "install", "--root", str(root),
               "--no-kubeconfig"]
    first = subprocess.run(install, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 0, first.stderr
    assert "created /opt/cni/bin/vpc-attach.bundle/" in first.stdout
    again = subprocess.run(install, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0 and "nothing to change" in again.stdout

    staged_bin = root / "opt/cni/bin"
    (bundle,) = (staged_bin / "vpc-attach.bundle").iterdir()
    host_bundle = f"/opt/cni/bin/vpc-attach.bundle/{bundle.name}"
    # vpc-attach runs the bundle's interpreter, named by its path on the host, not below root.
    lines = (staged_bin / "vpc-attach").read_text().splitlines()
    assert lines[0] == f"#!{host_bundle}/vpc-attach.lib/bin/python3 -IS"
    assert f"main(full='{host_bundle}/vpc-attach')" in lines
    assert (bundle / "vpc-attach.lib/bin/python3").is_file()
    assert (staged_bin / "vpc-attach-ipam").readlink() == \
        Path(f"vpc-attach.bundle/{bundle.name}/vpc-attach")

    removed = subprocess.run([str(standalone / "vpc-attach"), "uninstall", "--root", str(root)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert removed.returncode == 0, removed.stderr
    assert list(root.iterdir()) == []


def test_staged_launcher_forwards_itself_and_hands_the_rest_to_the_build(
        standalone: Path, reference_plugins: Path, netns: str, vpc: str, work: Path) -> None:
    bin_dir = stage_standalone(standalone, work)
    (bundle,) = (bin_dir / "vpc-attach.bundle").iterdir()
    interpreter = (bin_dir / "vpc-attach").read_text().splitlines()[0][2:].split()[0]
    assert interpreter == str(bundle / "vpc-attach.lib/bin/python3")
    # The bundle's interpreter loads the bundle's libpython and standard library, whatever
    # Python the host has (here one with the same version, which it must not pick up).
    probe = subprocess.run(
        [interpreter, "-IS", "-c", "import os, sys; print(sys.prefix, os.__file__, *sorted("
         "{line.split()[-1] for line in open('/proc/self/maps') if 'libpython' in line}))"],
        env={}, cwd="/", capture_output=True, text=True, timeout=30, check=True)
    assert probe.stdout.split() and all(path.startswith(str(bundle))
                                        for path in probe.stdout.split()), probe.stdout

    plugin = WatchedPlugin(cnibin.populate(bin_dir, reference_plugins, ours=bin_dir), work)
    conf = base_conf(vpc, "8", ipam=host_local(work / "ipam", "fd00:58::/64"))
    assert plugin.call("VERSION", {}).status == 0
    # No agent: the launcher hands the verb to the build's executable, stdin replayed.
    add_check_del(plugin, conf, netns, vpc, "8")
    refused = plugin.call("ADD", base_conf(vpc, "8", bogus=True), netns="/nonexistent")
    assert refused.code == 7 and "bogus" in refused.body["msg"]

    # With an agent the launcher forwards by itself: the build's executable is not needed.
    executable = bundle / "vpc-attach"
    executable.rename(bundle / "vpc-attach.away")
    try:
        gone = plugin.call("ADD", conf, netns=netns, container_id="standalone-pod")
        assert gone.code == 5 and str(executable) in gone.body["msg"]
        assert naming.host_link_name(vpc, "8") not in links_in()
        (work / "agent").mkdir()
        with AgentProcess(work / "agent", executable=str(standalone / "vpc-attach"),
                          metrics=True) as agent:
            add_check_del(plugin, conf, netns, vpc, "8",
                          VPC_ATTACH_AGENT_SOCKET=str(agent.socket))
            served = [(line["verb"], line["containerID"]) for line in agent.verb_lines()]
            assert served == [(verb, "standalone-pod") for verb in ("ADD", "CHECK", "DEL", "DEL")]
            # The bundle carries prometheus-client: the agent counts what it served.
            assert 'vpc_attach_verb_duration_seconds_count{outcome="ok",verb="DEL"} 2.0' in \
                agent.scrape()
    finally:
        (bundle / "vpc-attach.away").rename(executable)


def test_a_tenant_config_naming_host_settings_is_refused_by_the_staged_launcher(
        standalone: Path, reference_plugins: Path, netns: str, vpc: str, work: Path) -> None:
    """SPEC §14 on the launcher's path: the launcher must not connect to the config's socket,
    and the build it hands the verb to must not log to the config's file, on ADD or DEL."""
    bin_dir = stage_standalone(standalone, work)
    plugin = WatchedPlugin(cnibin.populate(bin_dir, reference_plugins, ours=bin_dir), work)
    with planted_victims(work / "victim") as victims:
        conf = {**base_conf(vpc, "7", ipam=host_local(work / "ipam", "fd00:57::/64")),
                "logFile": str(victims.file), "logMaxBytes": "1", "logBackups": "1",
                "agentSocket": str(victims.listener.path)}
        added = plugin.call("ADD", conf, netns=netns, container_id="tenant-pod")
        assert added.code == 7 and "'logFile' is a host setting" in added.body["msg"]
        deleted = plugin.call("DEL", conf, netns=netns, container_id="tenant-pod")
        assert (deleted.status, deleted.stdout) == (0, "")
        victims.assert_untouched()
    assert links_in(netns) == {"lo"} and not (work / "ipam").exists()


def test_the_build_runs_doctor(standalone: Path, work: Path) -> None:
    """`vpc-attach doctor` from the bundle: every check runs and a JSON report comes out
    (this host is no configured node, so it may well find problems)."""
    report = doctor_report([str(standalone / "vpc-attach")],
                           {"PATH": os.environ.get("PATH", ""),
                            "VPC_ATTACH_HOST_CONFIG": str(work / "absent-host.json"),
                            "VPC_ATTACH_AGENT_SOCKET": str(work / "no-agent.sock"),
                            "VPC_ATTACH_METRICS_ADDRESS": ""},
                           "--cni-conf-dir", str(work / "no-net.d"),
                           "--ipam-data-dir", str(work / "no-ipam"))
    assert report.returncode in (0, 1), report.stderr
    assert {"settings.nodeName", "kernel.vrf", "agent.socket", "api.server",
            "leftovers.links"} <= set(report.by_check)


def test_a_verb_handed_to_the_build_does_not_ask_the_agent_again(
        standalone: Path, reference_plugins: Path, netns: str, vpc: str, work: Path) -> None:
    # An agent of another protocol version refuses: the launcher hands the verb over, and the
    # build's executable runs it without connecting a second time.
    bin_dir = stage_standalone(standalone, work)
    plugin = WatchedPlugin(cnibin.populate(bin_dir, reference_plugins, ours=bin_dir), work)
    path = work / "future.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(0.2)
    connections: list[bytes] = []
    stop = threading.Event()

    def future_agent() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            connections.append(recv_exact(conn, 4))
            conn.sendall(REFUSAL)
            conn.close()

    thread = threading.Thread(target=future_agent)
    thread.start()
    try:
        conf = base_conf(vpc, "7", ipam=host_local(work / "ipam", "fd00:57::/64"))
        env = {"VPC_ATTACH_AGENT_SOCKET": str(path)}
        result = plugin.ok("ADD", conf, container_id="handed", netns=netns, **env)
        assert naming.host_link_name(vpc, "7") in links_in()
        assert connections == [MAGIC], "asked once, by the launcher"
        plugin.ok("DEL", with_prev(conf, result), container_id="handed", netns=netns, **env)
        assert len(connections) == 2
    finally:
        stop.set()
        thread.join(10)
        listener.close()
