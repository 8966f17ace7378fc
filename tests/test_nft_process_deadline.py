"""Without libnftables, `kernel.nftables.Nft` runs each script as an `nft -f -` process: that
process is bounded by the deadline of the run that starts it, not by the one the context was
made with (a context the agent keeps across passes outlives its first pass's deadline)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel import nftables

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None,
                                reason="runs the real nft as root")


@pytest.fixture
def timeouts(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The real nft process runs; the timeout each run was given is kept."""
    monkeypatch.setattr(nftables, "_library", lambda: None)  # the process fallback
    real = subprocess.run
    seen: list[float] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["timeout"])
        return real(*args, **kwargs)
    monkeypatch.setattr(subprocess, "run", recording)  # nftables calls subprocess.run
    return seen


def test_a_run_is_bounded_by_its_own_deadline_not_the_contexts_expired_one(
        timeouts: list[float]) -> None:
    made_with = Deadline(0.0)  # long gone by the next pass
    nft = nftables.Nft(None, made_with)
    nft.run("list tables\n", Deadline(30))
    assert 25 < timeouts[-1] <= 30
    nft.run("list tables\n")  # no deadline of its own: the context's
    assert timeouts[-1] == pytest.approx(0.1)
    nftables.Nft(None).run("list tables\n")  # none at all: outside a verb
    assert timeouts[-1] == nftables.NFT_TIMEOUT
