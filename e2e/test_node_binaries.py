"""The node binaries built from Go modules are the pinned upstream versions, and they run.

Each version is checked against the wrapper module's go.mod, so a re-pin needs no test edit;
the build options (cgo, tags, version stamps) are checked on a tiny offline module.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.cluster import build

RUN_TIMEOUT = 30  # seconds, each version command


@pytest.fixture(scope="module")
def node_binaries() -> dict[str, Path]:
    """The node binaries; the first run builds kubelet, containerd and runc (minutes)."""
    return build.ensure_node_built()


def output_of(binary: Path, *args: str) -> str:
    """stdout of ``binary args`` (it must exit 0); stderr goes into the failure message."""
    result = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )
    assert result.returncode == 0, f"{binary.name} {' '.join(args)}: {result.stderr}"
    return result.stdout


def test_ensure_node_built_returns_every_node_binary_from_its_versioned_cache(
    node_binaries: dict[str, Path],
) -> None:
    assert set(node_binaries) == {
        "kubelet",
        "kube-scheduler",
        "kubectl",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
    }
    expected_dirs = {
        "kubelet": f"k8s-{build.KUBERNETES.version}",
        "kube-scheduler": f"k8s-{build.KUBERNETES.version}",
        "kubectl": f"k8s-{build.KUBERNETES.version}",
        "containerd": f"containerd-{build.CONTAINERD.version}",
        "containerd-shim-runc-v2": f"containerd-{build.CONTAINERD.version}",
        "ctr": f"containerd-{build.CONTAINERD.version}",
        "runc": f"runc-{build.RUNC.version}",
    }
    for name, path in node_binaries.items():
        assert path.parent == build.cache_root() / expected_dirs[name]
        assert path.name == name
        assert path.is_file()


def test_ensure_all_built_includes_the_control_plane_and_the_node(
    node_binaries: dict[str, Path],
) -> None:
    everything = build.ensure_all_built()

    assert {"etcd", "kube-apiserver", "kube-controller-manager"} <= set(everything)
    assert everything.items() >= node_binaries.items()


@pytest.mark.parametrize("name", ["kubelet", "kube-scheduler"])
def test_kubernetes_node_binary_reports_the_pinned_version(
    node_binaries: dict[str, Path], name: str
) -> None:
    assert output_of(node_binaries[name], "--version") == f"Kubernetes {build.KUBERNETES.version}\n"


def test_kubectl_reports_the_pinned_client_version_and_has_kustomize(
    node_binaries: dict[str, Path],
) -> None:
    version = json.loads(output_of(node_binaries["kubectl"], "version", "--client", "-o", "json"))

    assert version["clientVersion"]["gitVersion"] == build.KUBERNETES.version
    assert version["kustomizeVersion"].startswith("v5.")


def test_kubectl_kustomize_renders_a_kustomization(
    node_binaries: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "serviceaccount.yaml").write_text(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: agent\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "namespace: demo\n"
        "namePrefix: vpa-\n"
        "labels:\n"
        "- pairs:\n"
        "    app.kubernetes.io/part-of: vpc-attach\n"
        "resources:\n"
        "- serviceaccount.yaml\n"
        "configMapGenerator:\n"
        "- name: settings\n"
        "  literals:\n"
        "  - mode=test\n"
    )

    rendered = list(
        yaml.safe_load_all(output_of(node_binaries["kubectl"], "kustomize", str(tmp_path)))
    )

    by_kind = {document["kind"]: document for document in rendered}
    assert set(by_kind) == {"ServiceAccount", "ConfigMap"}
    assert by_kind["ServiceAccount"]["metadata"]["name"] == "vpa-agent"
    config_map = by_kind["ConfigMap"]
    assert config_map["data"] == {"mode": "test"}
    # The generator appends a content hash: "vpa-settings-<hash>".
    assert config_map["metadata"]["name"].startswith("vpa-settings-")
    assert len(config_map["metadata"]["name"]) > len("vpa-settings-")
    for document in rendered:
        assert document["metadata"]["namespace"] == "demo"
        assert document["metadata"]["labels"] == {"app.kubernetes.io/part-of": "vpc-attach"}


def test_containerd_and_ctr_report_the_pinned_version(node_binaries: dict[str, Path]) -> None:
    version = build.CONTAINERD.version
    module = build.CONTAINERD.upstream_module

    assert output_of(node_binaries["containerd"], "--version").split() == [
        "containerd",
        module,
        version,
    ]
    assert output_of(node_binaries["ctr"], "--version").split() == ["ctr", module, version]
    shim_lines = output_of(node_binaries["containerd-shim-runc-v2"], "-v").splitlines()
    assert f"  Version:  {version}" in shim_lines


def test_runc_reports_the_pinned_version_and_seccomp_support(
    node_binaries: dict[str, Path],
) -> None:
    lines = output_of(node_binaries["runc"], "--version").splitlines()
    features = json.loads(output_of(node_binaries["runc"], "features"))

    assert lines[0] == f"runc version {build.RUNC.version.removeprefix('v')}"
    assert any(line.startswith("libseccomp: 2.") for line in lines), lines
    assert features["linux"]["seccomp"]["enabled"] is True
    assert "SCMP_ACT_ERRNO" in features["linux"]["seccomp"]["actions"]


# The per-component build options, exercised with a tiny offline Go module. ---------------

OPTIONS_MAIN = """package main

var version = "unstamped"
var greeting = "no tag"
var cgo = "cgo off"

func main() { println(version, greeting, cgo) }
"""
OPTIONS_TAGGED = '//go:build greet\n\npackage main\n\nfunc init() { greeting = "tagged" }\n'
OPTIONS_CGO = '//go:build cgo\n\npackage main\n\nfunc init() { cgo = "cgo on" }\n'


def options_component(tmp_path: Path, **options: Any) -> build.GoComponent:
    """A wrapper requiring example.invalid/options v1.2.3 (a local dir), built with ``options``."""
    module_dir = tmp_path / "wrapper"
    source_dir = module_dir / "options"
    source_dir.mkdir(parents=True)
    (source_dir / "go.mod").write_text("module example.invalid/options\n\ngo 1.22\n")
    (source_dir / "main.go").write_text(OPTIONS_MAIN)
    (source_dir / "tagged.go").write_text(OPTIONS_TAGGED)
    (source_dir / "cgo.go").write_text(OPTIONS_CGO)
    (module_dir / "go.mod").write_text(
        "module example.invalid/wrapper\n\ngo 1.22\n\n"
        "require example.invalid/options v1.2.3\n\n"
        "replace example.invalid/options => ./options\n"
    )
    return build.GoComponent(
        name="options",
        module_dir=module_dir,
        upstream_module="example.invalid/options",
        packages={"options": "example.invalid/options"},
        **options,
    )


def test_build_passes_cgo_tags_and_version_stamp_of_the_component(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VPC_ATTACH_CACHE", str(tmp_path / "cache"))
    component = options_component(
        tmp_path,
        cgo=True,
        tags=("greet",),
        version_ldflags=lambda version: [f"-X main.version={version}"],
    )

    built = build.ensure_built(component)

    result = subprocess.run(
        [built / "options"], capture_output=True, text=True, timeout=RUN_TIMEOUT, check=True
    )
    assert result.stderr == "v1.2.3 tagged cgo on\n"


def test_build_defaults_to_static_untagged_unstamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VPC_ATTACH_CACHE", str(tmp_path / "cache"))
    component = options_component(tmp_path)

    built = build.ensure_built(component)

    result = subprocess.run(
        [built / "options"], capture_output=True, text=True, timeout=RUN_TIMEOUT, check=True
    )
    assert result.stderr == "unstamped no tag cgo off\n"
