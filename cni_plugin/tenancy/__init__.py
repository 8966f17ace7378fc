"""Tenant boundaries (SPEC §14): which VPC attachment an ADD may make, decided before it
changes anything.

`admit` is ADD's first step: it resolves a Pod's own choice (`vpcFromPod`), then asks whether
some VPCBinding admits (VPC, attachment, the Pod's namespace, the attachment kind). It reads
the agent's synced watch caches (no request), or without them one LIST of VPCBindings and one
GET of the namespace, through the ADD's one session (`VerbCluster`). A denial from a cache is
confirmed against the API server before it is answered, so a binding created a moment ago is
never refused for a watch still on its way.
DEL, CHECK and GC never consult bindings; they read what ADD recorded (`choice`). The decision
itself is pure (`bindings`: a binding's match and the answer, no I/O).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cni_plugin.core.request import Invocation
from cni_plugin.kube.client import ApiError, KubeClient, Target, api_failure
from cni_plugin.kube.events import EVENTS, pod_event_body
from cni_plugin.kube.kinds import BINDINGS, NAMESPACES, PODS
from cni_plugin.kube.session import TenancyView, VerbCluster
from cni_plugin.tenancy import choice
from cni_plugin.tenancy.bindings import Decision, decide
from netconf.errors import INVALID_CONFIG, STATUS_NOT_AVAILABLE, TENANCY_DENIED, CniError

log = logging.getLogger(__name__)
DENIED_REASON = "VPCAttachDenied"


@dataclass(frozen=True)
class Denial:
    """An ADD no binding admitted: refused (`enforce`) or allowed and reported (`audit`)."""

    mode: str
    namespace: str | None
    pod: str | None
    uid: str | None
    node: str | None
    kubeconfig: str
    msg: str
    details: str

    @property
    def note(self) -> str:
        """The Event's text."""
        prefix = "allowed by tenancy: audit, but " if self.mode == "audit" else ""
        return f"{prefix}{self.msg} ({self.details})"


# Who hears of a denial besides the runtime (the agent: a metric, and the audit Event).
DenialObserver = Callable[[Denial], None]


def admit(inv: Invocation, cluster: VerbCluster,
          observer: DenialObserver | None = None) -> Invocation:
    """The invocation ADD goes on with (its attachment resolved), or code 106 when no binding
    admits it under `enforce`; code 7 for a Pod's missing or malformed choice. It reads
    through the ADD's session, which ADD goes on using for publishing."""
    mode = inv.host.tenancy_mode
    if not inv.conf.vpc_from_pod and mode == "off":
        return inv
    if not inv.host.kubeconfig:
        raise CniError(INVALID_CONFIG, "vpcFromPod needs a kubeconfig",
                       "set kubeconfig in VPC_ATTACH_KUBECONFIG or the host file")
    try:
        if inv.conf.vpc_from_pod:
            inv = dataclasses.replace(inv, conf=inv.conf.choosing(*_pod_choice(inv, cluster)))
        if mode != "off":
            _check(inv, cluster, mode, observer)
    except ApiError as exc:
        raise api_failure(exc, "read the VPCBindings, namespace or Pod") from None
    return inv


def _pod_choice(inv: Invocation, cluster: VerbCluster) -> tuple[str, str]:
    namespace, name = inv.pod.namespace, inv.pod.name
    if not namespace or not name:
        raise CniError(INVALID_CONFIG, "vpcFromPod needs the Pod: K8S_POD_NAMESPACE and "
                       "K8S_POD_NAME are not in CNI_ARGS")
    pod = None
    if inv.host.node_name:
        pod = cluster.session().pod(inv.host.node_name, namespace, name)
    if pod is None:
        pod = cluster.session().client().get(PODS, name, namespace=namespace,
                                             deadline=inv.deadline)
        if pod is not None:  # the policy step and publishing read it too: one GET
            cluster.session().remember_pod(pod)
    return choice.from_annotation(pod, f"{namespace}/{name}")


def _check(inv: Invocation, cluster: VerbCluster, mode: str,
           observer: DenialObserver | None) -> None:
    conf, namespace = inv.conf, inv.pod.namespace
    what = f"VPC {conf.vpc} attachment {conf.vpcattachment} ({conf.attachment})"
    if not namespace:
        _denied(inv, cluster, mode, observer, f"no namespace may attach to {what}: the runtime "
                "named no Pod namespace (K8S_POD_NAMESPACE)", "tenancy is on: every ADD "
                "names its Pod's namespace, or set tenancy: off on a node without tenants")
        return
    view = cluster.tenancy(inv.deadline)
    decision, total = _decide(inv, namespace, view, cluster)
    if not decision.admitted and view is not None:  # a cache may lag: confirm with the API
        decision, total = _decide(inv, namespace, None, cluster)
    if decision.admitted:
        log.debug("tenancy: %s admitted to %s by VPCBinding %s", namespace, what, decision.by)
        return
    _denied(inv, cluster, mode, observer, f"namespace {namespace!r} may not attach to {what}: no "
            "VPCBinding admits it", decision.details(conf.vpc, total))


def _decide(inv: Invocation, namespace: str, view: TenancyView | None,
            cluster: VerbCluster) -> tuple[Decision, int]:
    """The decision, and how many bindings the cluster has (for the details)."""
    if view is not None:
        bindings, ns = view.bindings(), view.namespace(namespace)
    else:
        client = cluster.session().client()
        bindings = _list_bindings(client, inv)
        ns = client.get(NAMESPACES, namespace, deadline=inv.deadline)
    labels: dict[str, Any] | None = None
    if ns is not None:
        labels = (ns.get("metadata") or {}).get("labels") or {}
    if bindings is None:
        return Decision(None, ("the VPCBinding CRD is not installed",)), 0
    return decide(bindings, inv.conf.vpc, inv.conf.vpcattachment, labels,
                  inv.conf.attachment), len(bindings)


def _list_bindings(client: KubeClient, inv: Invocation) -> list[dict[str, Any]] | None:
    try:
        return client.list(BINDINGS, deadline=inv.deadline)
    except ApiError as exc:
        if exc.status == 404:  # the CRD is not installed: no binding admits anything
            return None
        raise


def _denied(inv: Invocation, cluster: VerbCluster, mode: str, observer: DenialObserver | None,
            msg: str, details: str) -> None:
    """Refuse (enforce) or report and go on (audit)."""
    denial = Denial(mode, inv.pod.namespace, inv.pod.name, inv.pod.uid, inv.host.node_name,
                    inv.host.kubeconfig or "", msg, details)
    if observer is not None:
        observer(denial)
    else:
        _write_event(inv, cluster, denial)  # in-process: nobody else writes it
    if mode == "audit":
        log.warning("tenancy audit: allowed although %s (%s)", msg, details)
        return
    raise CniError(TENANCY_DENIED, msg, details)


def _write_event(inv: Invocation, cluster: VerbCluster, denial: Denial) -> None:
    """The Warning Event on the Pod, through the ADD's session (best effort: a refused write
    is logged)."""
    if not denial.namespace or not denial.pod:
        return
    body = pod_event_body(denial.namespace, denial.pod, denial.uid, denial.node or "vpc-attach",
                          DENIED_REASON, "Warning", denial.note)
    try:
        cluster.session().client().create(EVENTS, body, namespace=denial.namespace,
                                          deadline=inv.deadline)
    except (ApiError, CniError) as exc:
        log.info("tenancy: could not record %s on Pod %s/%s: %s", DENIED_REASON,
                 denial.namespace, denial.pod, exc)


def tenancy_status(inv: Invocation, cluster: VerbCluster) -> None:
    """STATUS under `enforce`: code 50 when the VPCBindings cannot be read (the CRD is not
    installed, or RBAC refuses), since every ADD would be denied or fail."""
    if inv.host.tenancy_mode != "enforce" or not inv.host.kubeconfig:
        return
    try:
        view = cluster.tenancy(inv.deadline)
        if view is not None:
            missing = view.bindings() is None
        else:
            missing = cluster.session().client().request(
                "GET", Target(BINDINGS), inv.deadline, query={"limit": "1"}) is None
    except ApiError as exc:
        missing = exc.status == 404
        if not missing:
            error = api_failure(exc, "list VPCBindings")
            raise CniError(STATUS_NOT_AVAILABLE, error.msg, error.details) from None
    except CniError as exc:
        raise CniError(STATUS_NOT_AVAILABLE, exc.msg, exc.details) from None
    if missing:
        raise CniError(STATUS_NOT_AVAILABLE, "the VPCBinding CRD is not installed (tenancy: "
                       "enforce): every ADD would be denied",
                       "kubectl apply -f packaging/crds/vpc-attach.datum.net_vpcbindings.yaml")


def resolve_recorded(inv: Invocation) -> Invocation | None:
    """DEL and CHECK of a `vpcFromPod` config: the invocation with the attachment ADD
    recorded, or None when ADD recorded nothing (so made nothing)."""
    if not inv.conf.vpc_from_pod:
        return inv
    found = choice.recorded(inv)
    if found is None:
        return None
    return dataclasses.replace(inv, conf=inv.conf.choosing(*found))
