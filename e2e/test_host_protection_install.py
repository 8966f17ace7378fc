"""The host protection table against the real kernel and nft, in a scratch network namespace:
an install that fails after nft committed (its mark rule refused, or nft past its bound) takes
the table back where there was none, and leaves one that was there (SPEC §14's table, created-
only rollback)."""

from __future__ import annotations

import pytest

from cni_plugin.kernel import hostfilter, netns
from netconf.errors import KERNEL_FAILURE, CniError
from netconf.node_groups import DatapathSettings


def _mark_rule_refused(deadline: object) -> None:
    raise CniError(KERNEL_FAILURE, "failed to add the mark rule to nftables chain 'vpc_mark'")


def test_a_failed_install_takes_back_the_table_nft_committed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with netns.scratch():
        monkeypatch.setattr(hostfilter, "_add_mark_rule", _mark_rule_refused)
        with pytest.raises(CniError, match="mark rule"):
            hostfilter.ensure(DatapathSettings)
        assert hostfilter.state() == hostfilter.State(False, False)
        # The control: a table that was there (incomplete) before the failed install stays.
        hostfilter._nft(["-f", "-"], hostfilter.ruleset(DatapathSettings()), None)
        with pytest.raises(CniError, match="mark rule"):
            hostfilter.ensure(DatapathSettings)
        assert hostfilter.state() == hostfilter.State(True, False)
        monkeypatch.undo()
        assert hostfilter.ensure(DatapathSettings) is True
        assert hostfilter.state() == hostfilter.State(True, True)
