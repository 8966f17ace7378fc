"""Malformed input handed to the `vpc-attach` executable as a runtime hands it (env + stdin), and
how the answer is judged: the table of cases with the CNI error code each must get (SPEC §3),
a work directory that keeps the host's own settings, locks and IPAM state out of every case,
and the checks that the answer is exactly one CNI error object and that nothing was created.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_plugin.core import naming
from e2e.harness.kernel import run_ip
from netconf import base62
from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS

# A VPC nobody else uses, so every name the plugin could derive from a case is ours alone.
VPC = base62.encode_base62(secrets.randbelow(base62.VPC_LIMIT - 10**9) + 10**9)
VPC_PREFIX = "G" + naming.pad_base62(VPC, naming.VPC_WIDTH)
BASE_VERSION = "1.0.0"  # not the newest, so "answers in the requested version" is visible
ERROR_KEYS = {"cniVersion", "code", "msg", "details"}
# Verbs that may touch the kernel or run IPAM once the config parses.
KERNEL_VERBS = frozenset({"ADD", "DEL", "CHECK", "STATUS", "GC"})
PLUGIN_TIMEOUT = 60


def link_names(lines: str) -> set[str]:
    """The link names in `ip -o link show` output."""
    return {line.split(":")[1].strip().split("@")[0] for line in lines.splitlines()
            if line.count(":") >= 2}


# A node that lets stanzas set host settings (SPEC §14): they are then checked as stanza keys.
ALLOW_STANZA = {"VPC_ATTACH_STANZA_HOST_SETTINGS": "allow"}


@dataclass(frozen=True)
class Workdir:
    """Paths that keep the host's own settings, locks and IPAM state out of every case."""

    cni_path: Path  # empty: no IPAM plugin can be found
    lock_dir: Path
    data_dir: Path
    absent_host_config: Path

    def base_conf(self) -> dict[str, Any]:
        """An otherwise valid veth stanza (publish off, table isolation)."""
        return {
            "cniVersion": BASE_VERSION, "name": "malformed-net", "type": "vpc-attach",
            "vpc": VPC, "vpcattachment": "1", "isolation": "table",
            "publish": {"bgp": False, "endpointSlice": False},
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00:77::/64"}]],
                     "dataDir": str(self.data_dir)},
        }

    def environ(self, **cni: str) -> dict[str, str]:
        """The process environment of one call: nothing CNI_* or VPC_ATTACH_* inherited."""
        inherited = {k: v for k, v in os.environ.items()
                     if not k.startswith(("CNI_", "VPC_ATTACH_"))}
        return {**inherited, "CNI_PATH": str(self.cni_path),
                "VPC_ATTACH_HOST_CONFIG": str(self.absent_host_config),
                "VPC_ATTACH_LOCK_DIR": str(self.lock_dir), **cni}


REMOVE = object()  # marks a key or variable a case removes


@dataclass(frozen=True)
class Case:
    """One malformed input and the answer it must get."""

    code: int
    names: tuple[str, ...] = ()  # each must appear in msg (the offending key or variable)
    conf: Mapping[str, Any] = field(default_factory=dict)  # changes to the base stanza
    stdin: bytes | None = None  # raw stdin instead of the stanza
    env: Mapping[str, Any] = field(default_factory=dict)  # changes to the CNI_* variables
    command: str = "ADD"
    answer_version: str | None = None  # expected cniVersion of the answer (default: config's)
    host_file: Any = None  # JSON written as the host settings file, if not None


CASES: dict[str, Case] = {
    # stdin is not a usable JSON object (code 6)
    "stdin-empty": Case(6, stdin=b""),
    "stdin-bad-json": Case(6, stdin=b'{"cniVersion": "1.0.0", "name": '),
    "stdin-json-array": Case(6, ("object",), stdin=b'[{"cniVersion": "1.0.0"}]'),
    "stdin-json-string": Case(6, ("object",), stdin=b'"vpc-attach"'),
    "stdin-json-null": Case(6, stdin=b"null"),
    "stdin-invalid-utf8": Case(6, stdin=b'{"name": "\xff\xfe"}'),
    "stdin-trailing-garbage": Case(6, stdin=b'{"cniVersion": "1.0.0"} {}'),
    # cniVersion
    "cniversion-missing": Case(7, ("cniVersion",), conf={"cniVersion": REMOVE}),
    "cniversion-unsupported": Case(1, ("0.2.0",), conf={"cniVersion": "0.2.0"},
                                   answer_version=CURRENT_VERSION),
    "cniversion-future": Case(1, ("9.9.9",), conf={"cniVersion": "9.9.9"},
                              answer_version=CURRENT_VERSION),
    "cniversion-number": Case(7, ("cniVersion",), conf={"cniVersion": 1.0},
                              answer_version=CURRENT_VERSION),
    # required and unknown keys
    "vpc-missing": Case(7, ("'vpc'",), conf={"vpc": REMOVE}),
    "vpcattachment-missing": Case(7, ("'vpcattachment'",), conf={"vpcattachment": REMOVE}),
    "name-missing": Case(7, ("'name'",), conf={"name": REMOVE}),
    "type-wrong": Case(7, ("'type'",), conf={"type": "ptp"}),
    "unknown-key": Case(7, ("'frobnicate'",), conf={"frobnicate": True}),
    "unknown-key-capitalised": Case(7, ("'Vrf'",), conf={"Vrf": "x"}),
    "duplicate-key-in-other-case": Case(7, ("VPC",), conf={"VPC": "11"}),
    # identifiers
    "vpc-not-a-string": Case(7, ("'vpc'",), conf={"vpc": 62}),
    "vpc-bad-base62": Case(7, ("'vpc'",), conf={"vpc": "ab-c"}),
    "vpc-empty": Case(7, ("'vpc'",), conf={"vpc": ""}),
    "vpc-at-2^48": Case(7, ("'vpc'",), conf={"vpc": base62.encode_base62(base62.VPC_LIMIT)}),
    "vpcattachment-bad-base62": Case(7, ("'vpcattachment'",), conf={"vpcattachment": "_"}),
    "vpcattachment-at-2^16": Case(7, ("'vpcattachment'",),
                                  conf={"vpcattachment": base62.encode_base62(
                                      base62.ATTACHMENT_LIMIT)}),
    # other keys
    "mtu-string": Case(7, ("'mtu'",), conf={"mtu": "1500"}),
    "mtu-too-small": Case(7, ("'mtu'",), conf={"mtu": 67}),
    "mtu-too-large": Case(7, ("'mtu'",), conf={"mtu": 65536}),
    "isolation-unknown": Case(7, ("'isolation'",), conf={"isolation": "none"}),
    "attachment-unknown": Case(7, ("'attachment'",), conf={"attachment": "macvlan"}),
    "publish-unknown-key": Case(7, ("'publish.bfd'",),
                                conf={"publish": {"bgp": False, "endpointSlice": False,
                                                  "bfd": True}}),
    "publish-bgp-not-bool": Case(7, ("'publish.bgp'",),
                                 conf={"publish": {"bgp": "no", "endpointSlice": False}}),
    "endpointslicefamilies-unknown-family": Case(
        7, ("publish.endpointSliceFamilies",),
        conf={"publish": {"bgp": False, "endpointSlice": False,
                          "endpointSliceFamilies": ["IPv5"]}}),
    "endpointslicefamilies-not-a-list": Case(
        7, ("publish.endpointSliceFamilies",),
        conf={"publish": {"bgp": False, "endpointSlice": False,
                          "endpointSliceFamilies": "IPv6"}}),
    "tap-options-without-tap": Case(7, ("'tap'",), conf={"tap": {"owner": 0}}),
    "tap-owner-negative": Case(7, ("'tap.owner'",),
                               conf={"attachment": "tap", "tap": {"owner": -1}}),
    "tap-unknown-option": Case(7, ("'tap.queues'",),
                               conf={"attachment": "tap", "tap": {"queues": 4}}),
    "veth-without-ipam": Case(7, ("'ipam'",), conf={"ipam": REMOVE}),
    "existing-with-ipam": Case(7, ("'ipam'",), conf={"attachment": "existing"}),
    "existing-without-prevresult": Case(7, ("'prevResult'",),
                                        conf={"attachment": "existing", "ipam": REMOVE}),
    "existing-with-malformed-prevresult": Case(
        6, ("prevResult",), conf={"attachment": "existing", "ipam": REMOVE,
                                  "prevResult": {"ips": [{"address": "not-an-ip"}]}}),
    "ipam-without-type": Case(7, ("'ipam'",), conf={"ipam": {"subnet": "fd00::/64"}}),
    "ipam-type-is-a-path": Case(7, ("'ipam'",), conf={"ipam": {"type": "../../bin/sh"}}),
    "ipam-type-not-in-cni-path": Case(7, ("ipam.type", "host-local")),
    # host settings in the stanza (SPEC §14): refused naming where they belong; checked as
    # stanza keys where the node allows them
    "namespace-in-stanza": Case(7, ("'namespace' is a host setting", "VPC_ATTACH_NAMESPACE"),
                                conf={"namespace": "bgp"}),
    "timeout-in-stanza": Case(7, ("'timeoutSeconds' is a host setting",
                                  "VPC_ATTACH_TIMEOUT_SECONDS"), conf={"timeoutSeconds": 5}),
    "namespace-not-a-dns-label": Case(7, ("'namespace'",), conf={"namespace": "Galactic_NS"},
                                      env=ALLOW_STANZA),
    "timeout-zero": Case(7, ("timeoutSeconds",), conf={"timeoutSeconds": 0},
                         env=ALLOW_STANZA),
    "stanza-host-settings-not-allow-or-deny": Case(
        7, ("stanzaHostSettings",), env={"VPC_ATTACH_STANZA_HOST_SETTINGS": "yes"}),
    "publish-on-without-node-name": Case(7, ("node name",), conf={"publish": REMOVE}),
    # the environment (code 4 naming the variable)
    "cni-command-missing": Case(4, ("CNI_COMMAND",), env={"CNI_COMMAND": REMOVE}),
    "cni-command-lowercase": Case(4, ("CNI_COMMAND",), env={"CNI_COMMAND": "add"}),
    "cni-containerid-missing": Case(4, ("CNI_CONTAINERID",), env={"CNI_CONTAINERID": REMOVE}),
    "cni-ifname-missing": Case(4, ("CNI_IFNAME",), env={"CNI_IFNAME": REMOVE}),
    "cni-netns-missing": Case(4, ("CNI_NETNS",), env={"CNI_NETNS": REMOVE}),
    "cni-path-missing": Case(4, ("CNI_PATH",), env={"CNI_PATH": REMOVE}),
    "cni-netns-relative": Case(4, ("CNI_NETNS",), env={"CNI_NETNS": "var/run/netns/x"}),
    "containerid-leading-dash": Case(4, ("CNI_CONTAINERID",), env={"CNI_CONTAINERID": "-abc"}),
    "containerid-with-slash": Case(4, ("CNI_CONTAINERID",),
                                   env={"CNI_CONTAINERID": "abc/../../etc"}),
    "ifname-too-long": Case(4, ("CNI_IFNAME",), env={"CNI_IFNAME": "eth0123456789012"}),
    "ifname-with-slash": Case(4, ("CNI_IFNAME",), env={"CNI_IFNAME": "eth/0"}),
    "ifname-with-colon": Case(4, ("CNI_IFNAME",), env={"CNI_IFNAME": "eth0:1"}),
    "ifname-dot-dot": Case(4, ("CNI_IFNAME",), env={"CNI_IFNAME": ".."}),
    "ifname-with-space": Case(4, ("CNI_IFNAME",), env={"CNI_IFNAME": "eth 0"}),
    # CNI_ARGS
    "cni-args-unknown-key": Case(2, ("'FOO'",), env={"CNI_ARGS": "K8S_POD_NAME=web;FOO=bar"}),
    "cni-args-unknown-key-ignoreunknown-false": Case(
        2, ("'FOO'",), env={"CNI_ARGS": "IgnoreUnknown=false;FOO=bar"}),
    "config-args-cni-unknown-key": Case(2, ("'BAR'",), conf={"args": {"cni": {"BAR": "1"}}}),
    "cni-args-malformed-pair": Case(4, ("CNI_ARGS",), env={"CNI_ARGS": "K8S_POD_NAME"}),
    "cni-args-empty-key": Case(4, ("CNI_ARGS",), env={"CNI_ARGS": "=web"}),
    # verbs
    "check-with-cniversion-0.3.1": Case(1, ("CHECK",), conf={"cniVersion": "0.3.1"},
                                        command="CHECK"),
}

# Known product bugs: each is what the contract demands, and fails today (see reasons).
BUG_CASES: dict[str, tuple[Case, str]] = {
    "stdin-deeply-nested-json": (
        Case(6, stdin=b"[" * 100_000, answer_version=CURRENT_VERSION),
        "BUG cni_plugin/dispatch.py answer_version (outside the try in run) lets "
        "json.loads raise RecursionError: empty stdout and a traceback on stderr"),
    "host-file-log-level-not-a-string": (
        Case(7, ("log",), host_file={"logLevel": 5}),
        "BUG netconf/host.py _check calls log_level.lower() on an int: code 199 "
        "'internal error' and a traceback in the log (stderr) instead of code 7"),
    "containerid-trailing-newline": (
        Case(4, ("CNI_CONTAINERID",), env={"CNI_CONTAINERID": "abc\n"}),
        "BUG netconf/runtime.py CONTAINER_ID_PATTERN '$' matches before a final newline: "
        "'abc\\n' is accepted (the call goes on to IPAM)"),
    "ifname-16-bytes-in-9-characters": (
        Case(4, ("CNI_IFNAME",), env={"CNI_IFNAME": "é" * 9}),
        "BUG netconf/runtime.py validate_ifname counts characters, not bytes (IFNAMSIZ): "
        "an 18-byte name is accepted (the call goes on to IPAM)"),
    "namespace-trailing-newline": (
        Case(7, ("'namespace'",), conf={"namespace": "galactic-system\n"},
             env=ALLOW_STANZA),
        "BUG netconf/config.py DNS_LABEL '$' matches before a final newline: the namespace "
        "is accepted"),
    "capitalised-cniversion-key": (
        Case(7, ("'vpc'",), conf={"cniVersion": REMOVE, "CNIVersion": "0.4.0", "vpc": "!"},
             answer_version="0.4.0"),
        "BUG cni_plugin/dispatch.py answer_version reads 'cniVersion' case-sensitively: the "
        "error is answered in 1.1.0 although the config (parsed case-insensitively) is 0.4.0"),
}

def apply(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """base with a case's changes (a REMOVE value removes the key)."""
    out = dict(base)
    for key, value in changes.items():
        if value is REMOVE:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def single_json_document(stdout: str) -> Any:
    """The one JSON document stdout must consist of (surrounding whitespace allowed)."""
    text = stdout.strip()
    assert text, "stdout is empty"
    document, end = json.JSONDecoder().raw_decode(text)
    assert not text[end:].strip(), f"more than one document on stdout: {stdout!r}"
    return document


def assert_cni_error(document: Any) -> dict[str, Any]:
    """document, checked to be one CNI error object of a supported version."""
    assert isinstance(document, dict), document
    assert {"cniVersion", "code", "msg"} <= set(document) <= ERROR_KEYS, document
    assert isinstance(document["code"], int) and not isinstance(document["code"], bool)
    assert isinstance(document["msg"], str) and document["msg"]
    assert isinstance(document.get("details", ""), str)
    assert document["cniVersion"] in SUPPORTED_VERSIONS
    return document


def ours(lines: str, container_id: str) -> set[str]:
    """Lines of `ip` output that mention this module's VPC or this case's container."""
    return {line for line in lines.splitlines() if VPC_PREFIX in line or container_id in line}


def rules_of_our_vpc() -> set[str]:
    """The host's policy rules (both families) that name this run's VPC."""
    return {line for family in ("-4", "-6") for line in run_ip(family, "rule", "show")
            .splitlines() if VPC_PREFIX in line}
