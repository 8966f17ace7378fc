"""Malformed inputs through the real `vpc-attach` executable: one JSON error, nothing created.

Every case runs the installed executable the way a runtime does (env + stdin) against a fresh
network namespace, and proves the answer is exactly one CNI error object with the expected code
naming what is wrong, with no traceback anywhere, and that neither the host nor the namespace
gained a link (SPEC §3). The fuzz tests at the end check the same contract for random inputs;
they only ever fuzz inputs whose config cannot parse (or verbs that never touch the kernel), so
no fuzzed call can reach netlink.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cni_plugin.core import naming
from cni_plugin.core.request import Request
from cni_plugin.dispatch import run
from netconf import base62
from netconf.config import decode_json, parse_netconf
from netconf.errors import INTERNAL_ERROR
from netconf.runtime import COMMANDS
from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS

IS_ROOT = os.geteuid() == 0
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not IS_ROOT, reason="needs root: each case runs against a real netns"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's `ip`"),
    pytest.mark.skipif(shutil.which("vpc-attach") is None,
                       reason="`vpc-attach` is not installed (pip install -e .)"),
]

# A VPC nobody else uses, so every name the plugin could derive from a case is ours alone.
VPC = base62.encode_base62(secrets.randbelow(base62.VPC_LIMIT - 10**9) + 10**9)
VPC_PREFIX = "G" + naming.pad_base62(VPC, naming.VPC_WIDTH)
BASE_VERSION = "1.0.0"  # not the newest, so "answers in the requested version" is visible
ERROR_KEYS = {"cniVersion", "code", "msg", "details"}
# Verbs that may touch the kernel or run IPAM once the config parses.
KERNEL_VERBS = frozenset({"ADD", "DEL", "CHECK", "STATUS", "GC"})
PLUGIN_TIMEOUT = 60


def run_ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20,
                          check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def link_names(lines: str) -> set[str]:
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


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Workdir:
    root = tmp_path_factory.mktemp("malformed")
    for sub in ("cni-bin", "locks"):
        (root / sub).mkdir()
    return Workdir(cni_path=root / "cni-bin", lock_dir=root / "locks",
                   data_dir=root / "ipam-data", absent_host_config=root / "absent-host.json")


@pytest.fixture
def pod_netns() -> Iterator[str]:
    """A fresh network namespace, deleted afterwards; yields its CNI_NETNS path."""
    name = f"vpa-malformed-{secrets.token_hex(4)}"
    run_ip("netns", "add", name)
    try:
        yield f"/var/run/netns/{name}"
    finally:
        run_ip("netns", "del", name, check=False)


# --- the table -------------------------------------------------------------------------------

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

TABLE = [pytest.param(case, id=name) for name, case in CASES.items()] + [
    pytest.param(case, id=name) for name, (case, _fixed_bug) in BUG_CASES.items()
]


def apply(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
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
    return {line for family in ("-4", "-6") for line in run_ip(family, "rule", "show")
            .splitlines() if VPC_PREFIX in line}


@pytest.mark.parametrize("case", TABLE)
def test_malformed_input_gets_one_error_object_and_creates_nothing(
        case: Case, workdir: Workdir, pod_netns: str, tmp_path: Path) -> None:
    container_id = f"malformed-{secrets.token_hex(6)}"
    base = workdir.base_conf()
    stdin = case.stdin if case.stdin is not None else json.dumps(apply(base, case.conf)).encode()
    environ = apply({**workdir.environ(), "CNI_COMMAND": case.command,
                     "CNI_CONTAINERID": container_id, "CNI_NETNS": pod_netns,
                     "CNI_IFNAME": "eth0"}, case.env)
    if case.host_file is not None:
        host_file = tmp_path / "host.json"
        host_file.write_text(json.dumps(case.host_file))
        environ["VPC_ATTACH_HOST_CONFIG"] = str(host_file)
    links_before = run_ip("-o", "link", "show")
    rules_before = rules_of_our_vpc()

    proc = subprocess.run(["vpc-attach"], input=stdin, env=environ, capture_output=True,
                          timeout=PLUGIN_TIMEOUT, check=False)
    stdout, stderr = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")

    # Nothing was created, whatever the answer.
    links_after = run_ip("-o", "link", "show")
    new_host_links = ours(links_after, container_id) - ours(links_before, container_id)
    assert not new_host_links, f"host links appeared: {new_host_links}"
    assert rules_of_our_vpc() == rules_before
    netns_links = link_names(run_ip("-n", os.path.basename(pod_netns), "-o", "link", "show"))
    assert netns_links == {"lo"}, f"links appeared in the netns: {netns_links}"
    assert not workdir.data_dir.exists() or not any(workdir.data_dir.rglob("*")), \
        "IPAM state was written"
    # Exactly one error object, no traceback.
    assert "Traceback" not in stdout and "Traceback" not in stderr, stderr
    answer = assert_cni_error(single_json_document(stdout))
    assert proc.returncode != 0
    assert answer["code"] == case.code, answer
    for name in case.names:
        assert name in answer["msg"], answer
    if case.answer_version is not None:
        expected_version = case.answer_version
    elif case.stdin is None and isinstance(apply(base, case.conf).get("cniVersion"), str) and \
            apply(base, case.conf)["cniVersion"] in SUPPORTED_VERSIONS:
        expected_version = apply(base, case.conf)["cniVersion"]
    else:
        expected_version = CURRENT_VERSION
    assert answer["cniVersion"] == expected_version, answer


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 30


# --- fuzzing ---------------------------------------------------------------------------------

BASE_FOR_FUZZ: dict[str, Any] = {
    "cniVersion": "1.1.0", "name": "fuzz-net", "type": "vpc-attach", "vpc": VPC,
    "vpcattachment": "1", "isolation": "table",
    "publish": {"bgp": False, "endpointSlice": False},
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00:78::/64"}]],
             "dataDir": "/nonexistent/vpc-attach-fuzz"},
}
# Keys for which almost any random value is invalid (so few examples are discarded).
FRAGILE_KEYS = ("cniVersion", "type", "vpc", "vpcattachment", "mtu", "attachment", "isolation",
                "publish", "tap", "ipam", "timeoutSeconds")

json_leaves = st.none() | st.booleans() | st.integers() | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=10)


@st.composite
def corrupted_configs(draw: st.DrawFn) -> bytes:
    conf = dict(BASE_FOR_FUZZ)
    for key in draw(st.lists(st.sampled_from(FRAGILE_KEYS), min_size=1, max_size=3,
                             unique=True)):
        if draw(st.booleans()):
            conf[key] = draw(json_values)
        else:
            conf.pop(key, None)
    if draw(st.booleans()):
        conf[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
    return json.dumps(conf).encode()


stdin_strategy = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    corrupted_configs(),
)
env_text = st.text(alphabet=st.characters(blacklist_characters="\x00", codec="utf-8"),
                   max_size=24)
commands = st.sampled_from(COMMANDS) | env_text
cni_args_strategy = env_text | st.lists(
    st.tuples(st.sampled_from(["K8S_POD_NAME", "K8S_POD_NAMESPACE", "IgnoreUnknown", "FOO",
                               ""]), env_text.filter(lambda v: ";" not in v)),
    max_size=4).map(lambda pairs: ";".join(f"{k}={v}" for k, v in pairs))


def config_cannot_parse(stdin: bytes) -> bool:
    """True when the stanza is rejected, so no verb can get past Invocation.parse."""
    try:
        parse_netconf(decode_json(stdin))
    except Exception:
        return True
    return False


def never_reaches_the_kernel(command: str, stdin: bytes) -> bool:
    return command not in KERNEL_VERBS or config_cannot_parse(stdin)


@st.composite
def fuzzed_calls(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    command = draw(commands)
    stdin = draw(stdin_strategy)
    assume(never_reaches_the_kernel(command, stdin))
    cni: dict[str, str] = {"CNI_COMMAND": command}
    for name, values in (("CNI_CONTAINERID", env_text), ("CNI_IFNAME", env_text),
                         ("CNI_ARGS", cni_args_strategy),
                         ("CNI_NETNS", st.sampled_from(["/var/run/netns/vpa-fuzz-absent",
                                                        "relative/netns"]) | env_text)):
        if draw(st.booleans()):
            cni[name] = draw(values)
    return cni, stdin


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(call=fuzzed_calls())
def test_fuzzed_invocation_in_process_always_answers_a_cni_document(
        call: tuple[dict[str, str], bytes], workdir: Workdir) -> None:
    cni, stdin = call
    environ = {"CNI_PATH": str(workdir.cni_path),
               "VPC_ATTACH_HOST_CONFIG": str(workdir.absent_host_config),
               "VPC_ATTACH_LOCK_DIR": str(workdir.lock_dir), **cni}
    outcome = run(Request(environ, stdin))
    status, payload = outcome.status, outcome.payload
    json.dumps(payload)
    if status == 0 and cni["CNI_COMMAND"] == "DEL":
        assert payload is None  # DEL with an unusable config: nothing to undo, no answer
    elif status == 0:
        assert cni["CNI_COMMAND"] == "VERSION"
        assert isinstance(payload, dict) and "supportedVersions" in payload
    else:
        answer = assert_cni_error(payload)
        assert answer["code"] != INTERNAL_ERROR, answer  # an unexpected exception is a bug


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(call=fuzzed_calls())
def test_fuzzed_invocation_of_the_executable_prints_one_document_and_no_traceback(
        call: tuple[dict[str, str], bytes], workdir: Workdir) -> None:
    cni, stdin = call
    environ = {**workdir.environ(), **cni}
    proc = subprocess.run(["vpc-attach"], input=stdin, env=environ, capture_output=True,
                          timeout=PLUGIN_TIMEOUT, check=False)
    stdout, stderr = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    assert "Traceback" not in stdout and "Traceback" not in stderr, stderr
    if proc.returncode == 0 and cni["CNI_COMMAND"] == "DEL":
        assert stdout == "", "a successful DEL prints nothing"
        return
    document = single_json_document(stdout)
    if proc.returncode == 0:
        assert cni["CNI_COMMAND"] == "VERSION" and "supportedVersions" in document
    else:
        assert_cni_error(document)
