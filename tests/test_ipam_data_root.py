"""vpc-attach-ipam's dataDir resolves (symlinks and `..` followed) to the node's ipamDataRoot or
below it, else code 7 naming both (SPEC §14); every write then uses the resolved path."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin import dispatch
from cni_plugin.core.request import Request
from cni_plugin.ipam.plugin.config import (
    DEFAULT_DATA_DIR,
    DataDirOutsideRoot,
    confine_data_dir,
    parse_ipam,
)
from netconf.errors import INVALID_CONFIG, CniError
from netconf.host import DEFAULT_IPAM_DATA_ROOT, IPAM_DATA_ROOT_ENV, NodeSettings, ipam_data_root

TYPE = "vpc-attach-ipam"


def confined(data_dir: str | Path | None, root: Path | str, **env: str) -> str:
    block: dict[str, Any] = {"type": TYPE, "ipv6_subnet": "fd00::/64"}
    if data_dir is not None:
        block["dataDir"] = str(data_dir)
    conf = parse_ipam(block, "1.1.0", "net1")
    environ = {IPAM_DATA_ROOT_ENV: str(root), "VPC_ATTACH_HOST_CONFIG": "/nonexistent/h.json",
               **env}
    return confine_data_dir(conf, NodeSettings.read(environ)).data_dir


def refused(data_dir: str | Path, root: Path | str) -> CniError:
    with pytest.raises(DataDirOutsideRoot) as info:
        confined(data_dir, root)
    return info.value


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "root"
    made.mkdir()
    return made


def test_the_root_itself_and_anything_below_it_are_accepted(root: Path) -> None:
    assert confined(root, root) == str(root)
    assert confined(root / "a", root) == str(root / "a")  # not made yet
    assert confined(root / "a" / "b" / "c", root) == str(root / "a" / "b" / "c")


def test_unset_data_dir_is_the_nodes_root(root: Path) -> None:
    assert confined(None, root) == str(root)
    conf = parse_ipam({"type": TYPE, "static_ip": "fd00::1"}, "1.1.0", "n")
    assert conf.data_dir == DEFAULT_DATA_DIR == DEFAULT_IPAM_DATA_ROOT and not conf.data_dir_given


def test_a_path_outside_is_code_7_naming_data_dir_and_the_root(tmp_path: Path,
                                                               root: Path) -> None:
    err = refused(tmp_path / "elsewhere", root)
    assert err.code == INVALID_CONFIG
    assert "'ipam.dataDir'" in err.msg and str(root) in err.msg
    assert "ipamDataRoot" in err.details and IPAM_DATA_ROOT_ENV in err.details


def test_a_sibling_sharing_the_roots_prefix_is_outside(root: Path) -> None:
    refused(f"{root}x", root)
    refused(f"{root}-2/net", root)


def test_dot_dot_cannot_climb_out(root: Path) -> None:
    refused(root / "..", root)
    refused(root / "a" / ".." / ".." / "etc", root)
    refused(root / "not-made" / ".." / ".." / "x", root)
    assert confined(root / "a" / ".." / "b", root) == str(root / "b")


def test_a_symlink_inside_the_root_pointing_outside_is_refused(tmp_path: Path,
                                                               root: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    err = refused(root / "escape", root)
    assert str(outside) in err.msg  # what it resolves to is named
    refused(root / "escape" / "deeper" / "not-made", root)
    assert sorted(os.listdir(outside)) == []


def test_a_symlink_inside_the_root_pointing_inside_resolves_to_its_target(root: Path) -> None:
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    assert confined(root / "alias" / "net", root) == str(root / "real" / "net")


def test_a_root_that_is_itself_a_symlink_accepts_its_target(tmp_path: Path,
                                                            root: Path) -> None:
    link = tmp_path / "root-link"
    link.symlink_to(root)
    assert confined(root / "a", link) == str(root / "a")
    assert confined(link / "a", link) == str(root / "a")
    refused(tmp_path, link)


def test_root_comes_from_env_then_host_file_then_default(tmp_path: Path) -> None:
    host_file = tmp_path / "host.json"
    host_file.write_text(json.dumps({"ipamDataRoot": "/srv/file-root"}))
    environ = {"VPC_ATTACH_HOST_CONFIG": str(host_file)}
    assert ipam_data_root({**environ, IPAM_DATA_ROOT_ENV: "/srv/env-root"},
                          {"ipamDataRoot": "/srv/file-root"}) == "/srv/env-root"
    assert ipam_data_root(environ, {"ipamDataRoot": "/srv/file-root"}) == "/srv/file-root"
    assert ipam_data_root({}, {}) == DEFAULT_IPAM_DATA_ROOT == "/var/lib/cni/vpc-attach-ipam"


@pytest.mark.parametrize("value", ["relative/root", "", 5, ["/a"]])
def test_a_root_that_is_not_an_absolute_path_is_code_7(value: Any) -> None:
    if value == "":  # empty means unset
        assert ipam_data_root({}, {"ipamDataRoot": value}) == DEFAULT_IPAM_DATA_ROOT
        return
    with pytest.raises(CniError) as info:
        ipam_data_root({}, {"ipamDataRoot": value})
    assert info.value.code == INVALID_CONFIG and "ipamDataRoot" in info.value.msg


_segment = st.sampled_from(["a", "b", "..", ".", "net-1"])


@given(segments=st.lists(_segment, max_size=8))
def test_without_symlinks_the_verdict_is_the_normalised_paths(segments: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(os.path.realpath(tmp)) / "root"
        root.mkdir()
        wanted = os.path.join(str(root), *segments)
        inside = os.path.normpath(wanted) == str(root) or \
            os.path.normpath(wanted).startswith(f"{root}/")
        if inside:
            assert confined(wanted, root) == os.path.normpath(wanted)
        else:
            with pytest.raises(DataDirOutsideRoot):
                confined(wanted, root)


# --- through the verbs: nothing is written outside ---------------------------------------------


def _request(command: str, data_dir: Path, root: Path) -> Request:
    environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
               "CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin",
               IPAM_DATA_ROOT_ENV: str(root), "VPC_ATTACH_HOST_CONFIG": "/nonexistent/h.json"}
    config = {"cniVersion": "1.1.0", "name": "net1",
              "ipam": {"type": TYPE, "dataDir": str(data_dir), "ipv6_subnet": "fd00::/64"}}
    return Request(environ, json.dumps(config).encode())


@pytest.mark.parametrize("command", ["ADD", "CHECK", "STATUS", "GC"])
def test_every_verb_refuses_a_data_dir_outside_and_writes_nothing_there(
        tmp_path: Path, root: Path, command: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    outcome = dispatch.run(_request(command, root / "escape", root), dispatch.ipam_verbs,
                                  log_line=False)
    status, answer = outcome.status, outcome.payload
    assert status == 1 and answer is not None and answer["code"] == INVALID_CONFIG
    assert "'ipam.dataDir'" in answer["msg"]
    assert list(outside.iterdir()) == []


def test_del_of_a_data_dir_outside_succeeds_and_changes_nothing(tmp_path: Path,
                                                                root: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "net1").mkdir(parents=True)
    (outside / "net1" / "keep").write_text("x")
    outcome = dispatch.run(_request("DEL", outside, root), dispatch.ipam_verbs,
                                  log_line=False)
    status, answer = outcome.status, outcome.payload
    assert (status, answer) == (0, None)
    assert [p.name for p in (outside / "net1").iterdir()] == ["keep"]


def test_add_inside_allocates_under_the_resolved_path(root: Path) -> None:
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    outcome = dispatch.run(_request("ADD", root / "alias", root), dispatch.ipam_verbs,
                                  log_line=False)
    status, answer = outcome.status, outcome.payload
    assert status == 0 and answer is not None and answer["ips"]
    assert (root / "real" / "net1").is_dir()
