"""A real, local Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager.

Everything a cluster creates lives in its state dir (certificates, data, logs, pid files,
kubeconfigs); everything listens on 127.0.0.1 on ports picked at start, so several clusters can
run side by side. ``Cluster.up`` leaves the processes running detached; ``Cluster.down`` (or
``down(state_dir)`` from another process) stops exactly those and removes the state dir.
"""

from __future__ import annotations

import dataclasses
import functools
import http.client
import json
import logging
import shutil
import signal
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from e2e.harness.cluster import build, processes
from e2e.harness.cluster.kubeconfig import write_cert_kubeconfig, write_token_kubeconfig
from e2e.harness.cluster.pki import Pki, create_pki
from e2e.harness.ipamclaims import ipamclaim_crd
from e2e.harness.kube import JsonObject, Kube, crd_established
from e2e.harness.pace import Bound, pace
from e2e.harness.wait import wait_until

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_MANIFEST_DIRS = (REPO_ROOT / "packaging" / "crds", REPO_ROOT / "packaging" / "rbac")

STATE_FILE = "cluster.json"
STATE_MARKER = "vpc-attach e2e.cluster"  # kept when e2e/cluster moved: older state dirs stay ours
BGP_NAMESPACE = "galactic-system"
PLUGIN_SERVICE_ACCOUNT = ("kube-system", "vpc-attach")
PLUGIN_TOKEN_SECONDS = 24 * 3600
# Stop order: dependants first.
COMPONENT_NAMES = ("kube-controller-manager", "kube-apiserver", "etcd")

# How long each component may take to answer, in the plugin's cold starts measured on this
# machine (`e2e.harness.pace`): a Go daemon's start is CPU work that slows down with it. At a
# quiet fast machine's 0.25 s: 30, 90, 60 and 60 s, the bounds these replace.
ETCD_READY_STARTS = 120
APISERVER_READY_STARTS = 360
CONTROLLER_MANAGER_READY_STARTS = 240
BOOTSTRAP_STARTS = 240  # CRDs Established, the default ServiceAccount, RBAC in effect
PORT_ATTEMPTS = 3
# The garbage collector is the point; namespace deletion and the default ServiceAccount
# (required by Pod admission) need the other three.
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
)


class ClusterError(RuntimeError):
    """The control plane could not be started or stopped; the message says which part."""


@dataclasses.dataclass
class Cluster:
    """A running control plane and the files a test needs to talk to it."""

    state_dir: Path
    server: str
    ca_file: Path
    admin_kubeconfig: Path
    plugin_kubeconfig: Path
    plugin_token: str
    kubernetes_version: str
    etcd_version: str
    startup_seconds: float = 0.0
    # Handles of the processes this object started (empty after ``attach``), to reap them.
    _components: dict[str, processes.Component] = dataclasses.field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def bgp_namespace(self) -> str:
        """Namespace of the BGP custom resources (created by ``up``)."""
        return BGP_NAMESPACE

    @classmethod
    def up(
        cls,
        state_dir: Path | str,
        manifest_dirs: tuple[Path, ...] = DEFAULT_MANIFEST_DIRS,
        extra_controllers: tuple[str, ...] = (),
        controller_manager: bool = True,
    ) -> Cluster:
        """Build the binaries if needed, start the control plane in ``state_dir`` and bootstrap it.

        ``state_dir`` must not exist or be empty. ``extra_controllers`` are controller-manager
        controllers beyond CONTROLLERS (a node needs the workload controllers). Without
        ``controller_manager`` (the demo's first part, which runs before that binary is built)
        nothing collects garbage or makes ServiceAccounts, so the API server's ServiceAccount
        admission, which would refuse every Pod until the controller made `default`, is off.
        On failure every process started so far is stopped and the state dir is kept for its
        logs (``down`` removes it).
        """
        started = time.monotonic()
        binaries = build.ensure_control_plane_built(controller_manager)
        directory = _claim_state_dir(Path(state_dir))
        components: dict[str, processes.Component] = {}
        try:
            pki = create_pki(directory / "pki")
            etcd_url = _start_etcd(directory, binaries["etcd"], components)
            server, admin = _start_apiserver(
                directory, binaries["kube-apiserver"], pki, etcd_url, components,
                service_account_admission=controller_manager,
            )
            if controller_manager:
                _start_controller_manager(
                    directory,
                    binaries["kube-controller-manager"],
                    pki,
                    server,
                    components,
                    (*CONTROLLERS, *extra_controllers),
                )
            with admin:
                # Beside ours, the IPAMClaim CRD: read by the plugin, shipped by its own module.
                _apply_manifests(admin, [*load_manifests(manifest_dirs), ipamclaim_crd()])
                if controller_manager:
                    _wait_default_service_account(admin)
                token = _mint_plugin_token(admin)
                _wait_plugin_authorized(server, pki, token)
        except BaseException:
            for name in COMPONENT_NAMES:
                if name in components:
                    processes.stop(name, directory, components[name].popen)
            raise
        admin_kubeconfig = write_cert_kubeconfig(
            directory / "admin.kubeconfig",
            server,
            pki.ca_cert,
            "admin",
            pki.client_cert("admin"),
            pki.client_key("admin"),
        )
        plugin_user = "system:serviceaccount:{}:{}".format(*PLUGIN_SERVICE_ACCOUNT)
        plugin_kubeconfig = write_token_kubeconfig(
            directory / "plugin.kubeconfig", server, pki.ca_cert, plugin_user, token
        )
        cluster = cls(
            state_dir=directory,
            server=server,
            ca_file=pki.ca_cert,
            admin_kubeconfig=admin_kubeconfig,
            plugin_kubeconfig=plugin_kubeconfig,
            plugin_token=token,
            kubernetes_version=build.KUBERNETES.version,
            etcd_version=build.ETCD.version,
            startup_seconds=round(time.monotonic() - started, 2),
        )
        cluster._components = components
        cluster._write_state()
        log.info(
            "cluster up in %.1f s: %s (state dir %s)", cluster.startup_seconds, server, directory
        )
        return cluster

    @classmethod
    def attach(cls, state_dir: Path | str) -> Cluster:
        """The cluster recorded in ``state_dir`` by an earlier ``up`` (possibly another process)."""
        directory = Path(state_dir).resolve()
        state = _read_state(directory)
        if state.get("status") != "up":
            raise ClusterError(f"{directory}: cluster is not up (status {state.get('status')!r})")
        return cls(
            state_dir=directory,
            server=state["server"],
            ca_file=Path(state["ca_file"]),
            admin_kubeconfig=Path(state["admin_kubeconfig"]),
            plugin_kubeconfig=Path(state["plugin_kubeconfig"]),
            plugin_token=state["plugin_token"],
            kubernetes_version=state["kubernetes_version"],
            etcd_version=state["etcd_version"],
            startup_seconds=state.get("startup_seconds", 0.0),
        )

    def down(self) -> None:
        """Stop this cluster's processes and remove its state dir."""
        popens = {name: c.popen for name, c in self._components.items()}
        down(self.state_dir, popens)
        for popen in popens.values():  # reap, also when another process already stopped them
            if popen is not None:
                popen.poll()
        self._components.clear()

    def admin(self) -> Kube:
        """Cluster-admin access (system:masters) through the official client; close it after."""
        pki = Pki(self.state_dir / "pki")
        return Kube.with_certificate(self.server, pki.ca_cert, pki.client_cert("admin"),
                                     pki.client_key("admin"))

    def pids(self) -> dict[str, int]:
        """The recorded pid of each component."""
        found = {}
        for name in COMPONENT_NAMES:
            pid = processes.read_pid(self.state_dir, name)
            if pid is not None:
                found[name] = pid
        return found

    # Faults (e2e/harness/faults): a component paused, killed or restarted ------------------

    def pause(self, name: str) -> None:
        """SIGSTOP a component (`kube-apiserver`, `etcd`, `kube-controller-manager`): it holds
        its connections but answers nothing until `resume`."""
        processes.send(name, self.state_dir, signal.SIGSTOP)
        log.info("paused %s", name)

    def resume(self, name: str) -> None:
        """SIGCONT a paused component."""
        processes.send(name, self.state_dir, signal.SIGCONT)
        log.info("resumed %s", name)

    def kill(self, name: str) -> None:
        """SIGKILL a component (a crash); `restart` brings it back."""
        component = self._components.get(name)
        processes.kill(name, self.state_dir, component.popen if component else None)

    def restart(self, name: str) -> None:
        """Start a killed (or running: it is killed first) component again with its command
        line, ports and data, and wait until it is ready. Only in the process that ran `up`."""
        component = self._components.get(name)
        if component is None or not component.argv:
            raise ClusterError(f"{name}: not started by this process; cannot restart it")
        self.kill(name)
        restarted = processes.start(name, component.argv, self.state_dir)
        self._components[name] = restarted
        self._wait_component_ready(restarted)
        self._write_state()
        log.info("restarted %s (pid %d)", name, restarted.pid)

    def _wait_component_ready(self, component: processes.Component) -> None:
        flags = dict(arg.split("=", 1) for arg in component.argv if arg.startswith("--")
                     and "=" in arg)
        if component.name == "etcd":
            url = flags["--listen-client-urls"]
            wait_until("etcd /health", lambda: _etcd_healthy(url),
                       pace().starts(ETCD_READY_STARTS), alive=component.check_alive)
        elif component.name == "kube-apiserver":
            _wait_ready(component.name, self.admin(), "/readyz",
                        pace().starts(APISERVER_READY_STARTS), component)
        else:
            health = Kube.anonymous(f"https://127.0.0.1:{flags['--secure-port']}", self.ca_file)
            _wait_ready(component.name, health, "/healthz",
                       pace().starts(CONTROLLER_MANAGER_READY_STARTS), component)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    def _write_state(self) -> None:
        state = {
            "harness": STATE_MARKER,
            "status": "up",
            "server": self.server,
            "ca_file": str(self.ca_file),
            "admin_kubeconfig": str(self.admin_kubeconfig),
            "plugin_kubeconfig": str(self.plugin_kubeconfig),
            "plugin_token": self.plugin_token,
            "kubernetes_version": self.kubernetes_version,
            "etcd_version": self.etcd_version,
            "startup_seconds": self.startup_seconds,
            "pids": self.pids(),
        }
        _write_json(self.state_dir / STATE_FILE, state)


def down(state_dir: Path | str, popens: dict[str, Any] | None = None) -> None:
    """Stop the processes ``up`` started in ``state_dir`` and remove it.

    Refuses to touch a directory that ``up`` did not create. A missing directory is fine
    (``down`` is idempotent).
    """
    directory = Path(state_dir).resolve()
    if not directory.exists():
        return
    _read_state(directory)  # raises unless this is one of ours
    popens = popens or {}
    recorded = {path.stem for path in (directory / "run").glob("*.pid")}
    for name in [*COMPONENT_NAMES, *sorted(recorded - set(COMPONENT_NAMES))]:
        processes.stop(name, directory, popens.get(name))
    shutil.rmtree(directory)
    log.info("removed %s", directory)


def _claim_state_dir(state_dir: Path) -> Path:
    directory = state_dir.resolve()
    if directory.exists() and any(directory.iterdir()):
        if (directory / STATE_FILE).exists():
            raise ClusterError(f"{directory} already holds a cluster; run `down` first")
        raise ClusterError(f"state dir {directory} exists and is not empty")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written first, so that `down` can clean up after an `up` that failed half-way.
    _write_json(directory / STATE_FILE, {"harness": STATE_MARKER, "status": "starting"})
    return directory


def _read_state(directory: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ClusterError(
            f"{directory} was not created by `e2e.harness.cluster up`; not touching it"
        ) from exc
    if state.get("harness") != STATE_MARKER:
        raise ClusterError(
            f"{directory} was not created by `e2e.harness.cluster up`; not touching it")
    return state


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    temporary.replace(path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"URL without host and port: {url}")
    return parts.hostname, parts.port


def _start_with_free_ports(
    name: str,
    state_dir: Path,
    components: dict[str, processes.Component],
    argv_for_ports: Callable[[], tuple[list[str], Callable[[processes.Component], None]]],
) -> None:
    """Start a component, picking new ports if another process took ours in the meantime.

    ``argv_for_ports`` picks ports and returns the command line and a readiness wait.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        argv, wait_ready = argv_for_ports()
        component = processes.start(name, argv, state_dir)
        components[name] = component
        try:
            wait_ready(component)
            return
        except (processes.ProcessExited, TimeoutError) as exc:
            clash = "address already in use" in component.log_tail(200)
            processes.stop(name, state_dir, component.popen)
            del components[name]
            if not clash or attempt == PORT_ATTEMPTS:
                raise ClusterError(f"{name} did not become ready: {exc}") from exc
            log.warning("%s: port clash, retrying with new ports", name)


def _start_etcd(state_dir: Path, binary: Path, components: dict[str, processes.Component]) -> str:
    client_url = ""

    def argv_for_ports() -> tuple[list[str], Callable[[processes.Component], None]]:
        nonlocal client_url
        client_url = f"http://127.0.0.1:{_free_port()}"
        peer_url = f"http://127.0.0.1:{_free_port()}"
        argv = [
            str(binary),
            "--name=e2e",
            f"--data-dir={state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # throwaway data: skip fsync, it dominates write latency
            "--log-level=warn",
        ]
        return argv, lambda component: wait_until(
            "etcd /health",
            lambda: _etcd_healthy(client_url),
            pace().starts(ETCD_READY_STARTS),
            alive=component.check_alive,
        )

    _start_with_free_ports("etcd", state_dir, components, argv_for_ports)
    return client_url


def _etcd_healthy(client_url: str) -> bool:
    host, port = _host_port(client_url)
    connection = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        body = response.read()
    except http.client.HTTPException:  # a half-started etcd: not yet
        return False
    finally:
        connection.close()
    return response.status == 200 and json.loads(body).get("health") == "true"


def _start_apiserver(
    state_dir: Path,
    binary: Path,
    pki: Pki,
    etcd_url: str,
    components: dict[str, processes.Component],
    service_account_admission: bool = True,
) -> tuple[str, Kube]:
    server = ""

    def admin() -> Kube:
        return Kube.with_certificate(
            server, pki.ca_cert, pki.client_cert("admin"), pki.client_key("admin")
        )

    def argv_for_ports() -> tuple[list[str], Callable[[processes.Component], None]]:
        nonlocal server
        port = _free_port()
        server = f"https://127.0.0.1:{port}"
        argv = [
            str(binary),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={state_dir / 'pki' / 'apiserver-generated'}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            # The packaged DaemonSet is privileged (it manages host networking).
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            # No kubelet runs, and loopback addresses are invalid in the kubernetes Endpoints.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ]
        if not service_account_admission:
            argv.append("--disable-admission-plugins=ServiceAccount")
        return argv, functools.partial(
            _wait_ready, "kube-apiserver", admin(), "/readyz",
            pace().starts(APISERVER_READY_STARTS)
        )

    _start_with_free_ports("kube-apiserver", state_dir, components, argv_for_ports)
    return server, admin()


def _start_controller_manager(
    state_dir: Path,
    binary: Path,
    pki: Pki,
    server: str,
    components: dict[str, processes.Component],
    controllers: tuple[str, ...],
) -> None:
    kubeconfig = write_cert_kubeconfig(
        state_dir / "controller-manager.kubeconfig",
        server,
        pki.ca_cert,
        "system:kube-controller-manager",
        pki.client_cert("controller-manager"),
        pki.client_key("controller-manager"),
    )

    def argv_for_ports() -> tuple[list[str], Callable[[processes.Component], None]]:
        port = _free_port()
        argv = [
            str(binary),
            # No --authentication/authorization-kubeconfig: nothing but the always-allowed
            # /healthz is queried, and delegated authn would nag about the front-proxy CA.
            f"--kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={pki.serving_cert('controller-manager')}",
            f"--tls-private-key-file={pki.serving_key('controller-manager')}",
            "--leader-elect=false",
            # Each controller acts as its own ServiceAccount with its bootstrap RBAC role, as
            # in kubeadm clusters; the manager's own identity may only mint their tokens.
            "--use-service-account-credentials=true",
            "--controllers=" + ",".join(controllers),
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}",
            "--v=1",
        ]
        health = Kube.anonymous(f"https://127.0.0.1:{port}", pki.ca_cert)
        return argv, functools.partial(
            _wait_ready, "kube-controller-manager", health, "/healthz",
            pace().starts(CONTROLLER_MANAGER_READY_STARTS)
        )

    _start_with_free_ports("kube-controller-manager", state_dir, components, argv_for_ports)


def _wait_ready(
    name: str, client: Kube, path: str, timeout: Bound, component: processes.Component
) -> None:
    """Wait until ``path`` answers 200 (or the component dies); closes ``client``."""
    with client:
        wait_until(
            f"{name} {path}",
            lambda: client.get_text(path)[0] == 200,
            timeout,
            interval=0.5,
            alive=component.check_alive,
        )


def load_manifests(directories: tuple[Path, ...]) -> Iterator[JsonObject]:
    """Every object in the ``*.yaml``/``*.yml`` files of ``directories`` (sorted by file name)."""
    for directory in directories:
        files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
        for path in files:
            for document in yaml.safe_load_all(path.read_text()):
                if not document:
                    continue
                if document.get("kind", "").endswith("List") and "items" in document:
                    yield from document["items"]
                else:
                    yield document


def _apply_manifests(admin: Kube, manifests: Iterable[JsonObject]) -> None:
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BGP_NAMESPACE}})
    crds = []
    for manifest in manifests:
        log.info("applying %s %s", manifest["kind"], manifest["metadata"]["name"])
        admin.apply(manifest)
        if manifest["kind"] == "CustomResourceDefinition":
            crds.append(manifest["metadata"]["name"])
    for name in crds:
        wait_until(
            f"CRD {name} Established", functools.partial(crd_established, admin, name),
            pace().starts(BOOTSTRAP_STARTS)
        )


def _wait_default_service_account(admin: Kube) -> None:
    # Pod admission rejects Pods until the controller manager has made this; it also shows
    # that the controllers run with their own ServiceAccount credentials.
    wait_until(
        "the default ServiceAccount",
        lambda: admin.get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
        pace().starts(BOOTSTRAP_STARTS),
    )


def _mint_plugin_token(admin: Kube) -> str:
    namespace, name = PLUGIN_SERVICE_ACCOUNT
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": PLUGIN_TOKEN_SECONDS},
    }
    answer = admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
    token: str = answer["status"]["token"]
    return token


def _wait_plugin_authorized(server: str, pki: Pki, token: str) -> None:
    # RBAC objects reach the authorizer through an informer; wait until the binding is live.
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "namespace": BGP_NAMESPACE,
                "verb": "create",
                "group": "network.datumapis.com",
                "resource": "bgpadvertisements",
            }
        },
    }

    with Kube.with_token(server, pki.ca_cert, token) as plugin:

        def allowed() -> bool:
            answer = plugin.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
            return bool(answer.get("status", {}).get("allowed"))

        wait_until("the plugin's RBAC binding to take effect", allowed,
                   pace().starts(BOOTSTRAP_STARTS))
