"""hostfilter.ensure takes back only the table its own failed install may have left: nft can
commit and still miss its bound (a busy machine's emulated VM), and a table without its mark
rule would stay until the next ADD."""

from __future__ import annotations

import pytest

from cni_plugin.kernel import hostfilter
from netconf.errors import KERNEL_FAILURE, CniError
from netconf.node_groups import DatapathSettings


def _arrange(monkeypatch: pytest.MonkeyPatch, before: hostfilter.State,
             fails: bool) -> list[str]:
    done: list[str] = []
    monkeypatch.setattr(hostfilter, "state", lambda deadline=None: before)

    def install(settings: DatapathSettings, deadline: object = None) -> bool:
        done.append("install")
        if fails:
            raise CniError(KERNEL_FAILURE, "nft -f - did not finish within 1.0s")
        return True

    monkeypatch.setattr(hostfilter, "install", install)
    monkeypatch.setattr(hostfilter, "_delete_table", lambda: done.append("delete"))
    return done


def test_a_failed_install_where_there_was_no_table_takes_the_table_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done = _arrange(monkeypatch, hostfilter.State(False, False), fails=True)
    with pytest.raises(CniError, match="did not finish"):
        hostfilter.ensure(DatapathSettings)
    assert done == ["install", "delete"]


def test_a_failed_install_over_a_table_that_was_there_leaves_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done = _arrange(monkeypatch, hostfilter.State(True, False), fails=True)
    with pytest.raises(CniError):
        hostfilter.ensure(DatapathSettings)
    assert done == ["install"]


def test_an_install_that_succeeds_keeps_its_table_and_a_complete_one_is_not_rewritten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done = _arrange(monkeypatch, hostfilter.State(False, False), fails=False)
    assert hostfilter.ensure(DatapathSettings) is True
    assert done == ["install"]
    done = _arrange(monkeypatch, hostfilter.State(True, True), fails=False)
    assert hostfilter.ensure(DatapathSettings) is False
    assert done == []
