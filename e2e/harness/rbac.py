"""Another identity for the plugin: a ServiceAccount bound to the packaged ClusterRole less some
of its rules, with a token kubeconfig (what the plugin does where the API denies it)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.cluster.kubeconfig import write_token_kubeconfig
from e2e.harness.kube import Kube
from e2e.harness.wait import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_ROLE = REPO_ROOT / "packaging" / "rbac" / "clusterrole.yaml"
NAMESPACE = "kube-system"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
TOKEN_SECONDS = 3600


def _rules_without(drop: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The packaged ClusterRole's rules, less the (API group, resource) pairs in drop; a
    resource written `resource:verb` drops that verb of it only."""
    rules = []
    for rule in yaml.safe_load(CLUSTER_ROLE.read_text())["rules"]:
        for resource in rule["resources"]:
            dropped = _dropped_verbs(rule, resource, drop)
            verbs = [v for v in rule["verbs"] if v not in dropped]
            if verbs:
                rules.append({**rule, "resources": [resource], "verbs": verbs})
    return rules


def _dropped_verbs(rule: dict[str, Any], resource: str, drop: set[tuple[str, str]]) -> set[str]:
    dropped: set[str] = set()
    for group, entry in drop:
        name, _, verb = entry.partition(":")
        if group in rule["apiGroups"] and name == resource:
            dropped |= {verb} if verb else set(rule["verbs"])
    return dropped


@contextlib.contextmanager
def identity_without(kube: Kube, cluster: Any, directory: Path,
                     drop: set[tuple[str, str]]) -> Iterator[Path]:
    """A kubeconfig whose identity has the plugin's permissions except drop; removed after."""
    name = f"vpc-attach-less-{secrets.token_hex(3)}"
    kube.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    try:
        kube.create(f"{RBAC}/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": _rules_without(drop)})
        kube.create(f"{RBAC}/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]})
        answer = kube.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}/token",
                             {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                              "spec": {"expirationSeconds": TOKEN_SECONDS}})
        token = str(answer["status"]["token"])
        with Kube.with_token(cluster.server, cluster.ca_file, token) as identity:
            # The binding reaches the authorizer through an informer: wait until it is live.
            wait_until(f"RBAC of {name} to take effect", lambda: _allowed(identity), 30)
        yield write_token_kubeconfig(directory / f"{name}.kubeconfig", cluster.server,
                                     cluster.ca_file, f"system:serviceaccount:{NAMESPACE}:{name}",
                                     token)
    finally:
        kube.delete(f"{RBAC}/clusterrolebindings/{name}")
        kube.delete(f"{RBAC}/clusterroles/{name}")
        kube.delete(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}")


def _allowed(identity: Kube) -> bool:
    review = identity.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"resource": "pods", "verb": "get"}}})
    return bool((review.get("status") or {}).get("allowed"))
