"""Malformed inputs through the real `vpc-attach` executable: one JSON error, nothing created.

Every case runs the installed executable the way a runtime does (env + stdin) against a fresh
network namespace, and proves the answer is exactly one CNI error object with the expected code
naming what is wrong, with no traceback anywhere, and that neither the host nor the namespace
gained a link (SPEC §3). The fuzz tests at the end check the same contract for random inputs;
they only ever fuzz inputs whose config cannot parse (or verbs that never touch the kernel), so
no fuzzed call can reach netlink. The table of cases and how an answer is judged:
`e2e/harness/malformed.py`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cni_plugin.core.request import Request
from cni_plugin.dispatch import run
from e2e.harness.kernel import run_ip
from e2e.harness.malformed import (
    BUG_CASES,
    CASES,
    KERNEL_VERBS,
    PLUGIN_TIMEOUT,
    VPC,
    Case,
    Workdir,
    apply,
    assert_cni_error,
    link_names,
    ours,
    rules_of_our_vpc,
    single_json_document,
)
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


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Workdir:
    """The module's paths: no IPAM plugin findable, its own locks, an absent host file."""
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


TABLE = [pytest.param(case, id=name) for name, case in CASES.items()] + [
    pytest.param(case, id=name) for name, (case, _fixed_bug) in BUG_CASES.items()
]


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
