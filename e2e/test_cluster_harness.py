"""The local control plane is real: RBAC, CRD validation and the garbage collector all work.

One cluster is started through the CLI for the module (proving the CLI contract); the test of
``down`` starts its own through the Python API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.harness.cluster import BGP_NAMESPACE, BuildError, Cluster, build, processes
from e2e.harness.wait import wait_until

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION = "network.datumapis.com", "v1alpha1"
REQUEST_TIMEOUT = 10  # seconds, every API call
BUILD_AND_UP_TIMEOUT = 3600  # the first run builds kube-apiserver from source
GC_TIMEOUT = 60.0


def run_cli(*args: str, timeout: float, module: str = "e2e.harness.cluster"
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A control plane started with ``python -m e2e.harness.cluster up``; yields its JSON line."""
    state_dir = tmp_path_factory.mktemp("cluster") / "state"
    up = run_cli("up", "--state-dir", str(state_dir), timeout=BUILD_AND_UP_TIMEOUT)
    try:
        assert up.returncode == 0, up.stderr
        lines = up.stdout.splitlines()
        assert len(lines) == 1, f"stdout must be exactly one JSON line, got {up.stdout!r}"
        paths: dict[str, str] = json.loads(lines[0])
        assert set(paths) == {"admin_kubeconfig", "plugin_kubeconfig"}
        yield paths
    finally:
        down = run_cli("down", "--state-dir", str(state_dir), timeout=120)
        assert down.returncode == 0, down.stderr
        assert not state_dir.exists()


def test_the_former_module_path_still_starts_and_stops_a_control_plane(tmp_path: Path) -> None:
    """`python -m e2e.cluster` (the path before the harness moved; outside tests use it)."""
    state_dir = tmp_path / "state"
    up = run_cli("up", "--state-dir", str(state_dir), timeout=BUILD_AND_UP_TIMEOUT,
                 module="e2e.cluster")
    try:
        assert up.returncode == 0, up.stderr
        paths = json.loads(up.stdout)
        assert set(paths) == {"admin_kubeconfig", "plugin_kubeconfig"}
        version = client.VersionApi(new_client(paths["admin_kubeconfig"])).get_code(
            _request_timeout=REQUEST_TIMEOUT)
        assert version.major == "1", version
    finally:
        down = run_cli("down", "--state-dir", str(state_dir), timeout=120, module="e2e.cluster")
    assert down.returncode == 0, down.stderr
    assert not state_dir.exists()


@pytest.fixture(scope="module")
def admin(cli_cluster: dict[str, str]) -> client.ApiClient:
    return new_client(cli_cluster["admin_kubeconfig"])


@pytest.fixture(scope="module")
def plugin(cli_cluster: dict[str, str]) -> client.ApiClient:
    return new_client(cli_cluster["plugin_kubeconfig"])


def new_client(kubeconfig: str) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return api


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount, which Pod admission needs)."""
    core = client.CoreV1Api(admin)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name)),
        _request_timeout=REQUEST_TIMEOUT,
    )
    wait_until(
        "default ServiceAccount",
        lambda: exists(
            lambda: core.read_namespaced_service_account(
                "default", name, _request_timeout=REQUEST_TIMEOUT
            )
        ),
        timeout=30,
    )
    yield name
    core.delete_namespace(name, _request_timeout=REQUEST_TIMEOUT)


def exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def advertisement(name: str, prefixes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BGPAdvertisement",
        "metadata": {"name": name, "namespace": BGP_NAMESPACE},
        "spec": {
            "routerRef": {"name": "worker-1"},
            "addressFamily": {"afi": "l2vpn", "safi": "evpn"},
            "prefixes": prefixes,
            "communities": ["4294967295:4294967295"],
            "vrfID": 1,
            "function": "End.DT46",
        },
    }


def vrf_instance(name: str, route_target: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BGPVRFInstance",
        "metadata": {"name": name, "namespace": BGP_NAMESPACE},
        "spec": {
            "routerRef": {"name": "worker-1"},
            "vrfID": 4095,
            "importRouteTargets": [{"value": route_target}],
            "exportRouteTargets": [{"value": route_target}],
        },
    }


def create_custom(api: client.ApiClient, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    created = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, BGP_NAMESPACE, plural, body, _request_timeout=REQUEST_TIMEOUT
    )
    assert isinstance(created, dict)
    return created


def delete_custom(api: client.ApiClient, plural: str, name: str) -> None:
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        GROUP, VERSION, BGP_NAMESPACE, plural, name, _request_timeout=REQUEST_TIMEOUT
    )


def test_plugin_kubeconfig_can_create_bgp_advertisement(plugin: client.ApiClient) -> None:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    created = create_custom(
        plugin, "bgpadvertisements", advertisement(name, ["fd00:10::/96", "10.0.0.7/32"])
    )
    try:
        assert created["metadata"]["namespace"] == BGP_NAMESPACE
        assert sorted(created["spec"]["prefixes"]) == ["10.0.0.7/32", "fd00:10::/96"]
    finally:
        delete_custom(plugin, "bgpadvertisements", name)


def test_plugin_kubeconfig_cannot_list_secrets(plugin: client.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        client.CoreV1Api(plugin).list_namespaced_secret(
            "kube-system", _request_timeout=REQUEST_TIMEOUT
        )
    assert caught.value.status == 403
    assert "system:serviceaccount:kube-system:vpc-attach" in str(caught.value.body)


def test_plugin_kubeconfig_authenticates_as_the_service_account_only(
    cli_cluster: dict[str, str],
) -> None:
    kubeconfig = Path(cli_cluster["plugin_kubeconfig"]).read_text()
    assert "client-certificate" not in kubeconfig and "client-key" not in kubeconfig
    assert (
        "certificate-authority-data" in kubeconfig and "insecure-skip-tls-verify" not in kubeconfig
    )


def test_route_target_accepts_every_32_bit_value(plugin: client.ApiClient) -> None:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    created = create_custom(plugin, "bgpvrfinstances", vrf_instance(name, "4294967295:4294967295"))
    try:
        assert created["spec"]["importRouteTargets"] == [{"value": "4294967295:4294967295"}]
    finally:
        delete_custom(plugin, "bgpvrfinstances", name)


def test_route_target_beyond_32_bits_is_rejected(plugin: client.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        create_custom(
            plugin,
            "bgpvrfinstances",
            vrf_instance(f"e2e-{uuid.uuid4().hex[:8]}", "65000:4294967296"),
        )
    assert caught.value.status == 422


def test_advertisement_with_empty_prefixes_is_rejected(plugin: client.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        create_custom(plugin, "bgpadvertisements", advertisement(f"e2e-{uuid.uuid4().hex[:8]}", []))
    assert caught.value.status == 422
    assert "prefixes" in str(caught.value.body)


def test_advertisement_prefixes_are_a_set(plugin: client.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        create_custom(
            plugin,
            "bgpadvertisements",
            advertisement(f"e2e-{uuid.uuid4().hex[:8]}", ["fd00::/64", "fd00::/64"]),
        )
    assert caught.value.status == 422
    assert "Duplicate value" in str(caught.value.body)


# (group, resource, verb) the plugin needs (SPEC §6 RBAC) and a sample of what it must not get.
ALLOWED = [
    *[(GROUP, "bgprouters", verb) for verb in ("get", "list", "watch")],
    *[
        (GROUP, resource, verb)
        for resource in ("bgpvrfinstances", "bgpadvertisements")
        for verb in ("get", "list", "create", "update", "patch", "delete")
    ],
    *[
        ("discovery.k8s.io", "endpointslices", verb)
        for verb in ("get", "list", "create", "update", "patch", "delete")
    ],
    *[("", "pods", verb) for verb in ("get", "list", "watch")],
    *[("vpc-attach.datum.net", "ipamblocks", verb) for verb in ("get", "list", "create", "delete")],
    ("", "nodes", "get"),  # a cluster pool's IPAMBlock is owned by its Node (SPEC §6)
    *[("k8s.cni.cncf.io", "ipamclaims", verb) for verb in ("get", "list", "watch")],
    ("k8s.cni.cncf.io", "ipamclaims/status", "update"),  # SPEC §16
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
    # Policy inside a VPC (SPEC §17): the agent follows policies, the networks they are for and
    # the peers vpc-attach's own EndpointSlices name.
    ("discovery.k8s.io", "endpointslices", "watch"),
    *[(group, resource, verb)
      for group, resource in (("k8s.cni.cncf.io", "multi-networkpolicies"),
                              ("k8s.cni.cncf.io", "network-attachment-definitions"),
                              ("networking.k8s.io", "networkpolicies"))
      for verb in ("get", "list", "watch")],
]
DENIED = [
    (GROUP, "bgprouters", "create"),
    (GROUP, "bgprouters", "update"),
    (GROUP, "bgpadvertisements", "watch"),
    (GROUP, "bgpadvertisements", "deletecollection"),
    ("", "pods", "create"),
    ("", "pods", "delete"),
    ("", "secrets", "get"),
    ("", "nodes", "list"),
    ("vpc-attach.datum.net", "ipamblocks", "update"),
    *[("k8s.cni.cncf.io", "ipamclaims", verb)
      for verb in ("create", "update", "patch", "delete")],  # kubevirt's, not ours
    ("k8s.cni.cncf.io", "ipamclaims/status", "patch"),
    ("", "serviceaccounts", "create"),
    ("", "serviceaccounts/token", "create"),  # the installer's account asks for the host's token
    *[(group, resource, verb)  # policies and networks are the tenants', read only
      for group, resource in (("k8s.cni.cncf.io", "multi-networkpolicies"),
                              ("k8s.cni.cncf.io", "network-attachment-definitions"),
                              ("networking.k8s.io", "networkpolicies"))
      for verb in ("create", "update", "patch", "delete")],
]


def plugin_may(plugin: client.ApiClient, group: str, resource: str, verb: str) -> bool:
    resource, _, subresource = resource.partition("/")
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                group=group, resource=resource, subresource=subresource or None, verb=verb,
                namespace=BGP_NAMESPACE,
            )
        )
    )
    answer = client.AuthorizationV1Api(plugin).create_self_subject_access_review(
        review, _request_timeout=REQUEST_TIMEOUT
    )
    assert answer.status is not None
    return bool(answer.status.allowed)


def test_plugin_has_exactly_the_permissions_of_the_spec(plugin: client.ApiClient) -> None:
    missing = [rule for rule in ALLOWED if not plugin_may(plugin, *rule)]
    excess = [rule for rule in DENIED if plugin_may(plugin, *rule)]
    assert (missing, excess) == ([], [])


def test_plugin_reads_bgp_routers_but_cannot_write_them(
    admin: client.ApiClient, plugin: client.ApiClient
) -> None:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    router = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BGPRouter",
        "metadata": {"name": name, "namespace": BGP_NAMESPACE},
        "spec": {
            "targetRef": {"kind": "Node", "name": name},
            "localASN": 4294967295,
            "routerID": "192.0.2.1",
            "roles": ["tenant"],
            "addressFamilies": [{"afi": "l2vpn", "safi": "evpn"}],
            "srv6Locator": "2001:db8:ff01::/48",
            "nodeID": 1,
        },
    }
    create_custom(admin, "bgprouters", router)
    try:
        read = client.CustomObjectsApi(plugin).get_namespaced_custom_object(
            GROUP, VERSION, BGP_NAMESPACE, "bgprouters", name, _request_timeout=REQUEST_TIMEOUT
        )
        assert isinstance(read, dict)
        assert read["spec"]["srv6Locator"] == "2001:db8:ff01::/48"
        with pytest.raises(ApiException) as caught:
            create_custom(plugin, "bgprouters", {**router, "metadata": {"name": name + "-x"}})
        assert caught.value.status == 403
    finally:
        delete_custom(admin, "bgprouters", name)


def test_endpointslice_owned_by_pod_is_garbage_collected(
    admin: client.ApiClient, plugin: client.ApiClient, namespace: str
) -> None:
    pod = client.CoreV1Api(admin).create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="workload"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="pause")]),
        ),
        _request_timeout=REQUEST_TIMEOUT,
    )
    # The plugin identity itself reads the Pod and writes the owned slice, as in ADD.
    seen = client.CoreV1Api(plugin).read_namespaced_pod(
        "workload", namespace, _request_timeout=REQUEST_TIMEOUT
    )
    assert pod.metadata is not None and seen.metadata is not None
    uid = seen.metadata.uid
    assert uid is not None and uid == pod.metadata.uid
    discovery = client.DiscoveryV1Api(plugin)
    discovery.create_namespaced_endpoint_slice(
        namespace,
        client.V1EndpointSlice(
            metadata=client.V1ObjectMeta(
                name="workload-vpc",
                labels={"endpointslice.kubernetes.io/managed-by": "vpc-attach"},
                owner_references=[
                    client.V1OwnerReference(api_version="v1", kind="Pod", name="workload", uid=uid)
                ],
            ),
            address_type="IPv6",
            endpoints=[client.V1Endpoint(addresses=["fd00:10::7"])],
        ),
        _request_timeout=REQUEST_TIMEOUT,
    )

    client.CoreV1Api(admin).delete_namespaced_pod(
        "workload", namespace, _request_timeout=REQUEST_TIMEOUT
    )

    wait_until(
        "the garbage collector to delete the Pod's EndpointSlice",
        lambda: (
            not exists(
                lambda: discovery.read_namespaced_endpoint_slice(
                    "workload-vpc", namespace, _request_timeout=REQUEST_TIMEOUT
                )
            )
        ),
        timeout=GC_TIMEOUT,
    )


def test_down_stops_processes_and_removes_state_dir(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    cluster = Cluster.up(state_dir)
    try:
        pids = cluster.pids()
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}
        assert all(Path(f"/proc/{pid}").exists() for pid in pids.values())
        assert cluster.startup_seconds < 60, f"startup took {cluster.startup_seconds} s"
    finally:
        down = run_cli("down", "--state-dir", str(state_dir), timeout=120)
        cluster.down()  # already down: only reaps our child processes
    assert down.returncode == 0, down.stderr
    assert not state_dir.exists()
    for name, pid in pids.items():
        assert not process_alive(pid), f"{name} (pid {pid}) still running"


def test_two_clusters_run_side_by_side_and_down_touches_only_its_own(tmp_path: Path) -> None:
    first = Cluster.up(tmp_path / "first")
    try:
        second = Cluster.up(tmp_path / "second")
        try:
            assert first.server != second.server
            second_pids = second.pids()
        finally:
            second.down()
        assert not (tmp_path / "second").exists()
        assert all(not process_alive(pid) for pid in second_pids.values())
        assert all(process_alive(pid) for pid in first.pids().values())
        with first.admin() as admin:
            assert admin.get_text("/readyz")[0] == 200
    finally:
        first.down()


def test_down_refuses_a_directory_it_did_not_create(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not ours")
    down = run_cli("down", "--state-dir", str(foreign), timeout=60)
    assert down.returncode != 0
    assert (foreign / "keep.txt").read_text() == "not ours"


def test_stop_escalates_to_sigkill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "STOP_GRACE_S", 0.5)
    ready = tmp_path / "stubborn.ready"
    stubborn = processes.start(
        "stubborn",
        ["sh", "-c", "trap '' TERM; : > \"$0.ready\"; while :; do sleep 0.1; done",
         f"{tmp_path}/stubborn"],
        tmp_path,
    )
    wait_until("sh to ignore SIGTERM", ready.exists, 10)  # the trap is set before the file

    processes.stop("stubborn", tmp_path, stubborn.popen)

    assert stubborn.popen is not None and stubborn.popen.returncode == -9
    assert not processes.pid_file(tmp_path, "stubborn").exists()


def test_stop_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    foreign = subprocess.Popen(["sleep", "30"])
    try:
        processes.pid_file(tmp_path, "foreign").parent.mkdir(parents=True)
        processes.pid_file(tmp_path, "foreign").write_text(f"{foreign.pid}\n")

        processes.stop("foreign", tmp_path)

        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait(timeout=10)


def process_alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (a zombie is dead, merely not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# The binary cache, exercised with a tiny offline Go module instead of Kubernetes. ----------


def fake_component(tmp_path: Path, source: str, **more: str) -> build.GoComponent:
    """A wrapper module requiring example.invalid/hello v1.0.0 (replaced by a local dir): the
    program ``hello`` of ``source`` and one more per keyword (name=source, a package below)."""
    module_dir = tmp_path / "wrapper"
    hello = module_dir / "hello"
    hello.mkdir(parents=True)
    (hello / "go.mod").write_text("module example.invalid/hello\n\ngo 1.22\n")
    (hello / "main.go").write_text(source)
    for name, program in more.items():
        (hello / name).mkdir()
        (hello / name / "main.go").write_text(program)
    (module_dir / "go.mod").write_text(
        "module example.invalid/wrapper\n\ngo 1.22\n\n"
        "require example.invalid/hello v1.0.0\n\n"
        "replace example.invalid/hello => ./hello\n"
    )
    return build.GoComponent(
        name="hello",
        module_dir=module_dir,
        upstream_module="example.invalid/hello",
        packages={"hello": "example.invalid/hello",
                  **{name: f"example.invalid/hello/{name}" for name in more}},
    )


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty binary cache of this test's own (VPC_ATTACH_CACHE)."""
    monkeypatch.setenv("VPC_ATTACH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


HELLO = 'package main\n\nfunc main() { println("hello") }\n'


def test_build_fills_the_cache_atomically_and_reuses_it(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    component = fake_component(tmp_path, HELLO)
    interrupted = cache / ".hello-v1.0.0.build-leftover"
    interrupted.mkdir(parents=True)

    built = build.ensure_built(component)

    assert built == cache / "hello-v1.0.0"
    assert (
        subprocess.run([built / "hello"], capture_output=True, text=True, timeout=10).stderr
        == "hello\n"
    )
    assert json.loads((built / "BUILD-INFO.json").read_text())["version"] == "v1.0.0"
    assert not interrupted.exists()
    assert sorted(p.name for p in cache.iterdir()) == [".hello-v1.0.0.lock", "hello-v1.0.0"]
    monkeypatch.setenv("PATH", "")  # a cache hit must not need go at all
    assert build.ensure_built(component) == built


def test_a_build_of_some_binaries_leaves_the_others_to_a_later_build_beside_them(
    tmp_path: Path, cache: Path
) -> None:
    # As the demo's control plane (kube-apiserver, kube-controller-manager) and then a node
    # (kubelet, ...) build the binaries of one Kubernetes version.
    bye = 'package main\n\nfunc main() { println("bye") }\n'
    component = fake_component(tmp_path, HELLO, bye=bye)

    built = build.ensure_built(component, ["hello", "not-ours"])

    assert sorted(p.name for p in built.iterdir()) == ["BUILD-INFO.json", "hello"]
    assert build.is_cached(component, ["hello"]) and not build.is_cached(component)
    first = (built / "hello").stat()
    assert build.ensure_built(component) == built
    assert sorted(p.name for p in built.iterdir()) == ["BUILD-INFO.json", "bye", "hello"]
    assert (built / "hello").stat().st_ino == first.st_ino  # not rebuilt
    assert (
        subprocess.run([built / "bye"], capture_output=True, text=True, timeout=10).stderr
        == "bye\n"
    )
    info = json.loads((built / "BUILD-INFO.json").read_text())
    assert [b["binaries"] for b in info["builds"]] == [["hello"], ["bye"]]
    assert sorted(p.name for p in cache.iterdir()) == [".hello-v1.0.0.lock", "hello-v1.0.0"]


def test_failed_build_leaves_no_cache_entry(tmp_path: Path, cache: Path) -> None:
    component = fake_component(tmp_path, "package main\n\nfunc main() { undefined() }\n")

    with pytest.raises(BuildError, match="undefined: undefined"):
        build.ensure_built(component)

    assert [p.name for p in cache.iterdir()] == [".hello-v1.0.0.lock"]
