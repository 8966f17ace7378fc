"""24 concurrent ADDs across 4 simulated nodes (each a network namespace the plugin runs in,
with its own node name and BGPRouter), all publishing to the real control plane."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.core import naming
from cni_plugin.publish.resources import VRF_INSTANCES
from e2e.harness.agentproc import AgentProcess
from e2e.harness.kernel import run_ip
from e2e.harness.kube import Kube
from e2e.harness.nodes import api_port, in_node, node_namespace
from e2e.harness.plugin import VIA_AGENT, Plugin, base_conf, host_local
from e2e.harness.publishing import BGP_NS, advertisement, create_pod, make_node
from e2e.harness.tenancy import bound
from netconf import base62

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.both_paths]
NODES, VPCS = 4, 6


def test_24_concurrent_adds_across_4_nodes(kube: Kube, cluster: Any, plugin: Plugin,
                                           tmp_path: Path) -> None:
    vpcs = [base62.encode_base62(secrets.randbelow(2**40) + 2**30) for _ in range(VPCS)]
    with contextlib.ExitStack() as stack:
        for vpc in vpcs:
            stack.enter_context(bound(kube, vpc))
        nodes = []
        for index in range(NODES):
            netns = stack.enter_context(node_namespace(api_port(cluster.server)))
            locks = tmp_path / f"locks-{index}"
            locks.mkdir()
            node_plugin = Plugin(plugin.cni_bin, locks, prefix=in_node(netns))
            if VIA_AGENT:  # each node runs its own agent, inside the node's namespace
                agent_dir = tmp_path / f"agent-{index}"
                agent_dir.mkdir()
                running = stack.enter_context(AgentProcess(agent_dir, prefix=in_node(netns)))
                node_plugin.environ["VPC_ATTACH_AGENT_SOCKET"] = str(running.socket)
            nodes.append(make_node(kube, cluster, node_plugin))
        jobs = []
        for n, node in enumerate(nodes):
            for v, vpc in enumerate(vpcs):
                pod = f"conc-{n}-{v}-{secrets.token_hex(2)}"
                uid = create_pod(kube, pod, node.name)
                pod_ns = f"vpa-cpod-{secrets.token_hex(3)}"
                run_ip("netns", "add", pod_ns)
                stack.callback(os.system, f"ip netns del {pod_ns}")
                # Every node attaches att "1" of every VPC: each node writes its own
                # advertisement of it.
                conf = base_conf(vpc, "1", name=f"conc-{v}",
                                 ipam=host_local(tmp_path / f"ipam-{n}", f"fd00:{n + 1}:{v}::/64"))
                conf.pop("publish")
                jobs.append((node, conf, f"ctr-{pod}", f"/var/run/netns/{pod_ns}",
                             node.cni_args(pod, uid)))

        def add(job: tuple[Any, ...]) -> Any:
            node, conf, cid, netns, args = job
            return node.plugin.call("ADD", conf, container_id=cid, netns=netns, CNI_ARGS=args)

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            answers = list(pool.map(add, jobs))
        failures = [a.stdout + a.stderr for a in answers if a.status != 0]
        assert not failures, failures[:3]

        for node in nodes:
            instances = [i for i in kube.list(VRF_INSTANCES.path(BGP_NS))
                         if i["spec"]["routerRef"]["name"] == node.router]
            ids = [i["spec"]["vrfID"] for i in instances]
            assert len(ids) == VPCS and len(set(ids)) == VPCS, f"{node.name}: {ids}"
        for v, vpc in enumerate(vpcs):  # each node announces its own Pod, with its VRF ID
            for n, node in enumerate(nodes):
                adv = advertisement(kube, naming.advertisement_name(vpc, "1", node.name))
                instance = kube.get(VRF_INSTANCES.path(BGP_NS, naming.vrf_instance_name(
                    vpc, node.name)))
                assert adv is not None and instance is not None
                assert adv["spec"]["prefixes"] == [
                    str(ipaddress.ip_network(f"fd00:{n + 1}:{v}::/64"))], node.name
                assert adv["spec"]["routerRef"] == {"name": node.router}
                assert adv["spec"]["vrfID"] == instance["spec"]["vrfID"]
            assert advertisement(kube, naming.shared_advertisement_name(vpc, "1")) is None

        def delete(job: tuple[Any, ...]) -> Any:
            node, conf, cid, netns, args = job
            return node.plugin.call("DEL", conf, container_id=cid, netns=netns, CNI_ARGS=args)

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            dels = list(pool.map(delete, jobs))
        assert all(d.status == 0 for d in dels), [d.stdout for d in dels if d.status][:3]
        for vpc in vpcs:
            assert all(advertisement(kube, naming.advertisement_name(vpc, "1", node.name))
                       is None for node in nodes)
