"""`vpc-attach doctor`: the API server with the plugin's kubeconfig, every permission of the
packaged ClusterRole, this node's BGPRouter, and the tenancy it applies."""

from __future__ import annotations

from cni_plugin.core.deadline import Deadline
from cni_plugin.doctor.node import API_SECONDS, FAIL, OK, SKIP, WARN, Finding, Node
from cni_plugin.kube.client import ApiError, KubeClient, Target
from cni_plugin.kube.config import load_kubeconfig
from cni_plugin.kube.kinds import ACCESS_REVIEWS, BINDINGS
from cni_plugin.publish.resources import GROUP, ROUTERS
from netconf.errors import CniError

# What packaging/rbac/clusterrole.yaml grants: (API group, resource, verbs). The BGP kinds are
# checked in the BGP namespace, the rest cluster-wide (Pods live in every namespace). A test
# holds this equal to the packaged ClusterRole.
CLUSTER_ROLE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, "bgprouters", ("get", "list", "watch")),
    (GROUP, "bgpvrfinstances", ("get", "list", "watch", "create", "update", "patch",
                                "delete")),
    (GROUP, "bgpadvertisements", ("get", "list", "create", "update", "patch", "delete")),
    ("discovery.k8s.io", "endpointslices", ("get", "list", "watch", "create", "update",
                                            "patch", "delete")),
    ("", "pods", ("get", "list", "watch")),
    ("vpc-attach.datum.net", "vpcbindings", ("get", "list", "watch")),
    ("", "namespaces", ("get", "list", "watch")),
    ("vpc-attach.datum.net", "ipamblocks", ("get", "list", "create", "delete")),
    ("", "nodes", ("get",)),
    ("k8s.cni.cncf.io", "ipamclaims", ("get", "list", "watch")),
    ("k8s.cni.cncf.io", "ipamclaims/status", ("update",)),
    ("k8s.cni.cncf.io", "multi-networkpolicies", ("get", "list", "watch")),
    ("k8s.cni.cncf.io", "network-attachment-definitions", ("get", "list", "watch")),
    ("networking.k8s.io", "networkpolicies", ("get", "list", "watch")),
    ("events.k8s.io", "events", ("create", "patch")),
    ("authorization.k8s.io", "selfsubjectaccessreviews", ("create",)),
)


def api(node: Node) -> list[Finding]:
    """The API server answers with the plugin's kubeconfig."""
    kubeconfig = node.settings.kubeconfig
    if not kubeconfig:
        publishing = [conf.name for _, conf in node.networks if conf.publish.any]
        if node.networks and not publishing:
            return [Finding("api.server", SKIP, "no kubeconfig, and no network found here "
                            "publishes")]
        return [Finding("api.server", FAIL, "no kubeconfig is configured (publishing and "
                        "Events need one)", "run `vpc-attach install` (the DaemonSet's init "
                        "container) or set kubeconfig in the host file")]
    try:
        client = KubeClient(load_kubeconfig(kubeconfig))
        version = client.request("GET", "/version", Deadline(API_SECONDS))
    except CniError as exc:
        detail = f"{kubeconfig}: {exc.msg}" + (f" ({exc.details})" if exc.details else "")
        return [Finding("api.server", FAIL, detail,
                        "check the kubeconfig's server is reachable from this node (curl -k "
                        "https://<server>/readyz); re-run the installer for a fresh "
                        "kubeconfig")]
    except (OSError, ValueError) as exc:  # e.g. a CA that does not load
        return [Finding("api.server", FAIL, f"{kubeconfig}: {type(exc).__name__}: {exc}",
                        "re-run the installer for a fresh kubeconfig")]
    except ApiError as exc:
        return [Finding("api.server", FAIL, f"{kubeconfig}: {exc.status} {exc.reason} "
                        f"{exc.message}", "the token is expired or belongs to a deleted Pod: "
                        "check the refresh-token container's log; restart the DaemonSet Pod")]
    node.client = client
    server = client.creds.server
    return [Finding("api.server", OK, f"{server} answered, Kubernetes "
                    f"{(version or {}).get('gitVersion', '?')} ({kubeconfig})")]


def rbac(node: Node) -> list[Finding]:
    """Every permission the packaged ClusterRole grants, asked with SelfSubjectAccessReviews."""
    client = node.client
    if client is None:
        return [Finding("api.rbac", SKIP, "the API server is not reachable")]
    missing: list[str] = []
    asked = 0
    try:
        for group, resource, verbs in CLUSTER_ROLE:
            if resource == "selfsubjectaccessreviews":
                continue  # every review below is one
            namespace = node.settings.namespace if group == GROUP else None
            for verb in verbs:
                asked += 1
                if not _allowed(client, group, resource, verb, namespace):
                    where = f" in namespace {namespace!r}" if namespace else ""
                    missing.append(f"{verb} {resource}{'.' + group if group else ''}{where}")
    except (CniError, ApiError) as exc:
        return [Finding("api.rbac", FAIL, f"cannot ask SelfSubjectAccessReviews: {exc}",
                        "kubectl apply -f packaging/rbac/")]
    if missing:
        return [Finding("api.rbac", FAIL, f"missing {len(missing)} of {asked}: "
                        + "; ".join(missing),
                        "kubectl apply -f packaging/rbac/ and check the binding's subject is "
                        "kube-system/vpc-attach")]
    return [Finding("api.rbac", OK, f"all {asked} permissions of the ClusterRole granted")]


def _allowed(client: KubeClient, group: str, resource: str, verb: str,
             namespace: str | None) -> bool:
    resource, _, subresource = resource.partition("/")  # e.g. ipamclaims/status
    attrs = {"group": group, "resource": resource, "subresource": subresource, "verb": verb}
    if namespace:
        attrs["namespace"] = namespace
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    review = client.create(ACCESS_REVIEWS, body, deadline=Deadline(API_SECONDS))
    return bool((review.get("status") or {}).get("allowed"))


def router(node: Node) -> list[Finding]:
    """Exactly one BGPRouter targets this node."""
    client, name, namespace = node.client, node.settings.node_name, node.settings.namespace
    if not name:
        return [Finding("bgp.router", FAIL, "no node name is configured",
                        "run `vpc-attach install` (NODE_NAME from the downward API) or set "
                        "nodeName in the host file")]
    if client is None:
        return [Finding("bgp.router", SKIP, "the API server is not reachable")]
    try:
        found = client.list(ROUTERS, namespace=namespace, deadline=Deadline(API_SECONDS),
                            fields=f"spec.targetRef.name={name}")
    except (CniError, ApiError) as exc:
        return [Finding("bgp.router", FAIL, f"cannot list BGPRouters in {namespace!r}: {exc}",
                        "kubectl apply -f packaging/crds/ (404) or packaging/rbac/ (403)")]
    names = [str(item["metadata"]["name"]) for item in found]
    if len(names) == 1:
        return [Finding("bgp.router", OK, f"{names[0]} targets node {name!r} in {namespace!r}")]
    return [Finding("bgp.router", FAIL, f"{len(names)} BGPRouters target node {name!r} in "
                    f"{namespace!r}" + (f": {', '.join(names)}" if names else ""),
                    "create one (docs/quickstart.md) with spec.targetRef {kind: Node, name: "
                    f"{name}}}" if not names else "delete all but one")]


def tenancy(node: Node) -> list[Finding]:
    """The tenancy mode (SPEC §14), and whether the VPCBinding CRD it reads is installed."""
    mode = node.settings.tenancy_mode
    why = "" if node.settings.tenancy else (" (no kubeconfig)" if mode == "off" else
                                            " (the default with a kubeconfig)")
    found = [Finding("tenancy.mode", OK, f"{mode}{why}")]
    if mode == "off":
        return found
    if node.client is None:
        return [*found, Finding("tenancy.crd", SKIP, "the API server is not reachable")]
    try:
        listed = node.client.request("GET", Target(BINDINGS), Deadline(API_SECONDS),
                                     query={"limit": "500"})
    except (CniError, ApiError) as exc:
        missing = isinstance(exc, ApiError) and exc.status == 404
        return [*found, Finding(
            "tenancy.crd", FAIL if mode == "enforce" else WARN,
            "the VPCBinding CRD is not installed: every ADD is denied" if missing else
            f"cannot list VPCBindings: {exc}",
            "kubectl apply -f packaging/crds/vpc-attach.datum.net_vpcbindings.yaml" if missing
            else "kubectl apply -f packaging/rbac/")]
    count = len(listed.get("items") or [])
    return [*found, Finding("tenancy.crd", OK if count else WARN, f"VPCBinding CRD installed, "
                            f"{count} binding(s)" + ("" if count else ": every ADD is denied"),
                            "" if count else "create the VPCBindings your namespaces need "
                            "(docs/configuration.md)")]
