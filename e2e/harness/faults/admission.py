"""Refusals by the real API server, switched per test case: one ValidatingAdmissionPolicy whose
parameter (a ConfigMap) lists the writes to deny, each as `OPERATION.resource.name`.

Creating a policy per case costs seconds (the API server compiles and loads it); changing its
parameter takes effect within milliseconds. Every change is confirmed before it is relied on: the
parameter also denies a dry-run create of a probe ConfigMap named for this change, which is
retried until refused (waiting on that condition, never a fixed sleep).
"""

from __future__ import annotations

import itertools
from types import TracebackType

from e2e.harness.kube import ApiError, Kube
from e2e.harness.wait import wait_until

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
MESSAGE = "denied by the fault harness"
# What the policy can refuse: (API group, plural).
RESOURCES = (("discovery.k8s.io", "endpointslices"),
             ("network.datumapis.com", "bgpadvertisements"),
             ("network.datumapis.com", "bgpvrfinstances"))
EXPRESSION = ("!(has(params.data) && (request.operation + '.' + request.resource.resource + '.' "
              "+ request.name) in params.data)")


class Denials:
    """A policy refusing the writes named in its ConfigMap `name` in `namespace`."""

    def __init__(self, kube: Kube, name: str, namespace: str) -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self._generation = itertools.count(1)
        self.denied: list[tuple[str, str, str]] = []

    def install(self) -> Denials:
        """Create the parameter (denying nothing), the policy and its binding; wait until the
        API server enforces them."""
        self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": self.name},
            "data": {}})
        rules = [{"apiGroups": [group], "apiVersions": ["*"], "resources": [plural],
                  "operations": ["CREATE", "UPDATE", "DELETE"]} for group, plural in RESOURCES]
        rules.append({"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                      "operations": ["CREATE"]})  # the probes
        self.kube.create(f"{ADMISSION}/validatingadmissionpolicies", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": self.name},
            "spec": {"failurePolicy": "Fail",
                     "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                     "matchConstraints": {"resourceRules": rules},
                     "validations": [{"expression": EXPRESSION, "message": MESSAGE}]}})
        self.kube.create(f"{ADMISSION}/validatingadmissionpolicybindings", {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": self.name},
            "spec": {"policyName": self.name, "validationActions": ["Deny"],
                     "paramRef": {"name": self.name, "namespace": self.namespace,
                                  "parameterNotFoundAction": "Allow"}}})
        self.deny()
        return self

    def remove(self) -> None:
        """Delete the binding, the policy and the parameter."""
        self.kube.delete(f"{ADMISSION}/validatingadmissionpolicybindings/{self.name}")
        self.kube.delete(f"{ADMISSION}/validatingadmissionpolicies/{self.name}")
        self.kube.delete(f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}")

    def deny(self, *writes: tuple[str, str, str]) -> None:
        """Refuse exactly these writes from now on, each (operation, plural, name), e.g.
        ("CREATE", "endpointslices", "web-1-3e-3e-ipv4"); none: refuse nothing."""
        probe = f"{self.name}-probe-{next(self._generation)}"
        data = {f"{op}.{plural}.{name}": "deny" for op, plural, name in writes}
        data[f"CREATE.configmaps.{probe}"] = "deny"
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"
        current = self.kube.request("GET", path)
        self.kube.put(path, {**current, "data": data})
        wait_until(f"the admission policy to deny {sorted(data)}",
                   lambda: self._refused(probe), timeout=30, interval=0.05)
        self.denied = list(writes)

    def _refused(self, probe: str) -> bool:
        try:
            self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": probe}},
                dry_run=True)
        except ApiError as exc:
            if MESSAGE in exc.message:
                return True
            raise
        return False

    def __enter__(self) -> Denials:
        return self.install()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()
