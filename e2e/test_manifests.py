"""Every manifest in packaging/ is accepted by a real API server (server-side dry-run), and the
pieces agree with each other and with the code: the DaemonSet runs as the ServiceAccount the
ClusterRoleBinding binds, installs with `vpc-attach install`, serves with `vpc-attach agent`,
and the example networks are configs the plugin accepts.

Dry-run runs defaulting, schema/CEL validation and admission, and persists nothing. Objects
the cluster fixture already applied (CRDs, RBAC) are dry-run server-side applied; the others
are dry-run created. The NetworkAttachmentDefinition CRD is Multus's, so this module applies a
copy of it for real (and removes it again) before the example NADs can be checked.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.cluster.cluster import load_manifests
from e2e.harness.kube import ApiError, Kube, crd_established
from e2e.harness.wait import wait_until
from netconf.config import parse_netconf
from netconf.host import DEFAULT_AGENT_SOCKET, DEFAULT_HOST_CONFIG, DEFAULT_LOCK_DIR

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGING = REPO_ROOT / "packaging"
MANIFEST_DIRS = tuple(PACKAGING / d for d in ("crds", "rbac", "daemonset", "examples"))
NAD_CRD = Path(__file__).parent / "fixtures" / "network-attachment-definitions.crd.yaml"
NAD_CRD_NAME = "network-attachment-definitions.k8s.cni.cncf.io"
FIELD_MANAGER = "vpc-attach-manifest-test"


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for directory in MANIFEST_DIRS:
        for manifest in load_manifests((directory,)):
            label = f"{directory.name}/{manifest['kind']}/{manifest['metadata']['name']}"
            found.append((label, manifest))
    return found


MANIFESTS = _manifests()


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [m for _, m in MANIFESTS
               if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''} in packaging/, found {matches}"
    return matches[0]


def _container(pod_spec: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    return next(c for c in pod_spec.get(section) or [] if c["name"] == name)


@pytest.fixture(scope="module")
def nad_crd(kube: Kube) -> Iterator[None]:
    """The Multus NetworkAttachmentDefinition CRD, applied for real, removed afterwards."""
    crd = yaml.safe_load(NAD_CRD.read_text())
    existed = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{NAD_CRD_NAME}")
    kube.apply(crd)
    probe = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
             "metadata": {"name": "probe"}}
    wait_until("the NetworkAttachmentDefinition CRD to be established and served",
               lambda: crd_established(kube, NAD_CRD_NAME) and bool(kube.object_path(probe)),
               60)
    yield
    if existed is None:
        kube.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{NAD_CRD_NAME}")


def dry_run(kube: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    """Server-side dry-run: create when absent, server-side apply when the object exists."""
    path = kube.object_path(manifest)
    if kube.get(path) is None:
        return kube.create(path.rsplit("/", 1)[0], manifest, dry_run=True)
    return kube.apply(manifest, dry_run=True, field_manager=FIELD_MANAGER)


@pytest.mark.parametrize("manifest", [m for _, m in MANIFESTS], ids=[i for i, _ in MANIFESTS])
def test_manifest_passes_server_side_dry_run(kube: Kube, nad_crd: None,
                                             manifest: dict[str, Any]) -> None:
    existed = kube.get(kube.object_path(manifest)) is not None  # the cluster applies packaging/rbac
    try:
        answer = dry_run(kube, manifest)
    except ApiError as exc:
        if "privileged: Forbidden: disallowed by cluster policy" in exc.message:
            pytest.fail("the control plane refuses privileged Pods: its kube-apiserver needs "
                        "--allow-privileged=true, as in every cluster that runs CNI "
                        f"DaemonSets (e2e/harness/cluster/cluster.py): {exc.message}")
        raise
    assert answer["kind"] == manifest["kind"]
    assert answer["metadata"]["name"] == manifest["metadata"]["name"]
    # Dry-run persisted nothing new (objects that existed before may of course still exist).
    if not existed:
        assert kube.get(kube.object_path(manifest)) is None


def test_dry_run_rejects_a_broken_daemonset(kube: Kube) -> None:
    """The dry-run really validates: a DaemonSet whose selector misses its labels is refused."""
    broken = copy.deepcopy(_one("DaemonSet", "vpc-attach"))
    broken["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "something-else"}
    with pytest.raises(ApiError) as refused:
        dry_run(kube, broken)
    assert refused.value.status == 422
    assert "selector" in refused.value.message, refused.value.message


def test_packaging_contains_what_the_deployment_needs() -> None:
    kinds = {(m["kind"], m["metadata"]["name"]) for _, m in MANIFESTS}
    for needed in [("ServiceAccount", "vpc-attach"), ("ClusterRole", "vpc-attach"),
                   ("ServiceAccount", "vpc-attach-installer"), ("Role", "vpc-attach-installer"),
                   ("ClusterRoleBinding", "vpc-attach"), ("DaemonSet", "vpc-attach"),
                   ("CustomResourceDefinition", "bgprouters.network.datumapis.com"),
                   ("CustomResourceDefinition", "bgpvrfinstances.network.datumapis.com"),
                   ("CustomResourceDefinition", "bgpadvertisements.network.datumapis.com")]:
        assert needed in kinds, f"{needed} is missing from packaging/"
    nads = [m for _, m in MANIFESTS if m["kind"] == "NetworkAttachmentDefinition"]
    attachments = {_vpc_attach_stanza(n).attachment for n in nads}
    assert {"veth", "tap"} <= attachments


def test_daemonset_runs_as_the_installer_that_may_only_ask_for_the_plugins_token() -> None:
    daemonset = _one("DaemonSet", "vpc-attach")
    plugin = _one("ServiceAccount", "vpc-attach")
    binding = _one("ClusterRoleBinding", "vpc-attach")
    role = _one("ClusterRole", binding["roleRef"]["name"])
    pod = daemonset["spec"]["template"]["spec"]
    namespace = daemonset["metadata"]["namespace"]
    assert namespace == plugin["metadata"]["namespace"] == "kube-system"
    assert {"kind": "ServiceAccount", "name": "vpc-attach", "namespace": namespace} in \
        binding["subjects"]
    assert binding["roleRef"]["kind"] == "ClusterRole" and role is not None
    # The Pod runs as the installer, whose only right is a token of the plugin's account (for
    # the host, bound to the Node); the plugin's account cannot mint tokens itself.
    installer = _one("ServiceAccount", pod["serviceAccountName"])
    assert installer["metadata"]["name"] != "vpc-attach"
    granted = _one("RoleBinding", "vpc-attach-installer")
    assert granted["subjects"] == [{"kind": "ServiceAccount", "namespace": namespace,
                                    "name": installer["metadata"]["name"]}]
    rules = _one("Role", granted["roleRef"]["name"])["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                      "resourceNames": ["vpc-attach"], "verbs": ["create"]}]
    assert not any("serviceaccounts/token" in rule.get("resources", [])
                   for rule in role["rules"])
    assert pod.get("automountServiceAccountToken", True), "the installer needs the token"
    install = _installer_args(_container(pod, "initContainers", "install"))
    assert install.plugin_service_account == plugin["metadata"]["name"]


def _installer_args(container: dict[str, Any]) -> Any:
    """The container's `vpc-attach install` arguments, parsed by the installer's own parser."""
    from cni_plugin.install.cli import _parser
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[:2] == ["vpc-attach", "install"], argv
    return _parser("install").parse_args(argv[2:])


def _host_dirs_written(args: Any) -> set[str]:
    written = {args.host_config, args.manifest}
    if not args.no_binaries:
        written.add(args.cni_bin_dir + "/x")
    if not args.no_kubeconfig:
        written |= {args.kubeconfig, args.token_file}
    if args.conflist:
        written.add(args.cni_conf_dir + "/x")
    return {str(Path(path).parent) for path in written}


def test_daemonset_installs_then_runs_the_agent() -> None:
    pod = _one("DaemonSet", "vpc-attach")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["install"]
    agent = _container(pod, "containers", "agent")
    assert [*agent.get("command", []), *agent.get("args", [])][:2] == ["vpc-attach", "agent"]
    install = _installer_args(_container(pod, "initContainers", "install"))
    assert not install.watch and not install.no_binaries and not install.no_kubeconfig
    refresh = _installer_args(_container(pod, "containers", "refresh-token"))
    assert refresh.watch, "the token copy on the host must be refreshed"
    assert (refresh.host_config, refresh.kubeconfig, refresh.token_file, refresh.manifest) == \
        (install.host_config, install.kubeconfig, install.token_file, install.manifest)


@pytest.mark.parametrize("name", ["install", "refresh-token"])
def test_installer_writes_only_into_mounted_host_dirs(name: str) -> None:
    """Everything `install` writes lands below --root in a mounted host dir, not in the
    container's own filesystem (where it would vanish with the Pod)."""
    pod = _one("DaemonSet", "vpc-attach")["spec"]["template"]["spec"]
    container = next(c for c in [*pod["initContainers"], *pod["containers"]]
                     if c["name"] == name)
    args = _installer_args(container)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    root = args.root.rstrip("/")
    for directory in _host_dirs_written(args):
        volume = mounts.get(root + directory)
        assert volume is not None, f"{name}: {root}{directory} is not mounted"
        assert volume["hostPath"]["path"] == directory, f"{name}: {root}{directory}"
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_agent_sees_host_paths_where_the_host_does() -> None:
    """Requests name host paths; the agent must find each at the same path, so that it and
    the executable's in-process fallback act on the same files."""
    from cni_plugin.install.cli import DEFAULT_KUBECONFIG, DEFAULT_LOG_FILE, DEFAULT_TOKEN_FILE
    from cni_plugin.ipam.plugin.config import DEFAULT_DATA_DIR

    pod = _one("DaemonSet", "vpc-attach")["spec"]["template"]["spec"]
    agent = _container(pod, "containers", "agent")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    host_paths = [DEFAULT_AGENT_SOCKET, DEFAULT_LOCK_DIR + "/x.lock", DEFAULT_HOST_CONFIG,
                  DEFAULT_KUBECONFIG, DEFAULT_TOKEN_FILE, DEFAULT_LOG_FILE,
                  DEFAULT_DATA_DIR + "/net/pool", "/var/lib/cni/networks/net/last_reserved_ip",
                  "/opt/cni/bin/host-local", "/var/run/netns/cni-1234"]
    for path in host_paths:
        mount = next((m for m in mounts if path.startswith(m + "/")), None)
        assert mount is not None, f"the agent does not see {path}"
        assert volumes[mounts[mount]["name"]]["hostPath"]["path"] == mount, \
            f"{mount} in the agent must be the host's {mount}"
    # Pod netns bind mounts are made after the agent started.
    assert mounts["/var/run/netns"]["mountPropagation"] in ("HostToContainer", "Bidirectional")
    assert pod["hostNetwork"] is True
    assert agent["securityContext"]["privileged"] is True


def test_agent_probes_and_metrics_use_the_declared_port() -> None:
    """The kubelet probes /healthz and /readyz where the agent serves them (SPEC §12): the port
    the container declares, on the Pod's IP (the node's: hostNetwork)."""
    from cni_plugin.agent.health import METRICS_ADDRESS_ENV, parse_address

    pod = _one("DaemonSet", "vpc-attach")["spec"]["template"]
    agent = _container(pod["spec"], "containers", "agent")
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    env = {e["name"]: e for e in agent["env"]}
    host, port = parse_address(env[METRICS_ADDRESS_ENV]["value"])
    assert host == "$(HOST_IP)" and port == ports["metrics"]
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])


def test_daemonset_runs_on_every_node_one_at_a_time() -> None:
    spec = _one("DaemonSet", "vpc-attach")["spec"]
    pod = spec["template"]["spec"]
    assert {"operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert container["resources"]["requests"] and container["resources"]["limits"], \
            container["name"]


def _vpc_attach_stanza(nad: dict[str, Any]) -> Any:
    config = json.loads(nad["spec"]["config"])
    plugins = config.get("plugins", [config])
    stanza = next(p for p in plugins if p["type"] == "vpc-attach")
    return parse_netconf({"cniVersion": config["cniVersion"], "name": config["name"], **stanza})


@pytest.mark.parametrize("nad", [m for _, m in MANIFESTS
                                 if m["kind"] == "NetworkAttachmentDefinition"],
                         ids=lambda m: m["metadata"]["name"])
def test_example_networks_are_configs_the_plugin_accepts(nad: dict[str, Any]) -> None:
    config = json.loads(nad["spec"]["config"])
    assert config["name"] == nad["metadata"]["name"]
    conf = _vpc_attach_stanza(nad)
    if conf.ipam is not None and conf.ipam["type"] == "vpc-attach-ipam":
        from cni_plugin.ipam.plugin.config import parse_network
        parse_network({"cniVersion": config["cniVersion"], "name": config["name"],
                       "ipam": conf.ipam})
