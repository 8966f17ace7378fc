"""The DaemonSet's image (packaging/image), built by its own build.sh and checked from outside:
the archive read with GNU tar and json, the layer unpacked and walked, its executables run in a
chroot of the layer alone (no host Python, no host library), the node agent started from it,
two builds compared, and containerd importing it, resolving the name a Pod uses and running
it under runc — the init container's `vpc-attach install` included.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness.agentproc import free_port
from e2e.harness.image import ProjectImage, assemble, build_image
from e2e.harness.image_layout import (
    RUN_TIMEOUT,
    Layout,
    chroot,
    created_epoch,
    elf_files,
    read_layout,
    readelf,
    sha256,
    unpack_layer,
)
from e2e.harness.kernel import IS_ROOT
from e2e.harness.wait import wait_until

if TYPE_CHECKING:  # e2e.harness.cri needs grpcio: import it only where a test runs
    from e2e.harness.cri import Containerd

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
BUNDLE = "opt/vpc-attach/standalone"
ETC_FILES = {"etc/passwd", "etc/group", "etc/nsswitch.conf"}
ON_PATH = {"usr/local/bin/vpc-attach", "usr/local/bin/vpc-attach-ipam", "usr/sbin/nft"}
SYSTEM_LIBRARY_DIRS = ("lib/", "lib64/", "usr/lib/", "usr/lib64/")
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}


@pytest.fixture(scope="module")
def image() -> ProjectImage:
    """The project's image (built by packaging/image/build.sh, or its cached archive)."""
    if not IS_ROOT:
        pytest.skip("needs root (chroot, containerd)")
    return build_image()


@pytest.fixture(scope="module")
def layout(image: ProjectImage, tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """The archive unpacked by GNU tar; index, manifests and config read as plain JSON."""
    return read_layout(image.archive, tmp_path_factory.mktemp("archive"))


@pytest.fixture(scope="module")
def rootfs(layout: Layout, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The layer unpacked (owners, modes and mtimes kept); only read by the tests using it."""
    return unpack_layer(layout, tmp_path_factory.mktemp("rootfs"))


def test_archive_names_the_image_for_containerd_skopeo_and_docker(
        image: ProjectImage, layout: Layout) -> None:
    assert image.ref == f"docker.io/library/vpc-attach:{VERSION}"
    assert json.loads((layout.root / "oci-layout").read_text()) == {
        "imageLayoutVersion": "1.0.0"}
    (entry,) = layout.index["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert entry["annotations"] == {
        "io.containerd.image.name": f"docker.io/library/vpc-attach:{VERSION}",
        "org.opencontainers.image.ref.name": VERSION}
    arch = GOARCH.get(platform.machine(), platform.machine())
    assert entry["platform"] == {"architecture": arch, "os": "linux"}
    (docker,) = layout.docker
    assert docker["RepoTags"] == [f"vpc-attach:{VERSION}"]
    # Every blob is stored under its digest, with the size its parent states.
    for descriptor in [entry, layout.manifest["config"], *layout.manifest["layers"]]:
        blob = layout.blob(descriptor["digest"])
        assert sha256(blob) == descriptor["digest"]
        assert blob.stat().st_size == descriptor["size"]
    assert docker["Config"] == f"blobs/sha256/{layout.manifest['config']['digest'][7:]}"
    assert docker["Layers"] == [f"blobs/sha256/{layout.layer().name}"]
    (layer,) = layout.manifest["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    plain = subprocess.run(["gzip", "-dc", str(layout.layer())], capture_output=True,
                           check=True, timeout=RUN_TIMEOUT).stdout
    assert layout.config["rootfs"] == {
        "type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(plain).hexdigest()]}


def test_config_runs_the_agent_with_the_executables_on_path(layout: Layout) -> None:
    config = layout.config
    assert (config["architecture"], config["os"]) == (
        GOARCH.get(platform.machine(), platform.machine()), "linux")
    runtime = config["config"]
    assert runtime["Cmd"] == ["vpc-attach", "agent"]
    assert "Entrypoint" not in runtime
    assert "/usr/local/bin" in layout.path_env.removeprefix("PATH=").split(":")
    labels = runtime["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    revision = labels.get("org.opencontainers.image.revision")
    if revision is not None:  # a git checkout: a commit of this repository
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", revision), revision
        subprocess.run(["git", "-C", str(REPO), "cat-file", "-e",
                        revision.removesuffix("-dirty") + "^{commit}"], check=True)


def test_layer_holds_the_bundle_its_loader_and_libraries_and_nothing_else(
        layout: Layout, rootfs: Path) -> None:
    bundle = rootfs / BUNDLE
    for name in ("vpc-attach", "vpc-attach-ipam"):
        link = rootfs / "usr/local/bin" / name
        assert link.is_symlink() and not os.readlink(link).startswith("/")
        assert Path(os.path.realpath(link)) == Path(os.path.realpath(bundle / name))
    assert (bundle / "vpc-attach").is_file() and os.access(bundle / "vpc-attach", os.X_OK)
    assert (bundle / "vpc-attach.lib/bin/python3").is_file()

    files = {path.relative_to(rootfs).as_posix() for path in rootfs.rglob("*")
             if not path.is_dir() or path.is_symlink()}
    outside = {name for name in files if not name.startswith(BUNDLE + "/")}
    libraries = outside - ETC_FILES - ON_PATH
    assert outside >= ETC_FILES | ON_PATH
    assert {path.name for path in rootfs.iterdir()} <= {"etc", "lib", "lib64", "opt", "tmp", "usr"}
    assert all(name.startswith(SYSTEM_LIBRARY_DIRS) for name in libraries), libraries

    # Each system library is the loader or a library some ELF file of the bundle needs, and
    # every library the bundle needs is in the bundle or among them.
    interpreters, needed = set(), set()
    # nft and what it loads pull in libraries the bundle does not (libnftables, libmnl, …)
    for elf in [*elf_files(bundle), rootfs / "usr/sbin/nft",
                *(rootfs / name for name in sorted(libraries))]:
        headers = readelf("--program-headers", "--dynamic", "--wide", str(elf))
        interpreters.update(re.findall(r"Requesting program interpreter: ([^\]]+)\]", headers))
        needed.update(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", headers))
    assert interpreters and {i.lstrip("/") for i in interpreters} <= libraries
    in_bundle = {path.name for path in (bundle / "vpc-attach.lib").iterdir()}
    system_names = {name.rsplit("/", 1)[-1] for name in libraries}
    assert needed <= in_bundle | system_names, needed - in_bundle - system_names
    loaders = {Path(i).name for i in interpreters}
    assert system_names - loaders <= needed, system_names - loaders - needed
    for name in libraries:
        with open(rootfs / name, "rb") as handle:
            assert handle.read(4) == b"\x7fELF", name

    assert (rootfs / "etc/passwd").read_text().splitlines()[0].startswith("root:x:0:0:")
    assert "hosts: files dns" in (rootfs / "etc/nsswitch.conf").read_text().splitlines()
    assert not [name for name in files if "python" in Path(name).name
                and not name.startswith(BUNDLE + "/")]


def test_every_entry_is_root_owned_with_the_fixed_mtime_in_tree_order(
        layout: Layout, rootfs: Path) -> None:
    epoch = created_epoch(layout.config)
    assert epoch == int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    tmp = rootfs / "tmp"
    assert tmp.is_dir() and (tmp.stat().st_mode & 0o7777) == 0o1777
    entries = [rootfs, *rootfs.rglob("*")][1:]
    assert len(entries) > 100
    wrong = [(path, info.st_uid, info.st_gid, info.st_mtime) for path in entries
             if (info := path.lstat()) and (info.st_uid, info.st_gid, int(info.st_mtime))
             != (0, 0, epoch)]
    assert not wrong
    listing = subprocess.run(["tar", "--list", "--gzip", "--file", str(layout.layer())],
                             capture_output=True, text=True, check=True,
                             timeout=RUN_TIMEOUT).stdout.splitlines()
    names = [name.rstrip("/") for name in listing]
    assert names == sorted(names, key=lambda name: name.split("/"))  # each dir, then its contents
    assert len(names) == len(entries)


def test_executables_run_from_the_layer_alone(layout: Layout, rootfs: Path) -> None:
    version_conf = '{"cniVersion":"1.1.0"}'
    for name in ("vpc-attach", "vpc-attach-ipam"):
        proc = chroot(rootfs, layout, [name], version_conf, CNI_COMMAND="VERSION")
        assert proc.returncode == 0, proc.stderr
        answer = json.loads(proc.stdout)
        assert answer["cniVersion"] == "1.1.0" and "1.1.0" in answer["supportedVersions"]
    proc = chroot(rootfs, layout, ["vpc-attach", "install", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "--source SOURCE" in proc.stdout
    # A verb in-process imports the project's dependencies (pydantic_core, yaml): a config
    # error answered as CNI error 7 shows they load from the image.
    stanza = {"cniVersion": "1.1.0", "name": "n", "type": "vpc-attach", "vpc": "10",
              "vpcattachment": "10", "no-such-key": 1}
    proc = chroot(rootfs, layout, ["vpc-attach"], json.dumps(stanza), CNI_COMMAND="ADD",
                  CNI_CONTAINERID="image-test", CNI_NETNS="/var/run/netns/none",
                  CNI_IFNAME="eth0", CNI_PATH="/opt/cni/bin")
    error = json.loads(proc.stdout)
    assert (proc.returncode, error["code"]) == (1, 7), proc.stderr
    assert "no-such-key" in error["msg"]


def test_agent_from_the_layer_serves_a_forwarded_verb(layout: Layout,
                                                      tmp_path: Path) -> None:
    rootfs = unpack_layer(layout, tmp_path / "rootfs")  # the agent writes into its /tmp
    address = f"127.0.0.1:{free_port()}"
    chroot_bin = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert chroot_bin is not None
    # A netns of its own: the agent writes its nftables table where it runs, with the image's nft.
    node = f"vpa-imgnode-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", node], check=True, timeout=RUN_TIMEOUT)
    subprocess.run(["ip", "-n", node, "link", "set", "lo", "up"], check=True, timeout=RUN_TIMEOUT)
    # …and /proc, as a container has it (the agent writes the node sysctls the table needs).
    (rootfs / "proc").mkdir()
    agent = subprocess.Popen(
        ["ip", "netns", "exec", node, "unshare", "--mount", "--propagation", "private", "sh",
         "-c", 'mount -t proc proc "$0/proc" && exec "$@"', str(rootfs),
         "env", "-i", layout.path_env, f"VPC_ATTACH_METRICS_ADDRESS={address}", chroot_bin,
         str(rootfs), "vpc-attach", "agent", "--socket", "/tmp/agent.sock"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def running() -> None:
            if agent.poll() is not None:
                stderr = agent.stderr.read().decode() if agent.stderr else ""
                raise AssertionError(f"agent exited with {agent.returncode}: {stderr}")

        def accepts() -> bool:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(rootfs / "tmp/agent.sock"))
            return True

        wait_until("the agent's socket", accepts, timeout=30, alive=running)
        stanza = {"cniVersion": "1.1.0", "name": "n", "type": "vpc-attach", "vpc": "10",
                  "vpcattachment": "10", "no-such-key": 1}
        proc = chroot(rootfs, layout, ["vpc-attach"], json.dumps(stanza), CNI_COMMAND="ADD",
                      CNI_CONTAINERID="image-test", CNI_NETNS="/var/run/netns/none",
                      CNI_IFNAME="eth0", CNI_PATH="/opt/cni/bin",
                      VPC_ATTACH_AGENT_SOCKET="/tmp/agent.sock")
        assert json.loads(proc.stdout)["code"] == 7, proc.stderr
        table = subprocess.run(["ip", "netns", "exec", node, "nft", "list", "table", "inet",
                                "vpc_attach"], capture_output=True, text=True, check=False,
                               timeout=RUN_TIMEOUT)
        assert "meta mark set iifgroup" in table.stdout, table.stderr
        # Only verbs the agent served are counted (in-process ones are not).
        scrape = subprocess.run(
            ["ip", "netns", "exec", node, sys.executable, "-c",
             "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
             f"'http://{address}/metrics', timeout=10).read().decode())"],
            capture_output=True, text=True, check=True, timeout=RUN_TIMEOUT).stdout
        errors = {(s.labels["verb"], s.labels["code"]): s.value
                  for family in text_string_to_metric_families(scrape)
                  for s in family.samples if s.name == "vpc_attach_verb_errors_total"}
        assert errors == {("ADD", "7"): 1.0}
    finally:
        agent.send_signal(signal.SIGTERM)
        status = agent.wait(timeout=60)
        subprocess.run(["ip", "netns", "del", node], check=False, timeout=RUN_TIMEOUT)
    assert status == 0


def test_two_builds_of_the_same_bundle_give_the_same_digest(
        layout: Layout, rootfs: Path, tmp_path: Path) -> None:
    """Rebuilt from the image's own bundle, then from a copy with other mtimes and modes: the
    same manifest digest as the image build.sh made, byte for byte."""
    labels = layout.config["config"]["Labels"]
    identity: dict[str, Any] = {
        "version": VERSION, "revision": labels.get("org.opencontainers.image.revision", ""),
        "source_url": labels.get("org.opencontainers.image.source", ""),
        "epoch": created_epoch(layout.config)}
    (built,) = layout.index["manifests"]
    first = assemble(rootfs / BUNDLE, tmp_path / "first.tar", **identity)
    copy = tmp_path / "copy"
    shutil.copytree(rootfs / BUNDLE, copy, symlinks=True)
    for path in [copy, *copy.rglob("*")]:
        if not path.is_symlink():
            os.utime(path, (1_700_000_000, 1_700_000_000))
            if path.is_file():
                path.chmod(0o700 if path.stat().st_mode & 0o100 else 0o600)
    second = assemble(copy, tmp_path / "second.tar", **identity)
    assert first["manifest_digest"] == second["manifest_digest"] == built["digest"]
    assert (tmp_path / "first.tar").read_bytes() == (tmp_path / "second.tar").read_bytes()
    # The comparison can fail: another epoch is another image.
    other = assemble(copy, tmp_path / "other.tar", **{**identity, "epoch": 86400})
    assert other["manifest_digest"] != built["digest"]


@pytest.fixture(scope="module")
def containerd(image: ProjectImage, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Containerd]:
    """A throwaway containerd (e2e.harness.cri) for the image."""
    missing = [tool for tool in ("containerd", "ctr", "runc")
               if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/setup.sh installs them)")
    from e2e.harness.cri import Containerd
    from e2e.harness.cri.containerd import CniSettings
    from e2e.harness.cri.pause import pause_image

    base = tmp_path_factory.mktemp("cri")
    with Containerd(base / "containerd", CniSettings(base / "cni-bin", base / "net.d"),
                    pause_image()) as runtime:
        yield runtime
        assert runtime.stop() == []


def _ctr_run(runtime: Containerd, ref: str, argv: list[str], *options: str) -> str:
    """`ctr run --rm` of ref under runc, on the helper's runc root and cgroup parent."""
    name = f"vpc-attach-image-{secrets.token_hex(4)}"
    return runtime.ctr("run", "--rm", "--runc-root", str(runtime.runc_root),
                       "--cgroup", f"{runtime.cgroup_parent}/{name}", *options, ref, name,
                       *argv, timeout=RUN_TIMEOUT)


def _daemonset_container(name: str) -> dict[str, Any]:
    (daemonset,) = [doc for doc in yaml.safe_load_all(
        (REPO / "packaging/daemonset/daemonset.yaml").read_text()) if doc]
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = [c for c in spec["initContainers"] + spec["containers"] if c["name"] == name]
    return dict(container)


def test_containerd_imports_it_as_the_name_a_pod_uses_and_runs_it(
        image: ProjectImage, layout: Layout, containerd: Containerd, tmp_path: Path) -> None:
    output = containerd.ctr("images", "import", str(image.archive))
    assert image.ref in output
    listed = containerd.ctr("images", "list", "--quiet").split()
    assert f"docker.io/library/vpc-attach:{VERSION}" in listed
    # The kubelet asks the CRI for a Pod's `image: vpc-attach:<version>` as written.
    assert containerd.client.image_present(f"vpc-attach:{VERSION}")
    (built,) = layout.index["manifests"]
    assert built["digest"] in containerd.ctr("images", "list", f"name=={image.ref}")

    # Under runc, with the image's own config: PATH finds vpc-attach.
    answer = json.loads(_ctr_run(containerd, image.ref, ["vpc-attach"],
                                 "--env", "CNI_COMMAND=VERSION"))
    assert "1.1.0" in answer["supportedVersions"]

    # The DaemonSet's init container, its command and args as written there, with the host's
    # directories under tmp_path (and no ServiceAccount here: --no-kubeconfig).
    install = _daemonset_container("install")
    host = tmp_path / "host"
    host.mkdir()
    _ctr_run(containerd, image.ref, [*install["command"], *install["args"], "--no-kubeconfig"],
             "--env", "NODE_NAME=image-test-node",
             "--mount", f"type=bind,src={host},dst=/host,options=rbind:rw")
    bundles = list((host / "opt/cni/bin/vpc-attach.bundle").iterdir())
    assert len(bundles) == 1
    launcher = (host / "opt/cni/bin/vpc-attach").read_text().splitlines()[0]
    assert launcher == f"#!/opt/cni/bin/vpc-attach.bundle/{bundles[0].name}/" \
                       "vpc-attach.lib/bin/python3 -IS"
    assert json.loads((host / "etc/vpc-attach/host.json").read_text())["nodeName"] == \
        "image-test-node"
    assert (host / "var/lib/vpc-attach/install-manifest.json").is_file()
    # What it staged runs on this host, from the host's directory.
    proc = subprocess.run([str(host / "opt/cni/bin/vpc-attach-ipam")], input="{}",
                          env={"CNI_COMMAND": "VERSION"}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, check=False)
    assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"], proc.stderr
