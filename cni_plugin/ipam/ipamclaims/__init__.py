"""KubeVirt's persistent addresses: the `IPAMClaim` (`k8s.cni.cncf.io/v1alpha1`) a Pod's
network-selection element names, read and given its status as OVN-Kubernetes does (SPEC §16).

`selection` finds the claim's name in the Pod's `k8s.v1.cni.cncf.io/networks` annotation (pure);
`claim` is the object and the status an allocation leaves on it (pure); `api` reads the claim
and writes its status through the API server. Why these rules: docs/architecture.md
("IPAMClaims").
"""
