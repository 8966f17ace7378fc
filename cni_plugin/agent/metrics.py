"""The agent's Prometheus metrics (SPEC §12), kept by `prometheus-client` on a registry of the
agent's own: verbs served, API requests made, rollbacks, links waiting for the reaper and the
vpc-attach-ipam addresses in use. Verbs run in-process by the executable are not counted.

Only the agent imports this module: the executable's forwarding path stays on the standard
library (SPEC §11), and the domain code reports through plain callables it is handed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cni_plugin.ipam.plugin.config import DEFAULT_DATA_DIR, PLUGIN_TYPES
from cni_plugin.ipam.plugin.store import PoolState, pool_directories
from netconf.config import lookup_ci
from netconf.errors import CniError
from netconf.host import ipam_data_root, read_host_file

log = logging.getLogger(__name__)
VERBS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
# 1 ms (a DEL of nothing) to 30 s (the default invocation deadline).
VERB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0)
API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A policy change seen → enforced on the node: SPEC §17 asks for 1 s at p99.
POLICY_SYNC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
POOL_READ_SECONDS = 1.0


class AgentMetrics:
    """Every metric the agent exports, and the callables that feed them."""

    def __init__(self, retired_links_pending: Callable[[], int]) -> None:
        # No `_created` series beside every counter and histogram (unannotated in the library).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.verb_duration = Histogram(
            "vpc_attach_verb_duration_seconds", "Time the agent took to serve a CNI verb.",
            ("verb", "outcome"), buckets=VERB_BUCKETS, registry=self.registry)
        self.verb_errors = Counter(
            "vpc_attach_verb_errors_total", "CNI verbs the agent answered with an error, by "
            "CNI error code.", ("verb", "code"), registry=self.registry)
        self.api_requests = Counter(
            "vpc_attach_api_requests_total", "Requests to the Kubernetes API server, by HTTP "
            "method and status (\"error\": no answer).", ("method", "code"),
            registry=self.registry)
        self.api_duration = Histogram(
            "vpc_attach_api_request_duration_seconds", "Time until the API server answered "
            "(a watch: until its answer started).", ("method",), buckets=API_BUCKETS,
            registry=self.registry)
        self.rollbacks = Counter(
            "vpc_attach_rollbacks_total", "Rollbacks of failed ADDs that had something to "
            "undo, by whether everything was undone.", ("outcome",), registry=self.registry)
        for outcome in ("complete", "incomplete"):
            self.rollbacks.labels(outcome)  # exported at 0 before the first one
        self.tenancy_denials = Counter(
            "vpc_attach_tenancy_denials_total", "ADDs no VPCBinding admitted, by the node's "
            "tenancy mode (enforce: refused with code 106; audit: allowed).", ("mode",),
            registry=self.registry)
        for mode in ("enforce", "audit"):
            self.tenancy_denials.labels(mode)
        retired = Gauge("vpc_attach_retired_links_pending", "Retired links the reaper has "
                        "still to delete.", registry=self.registry)
        retired.set_function(retired_links_pending)
        self.pools = IpamPools()
        self.registry.register(self.pools)
        self.policy_rules = Gauge(
            "vpc_attach_policy_rules", "Allow rules of MultiNetworkPolicies and NetworkPolicies "
            "the node enforces (nftables rules in Pods' netns, tc filters on taps).",
            registry=self.registry)
        self.policy_unenforced = Gauge(
            "vpc_attach_policy_unenforced", "Attachments a policy selects on a path it cannot "
            "be enforced on (the Warning Event PolicyNotEnforced names each).",
            registry=self.registry)
        self.policy_sync = Histogram(
            "vpc_attach_policy_sync_seconds", "Time from a change the agent saw (a policy, Pod, "
            "namespace, EndpointSlice or attachment) to its rules enforced on the node.",
            buckets=POLICY_SYNC_BUCKETS, registry=self.registry)

    def verb_answered(self, verb: str, code: int, seconds: float) -> None:
        """A verb was answered: code 0 for success, else its CNI error code."""
        verb = verb if verb in VERBS else "other"
        self.verb_duration.labels(verb, "ok" if code == 0 else "error").observe(seconds)
        if code:
            self.verb_errors.labels(verb, str(code)).inc()

    def api_exchange(self, method: str, code: str, seconds: float) -> None:
        """One exchange with the API server (a `kube.client.ApiObserver`)."""
        self.api_requests.labels(method, code).inc()
        self.api_duration.labels(method).observe(seconds)

    def tenancy_denied(self, mode: str) -> None:
        """An ADD no binding admitted, under mode."""
        self.tenancy_denials.labels(mode).inc()

    def policy_synced(self, rules: int, unenforced: int, seconds: float | None) -> None:
        """A policy sync ended: the node's rule and unenforced counts, and how long the oldest
        change it enforced waited (None: a periodic pass, nothing changed)."""
        self.policy_rules.set(rules)
        self.policy_unenforced.set(unenforced)
        if seconds is not None:
            self.policy_sync.observe(seconds)

    def rollback_finished(self, complete: bool) -> None:
        """A rollback ended (a `core.rollback.RollbackObserver`)."""
        self.rollbacks.labels("complete" if complete else "incomplete").inc()


class IpamPools(Collector):
    """`vpc_attach_ipam_addresses_in_use{pool="<network>/<pool dir>"}`: the allocation records
    of every vpc-attach-ipam pool under the data directories this node allocates in (the
    default one, and each one a served request named), counted at scrape time."""

    NAME = "vpc_attach_ipam_addresses_in_use"
    HELP = "Addresses (blocks) allocated by vpc-attach-ipam on this node, per pool."

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data_dirs = {DEFAULT_DATA_DIR, _node_data_root()}

    def learn(self, config: Mapping[str, Any]) -> None:
        """Remember the data directory of a network config's vpc-attach-ipam block, if it has
        one."""
        data_dir = ipam_data_dir(config)
        if data_dir is not None:
            with self._lock:
                self._data_dirs.add(data_dir)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        """The family without its samples (no scan when the collector is registered)."""
        return [GaugeMetricFamily(self.NAME, self.HELP, labels=["pool"])]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        """Count the records of each pool now."""
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["pool"])
        with self._lock:
            data_dirs = sorted(self._data_dirs)
        counts: dict[str, int] = {}
        for data_dir in data_dirs:
            for network, pool, path in pool_directories(data_dir):
                try:
                    records = len(PoolState(path, POOL_READ_SECONDS).records())
                except CniError as exc:  # unreadable now: left out of this scrape
                    log.debug("metrics: cannot count %s: %s", path, exc.msg)
                    continue
                label = f"{network}/{pool}"
                counts[label] = counts.get(label, 0) + records
        for label, count in sorted(counts.items()):
            family.add_metric([label], count)
        yield family


def _node_data_root() -> str:
    """The agent's node's ipamDataRoot (where a dataDir left unset allocates)."""
    try:
        return ipam_data_root(os.environ, read_host_file(os.environ))
    except CniError:
        return DEFAULT_DATA_DIR  # the verbs report the bad setting


def ipam_data_dir(config: Mapping[str, Any]) -> str | None:
    """The dataDir of a network config's vpc-attach-ipam block (its default when unset), or
    None when the config has no such block."""
    ipam = lookup_ci(config, "ipam")
    if not isinstance(ipam, dict) or lookup_ci(ipam, "type") not in PLUGIN_TYPES:
        return None
    data_dir = lookup_ci(ipam, "dataDir")
    if data_dir is None:
        return DEFAULT_DATA_DIR
    return data_dir if isinstance(data_dir, str) and os.path.isabs(data_dir) else None
