"""A network config is tenant input (SPEC §14), proven with the installed executable, in-process
and through the node agent (`VPC_ATTACH_E2E_VIA=agent`):

- a config (a NAD, as a tenant writes it) that sets any host setting gets code 7 naming the key
  and where it belongs; its DEL succeeds changing nothing (SPEC §3: DEL after a failed ADD);
  the file its `logFile` names keeps its content and gains no neighbours, the socket its
  `agentSocket` names is never connected to, and the Pod's netns and IPAM stay untouched;
- a node with `stanzaHostSettings: allow` takes them (today's precedence);
- vpc-attach-ipam's dataDir outside the node's ipamDataRoot (a symlink inside it pointing out)
  is code 7 and nothing is written there;
- the forwarding client gives up on an agent that never answers within the invocation's
  deadline plus ANSWER_GRACE_SECONDS, with code 11.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.agent.client import ANSWER_GRACE_SECONDS
from e2e.harness import plugin as plugin_module
from e2e.harness.kernel import links_in
from e2e.harness.plugin import Answer, Plugin, base_conf, host_local
from e2e.harness.report import report
from e2e.harness.victims import Listener, Victims, planted_victims

pytestmark = [pytest.mark.root, pytest.mark.both_paths]

# host-file key -> (its environment variable, what a tenant would set it to)
HOST_KEYS: dict[str, tuple[str, Any]] = {
    "nodeName": ("VPC_ATTACH_NODE_NAME", "another-node"),
    "kubeconfig": ("VPC_ATTACH_KUBECONFIG", "/etc/kubernetes/admin.conf"),
    "namespace": ("VPC_ATTACH_NAMESPACE", "kube-system"),
    "logFile": ("VPC_ATTACH_LOG_FILE", None),  # the victim file
    "logLevel": ("VPC_ATTACH_LOG_LEVEL", "debug"),
    "logMaxBytes": ("VPC_ATTACH_LOG_MAX_BYTES", "1"),
    "logBackups": ("VPC_ATTACH_LOG_BACKUPS", "1"),
    "agentSocket": ("VPC_ATTACH_AGENT_SOCKET", None),  # the victim socket
    "timeoutSeconds": ("VPC_ATTACH_TIMEOUT_SECONDS", 600),
    "lockDir": ("VPC_ATTACH_LOCK_DIR", "/etc"),
    "stanzaHostSettings": ("VPC_ATTACH_STANZA_HOST_SETTINGS", "allow"),
    "ipamDataRoot": ("VPC_ATTACH_IPAM_DATA_ROOT", "/"),
}


@pytest.fixture
def victims(tmp_path: Path) -> Iterator[Victims]:
    with planted_victims(tmp_path / "victim") as planted:
        yield planted


@pytest.fixture(scope="module")
def answers(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What the plugin answered for each host key (shown at the end of the run)."""
    found: dict[str, Any] = {}
    yield found
    if found:
        mode = "agent" if plugin_module.VIA_AGENT else "in-process"
        report(request.config, f"host keys in a tenant's config ({mode})",
               tmp_path_factory.mktemp("report") / f"stanza-host-settings-{mode}.json", found)


def tenant_config(vpc: str, key: str, victims: Victims, data_dir: Path) -> dict[str, Any]:
    """A NAD's config as a tenant writes it: the key under test first (so the answer names it),
    then every victim setting."""
    chosen = {"logFile": str(victims.file), "agentSocket": str(victims.listener.path)}
    value = chosen.get(key, HOST_KEYS[key][1])
    config = base_conf(vpc, "1", ipam=host_local(data_dir, "fd00:14::/64"))
    return {key: value, **config, **{k: v for k, v in chosen.items() if k != key},
            "logMaxBytes": "1", "logBackups": "1"} | {key: value}


@pytest.mark.parametrize("key", sorted(HOST_KEYS))
def test_each_host_key_in_a_tenant_config_is_refused_and_touches_nothing(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path, victims: Victims,
        answers: dict[str, Any], key: str) -> None:
    data_dir = tmp_path / "ipam"
    config = tenant_config(vpc, key, victims, data_dir)
    container = f"tenant-{secrets.token_hex(4)}"
    added = plugin.call("ADD", config, container_id=container, netns=netns)
    assert added.status == 1 and added.code == 7, added.stdout
    msg = added.body["msg"]
    assert f"config key {key!r} is a host setting" in msg and HOST_KEYS[key][0] in msg
    deleted = plugin.call("DEL", config, container_id=container, netns=netns)
    assert (deleted.status, deleted.stdout) == (0, ""), deleted.stdout
    answers[key] = {"ADD": {"code": added.code, "msg": msg}, "DEL": {"status": deleted.status}}
    victims.assert_untouched()
    assert links_in(netns) == {"lo"}
    assert not data_dir.exists(), "IPAM must not even be asked"


def test_a_del_whose_config_fails_to_parse_still_never_logs_where_it_says(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path, victims: Victims) -> None:
    """The log settings used to be read before validation: a DEL of a config that does not
    even validate rotated the victim away."""
    config = {"cniVersion": "1.1.0", "name": "broken", "type": "vpc-attach", "vpc": "!",
              "logFile": str(victims.file), "logMaxBytes": "1", "logBackups": "1",
              "agentSocket": str(victims.listener.path)}
    for verb in ("DEL", "ADD", "CHECK", "GC", "STATUS"):
        plugin.call(verb, config, container_id="broken-1", netns=netns)
    victims.assert_untouched()


def test_a_node_that_allows_stanza_host_settings_takes_them(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    log = tmp_path / "chosen" / "tenant.log"
    log.parent.mkdir()
    locks = tmp_path / "chosen-locks"
    config = {**base_conf(vpc, "2", ipam=host_local(tmp_path / "ipam", "fd00:15::/64")),
              "logFile": str(log), "logLevel": "debug", "lockDir": str(locks),
              "timeoutSeconds": 20, "namespace": "tenant-bgp"}
    allow = {"VPC_ATTACH_STANZA_HOST_SETTINGS": "allow"}
    added = plugin.call("ADD", config, container_id="allowed-1", netns=netns, **allow)
    assert added.status == 0, added.stdout
    assert "eth0" in links_in(netns)
    plugin.ok("DEL", config, container_id="allowed-1", netns=netns, **allow)
    verbs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(v["verb"], v["code"]) for v in verbs if "verb" in v] == [("ADD", 0), ("DEL", 0)]
    assert any(p.name.startswith("container-") for p in locks.iterdir())
    # The same node saying deny (or nothing) refuses the same config.
    refused = plugin.call("ADD", config, container_id="allowed-2", netns=netns,
                          VPC_ATTACH_STANZA_HOST_SETTINGS="deny")
    assert refused.code == 7 and "host setting" in refused.body["msg"]


def test_any_other_switch_value_is_code_7(plugin: Plugin, netns: str, vpc: str,
                                          tmp_path: Path) -> None:
    config = base_conf(vpc, "3", ipam=host_local(tmp_path / "ipam", "fd00:16::/64"))
    answer = plugin.call("ADD", config, container_id="switch-1", netns=netns,
                         VPC_ATTACH_STANZA_HOST_SETTINGS="yes")
    assert answer.code == 7 and "stanzaHostSettings" in answer.body["msg"]
    assert links_in(netns) == {"lo"}


# --- vpc-attach-ipam's dataDir ------------------------------------------------------------------


def _ipam_config(vpc: str, data_dir: Path) -> dict[str, Any]:
    return base_conf(vpc, "4", ipam={"type": "vpc-attach-ipam", "dataDir": str(data_dir),
                                     "ipv6_subnet": "fd00:17::/48"})


@pytest.mark.parametrize("escape", ["symlink", "dot-dot", "elsewhere"])
def test_a_data_dir_outside_the_nodes_root_is_code_7_and_nothing_is_written_there(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path, escape: str) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    data_dir = {"symlink": root / "escape" / "pools", "dot-dot": root / ".." / "outside",
                "elsewhere": outside}[escape]
    config = _ipam_config(vpc, data_dir)
    env = {"VPC_ATTACH_IPAM_DATA_ROOT": str(root)}
    added = plugin.call("ADD", config, container_id="ipam-out", netns=netns, **env)
    assert added.code == 7, added.stdout
    assert "'ipam.dataDir'" in added.body["msg"] and str(root) in added.body["msg"]
    deleted = plugin.call("DEL", config, container_id="ipam-out", netns=netns, **env)
    assert deleted.status == 0, deleted.stdout
    assert list(outside.iterdir()) == [] and list(root.iterdir()) == [root / "escape"]
    assert links_in(netns) == {"lo"}


def test_a_data_dir_inside_the_nodes_root_allocates_there(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real")
    config = _ipam_config(vpc, root / "alias")
    env = {"VPC_ATTACH_IPAM_DATA_ROOT": str(root)}
    added = plugin.ok("ADD", config, container_id="ipam-in", netns=netns, **env)
    assert added["ips"]
    assert (root / "real" / config["name"]).is_dir()
    plugin.ok("DEL", config, container_id="ipam-in", netns=netns, **env)


# --- the forwarding path keeps the invocation's deadline ----------------------------------------


def test_an_agent_that_never_answers_is_code_11_within_the_deadline(
        plugin: Plugin, netns: str, vpc: str, tmp_path: Path) -> None:
    listener = Listener(tmp_path / "wedged.sock")
    timeout = 2.0
    try:
        config = base_conf(vpc, "5", ipam=host_local(tmp_path / "ipam", "fd00:18::/64"))
        started = time.monotonic()
        answer: Answer = plugin.call("ADD", config, container_id="wedged-1", netns=netns,
                                     VPC_ATTACH_AGENT_SOCKET=str(listener.path),
                                     VPC_ATTACH_TIMEOUT_SECONDS=str(timeout))
        took = time.monotonic() - started
        assert len(listener.accepted) == 1  # the node's (wedged) agent was asked
    finally:
        listener.close()
    assert answer.code == 11, answer.stdout
    assert answer.body["msg"] == f"node agent did not answer ADD within " \
        f"{timeout + ANSWER_GRACE_SECONDS:g} s"
    # The deadline plus the grace, plus the executable's own start (well under a second).
    assert timeout + ANSWER_GRACE_SECONDS <= took < timeout + ANSWER_GRACE_SECONDS + 2.0
    assert links_in(netns) == {"lo"}
