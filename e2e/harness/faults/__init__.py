"""Fault injection for e2e tests, reusable by any test (issue 10).

- `proxy`: `FaultProxy`, a TLS-terminating proxy in front of the real kube-apiserver, and the
  `Rule`s that pick requests by method / resource / name / dry run / ordinal and apply a
  `Fault`
  (forward-then-drop, reset-before-forward, delay, a 429/503 with Retry-After, close mid-body),
  optionally calling a hook at that moment (pause the API server, kill the agent);
- `admission`: `Denials`, refusals by the real API server (a ValidatingAdmissionPolicy whose
  parameter lists the writes to deny), switched per test case;
- `start_proxy`: a proxy for a test cluster, with the kubeconfig the plugin is pointed at
  (`VPC_ATTACH_KUBECONFIG`);
- `matrix`: the fault matrix's scene (e2e/test_fault_matrix.py): its writes, faults and cases,
  one case's container, what it left and changed, the figures.

The control plane's processes are paused, resumed, killed and restarted by
`e2e.harness.cluster.Cluster` (`pause`, `resume`, `paused`, `kill`, `restart`); the node agent
is killed by `e2e.harness.agentproc.AgentProcess.kill` (as a rule's hook: at a chosen request).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from e2e.harness.cluster import Cluster
from e2e.harness.cluster.kubeconfig import write_token_kubeconfig
from e2e.harness.cluster.pki import Pki, issue_serving_cert
from e2e.harness.faults.admission import Denials
from e2e.harness.faults.proxy import Fault, FaultProxy, Rule, Seen, resource_of

__all__ = ["Denials", "Fault", "FaultProxy", "ProxiedCluster", "Rule", "Seen", "resource_of",
           "start_proxy"]


class ProxiedCluster:
    """A running `FaultProxy` in front of a cluster and a plugin kubeconfig naming it."""

    def __init__(self, proxy: FaultProxy, kubeconfig: Path) -> None:
        self.proxy = proxy
        self.kubeconfig = kubeconfig

    def stop(self) -> None:
        """Stop the proxy (every connection closed, every thread joined)."""
        self.proxy.stop()


def start_proxy(cluster: Cluster, directory: Path) -> ProxiedCluster:
    """A proxy to `cluster`'s API server with a certificate from its CA, and in `directory` a
    kubeconfig with the plugin's ServiceAccount token whose server is the proxy."""
    pki = Pki(cluster.state_dir / "pki")
    cert, key = issue_serving_cert(pki, f"fault-proxy-{secrets.token_hex(4)}")
    proxy = FaultProxy(cluster.server, cluster.ca_file, cert, key).start()
    try:
        user = "system:serviceaccount:kube-system:vpc-attach"
        kubeconfig = write_token_kubeconfig(directory / "proxied-plugin.kubeconfig", proxy.url,
                                            cluster.ca_file, user, cluster.plugin_token)
    except BaseException:
        proxy.stop()
        raise
    return ProxiedCluster(proxy, kubeconfig)
