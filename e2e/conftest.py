"""Fixtures and hooks for tests on the real kernel and the real control plane.

Only declarations live here; what they use is in `e2e.harness` (nothing imports this file).
Every fixture creates what it needs and removes exactly that; nothing else on the host is
touched. Fixtures that need root skip with the reason when not run as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from e2e.harness import cnibin, kernel, plugin
from e2e.harness.agentproc import AgentProcess, OwnAgents
from e2e.harness.cluster import Cluster
from e2e.harness.galactic.build import GalacticBuild, ensure_galactic_built
from e2e.harness.galactic.fabric import apply_galactic_crds
from e2e.harness.kube import Kube
from e2e.harness.nodes import api_port, relay
from e2e.harness.pace import pace
from e2e.harness.plugin import Plugin
from e2e.harness.standalone import build_standalone, outside_tmp
from e2e.harness.vm.boot import HOST_ADDRESS
from e2e.harness.vm.pytest_plugin import HOST_CLUSTER_ENV
from e2e.harness.wait import wait_until

# The harness's and the bench's own property tests (e2e/harness/**/test_*.py, e2e/bench/) run
# beside e2e tests on a busy machine: no per-example deadline, as in tests/conftest.py.
settings.register_profile("vpc-attach-e2e", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("vpc-attach-e2e")


def _require_root() -> None:
    if not kernel.IS_ROOT:
        pytest.skip("needs root for network namespaces")


def pytest_report_header() -> str:
    """Say which path this run exercises."""
    return "vpc-attach path: " + ("through the node agent" if plugin.VIA_AGENT else "in-process")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Through the agent, run only the tests marked `both_paths` (the rest ran already)."""
    if not plugin.VIA_AGENT:
        return
    keep = [i for i in items if i.get_closest_marker("both_paths")]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def reference_plugins() -> Path:
    """The Go reference plugins (built once and cached by e2e.harness.tools)."""
    from e2e.harness.tools.gotools import reference_plugins_dir
    return reference_plugins_dir()


@pytest.fixture(scope="session")
def cni_bin(tmp_path_factory: pytest.TempPathFactory, reference_plugins: Path) -> Path:
    """A CNI_PATH dir: the reference plugins and launchers of `vpc-attach`, `vpc-attach-ipam`."""
    return cnibin.populate(tmp_path_factory.mktemp("cni-bin"), reference_plugins)


@pytest.fixture(scope="session", autouse=True)
def host_protection_left_as_found() -> Iterator[None]:
    """Tests that attach in this process's netns (or start an agent there) write vpc-attach's
    `inet vpc_attach` table into it: removed after the session if it was not there before."""
    existed = kernel.has_vpc_attach_table()
    yield
    if not existed:
        kernel.remove_vpc_attach_table()


@pytest.fixture(scope="session")
def own_agents() -> OwnAgents:
    """The agents tests start on nodes of their own in the agent pass, counted."""
    return OwnAgents()


@pytest.fixture(scope="session", autouse=True)
def agent_socket(tmp_path_factory: pytest.TempPathFactory,
                 own_agents: OwnAgents) -> Iterator[str]:
    """The socket of the node agent serving this session's invocations (agent pass); in-process,
    a path where no agent listens."""
    if not plugin.VIA_AGENT:
        yield plugin.NO_AGENT_SOCKET
        return
    with AgentProcess(tmp_path_factory.mktemp("agent")) as running:
        yield str(running.socket)
        assert running.verb_lines() or own_agents.started, "no invocation reached the agent"


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace for one test."""
    _require_root()
    with kernel.temporary_netns("vpa-test") as path:
        yield path


@pytest.fixture
def vpc(request: pytest.FixtureRequest) -> Iterator[str]:
    """A random VPC id; its links and rules are removed after the test. A test on the control
    plane (it uses `kube`) gets a VPCBinding admitting every namespace to the VPC for its
    duration, since the plugin enforces bindings wherever it has a kubeconfig (SPEC §14); the
    tenancy tests use VPCs of their own."""
    value = plugin.random_vpc()
    with contextlib.ExitStack() as stack:
        if "kube" in request.fixturenames:
            from e2e.harness.tenancy import bound
            stack.enter_context(bound(request.getfixturevalue("kube"), value))
        yield value
    kernel.remove_vpc_objects([value])


@pytest.fixture(params=["table", pytest.param("vrf", marks=[pytest.mark.fullkernel,
                                                             pytest.mark.once_through_agent])])
def isolation(request: pytest.FixtureRequest) -> str:
    """Each isolation mode in turn; `vrf` runs where the kernel has VRF (the full-kernel VM;
    once there, through an agent: the `table` runs prove the path's part on both paths)."""
    return str(request.param)


@pytest.fixture(name="plugin")
def plugin_runner(cni_bin: Path, tmp_path: Path, agent_socket: str) -> Plugin:
    """The plugin runner, with host settings isolated from the machine's, through the session's
    agent in the agent pass."""
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    return Plugin(cni_bin=cni_bin, lock_dir=lock_dir, agent_socket=agent_socket)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real etcd + kube-apiserver + kube-controller-manager for the whole session (in the
    full-kernel VM: the one the host runs for it, see `e2e.harness.vm.pytest_plugin`)."""
    host_cluster = os.environ.get(HOST_CLUSTER_ENV)
    if host_cluster:
        with _from_the_host(Cluster.attach(host_cluster)) as attached:
            yield attached
        return
    running = Cluster.up(tmp_path_factory.mktemp("cluster"))
    try:
        yield running
    finally:
        running.down()


# The relay's first answer: the guest's TLS handshakes through qemu's user-mode network, CPU
# work of the emulated guest like its cold starts (120 s at a busy moment's 8 s each).
RELAY_READY_STARTS = 15


@contextlib.contextmanager
def _from_the_host(cluster: Cluster) -> Iterator[Cluster]:
    """In the VM: the host's API server at the same URL (its certificate names 127.0.0.1), by
    a relay from this loopback to the host's over qemu's user-mode network."""
    port = api_port(cluster.server)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    with relay(listener, (HOST_ADDRESS, port)):
        with cluster.admin() as admin:  # the whole path answers, TLS included, before a test
            wait_until("the host's kube-apiserver through the relay",
                       lambda: admin.get_text("/readyz")[0] == 200,
                       pace().starts(RELAY_READY_STARTS), interval=0.5)
        yield cluster


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Iterator[Kube]:
    """Cluster-admin access through the official client (arranges and checks; never the
    plugin's own client). `Cluster.up` already waited for the default ServiceAccount."""
    with cluster.admin() as admin:
        yield admin


@pytest.fixture(scope="session")
def standalone() -> Iterator[Path]:
    """The standalone build (dist layout: vpc-attach, vpc-attach-ipam, vpc-attach.lib/)."""
    _require_root()
    work = outside_tmp("standalone")
    try:
        yield build_standalone(work / "dist")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def galactic(kube: Kube) -> GalacticBuild:
    """galactic-router, galactic-cni, gobgpd/gobgp and our programs on galactic's packages
    (setup.sh built them: a cache hit), and the CRDs the router watches beyond ours, in this
    test cluster; for every test module that runs galactic beside vpc-attach."""
    build = ensure_galactic_built()
    apply_galactic_crds(kube, build.crd_dir)
    return build
