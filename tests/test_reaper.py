"""The agent's reaper: order, back-pressure and draining, with the kernel calls replaced
(e2e/test_agent.py deletes real retired links)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from cni_plugin.agent import reaper
from cni_plugin.kernel import netns
from cni_plugin.kernel.rtnl import Rtnl


class Recorder:
    """Stands in for the netlink deletion: records (thread, name), can be held."""

    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()

    def delete(self, _rtnl: Rtnl, name: str) -> bool:
        self.entered.set()
        self.release.wait(10)
        self.deleted.append((threading.current_thread().name, name))
        return True


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    found = Recorder()

    @contextmanager
    def no_netlink(*_args: object) -> Iterator[None]:
        yield None

    monkeypatch.setattr(reaper, "_delete", found.delete)
    monkeypatch.setattr(netns, "open_netlink", no_netlink)  # the module the reaper calls
    return found


def test_links_are_deleted_in_order_by_the_reaper_thread(recorder: Recorder) -> None:
    reaping = reaper.Reaper()
    for name in ("vpz1", "vpz2", "vpz3"):
        reaping.submit(name)
    assert reaping.drain(10)
    assert recorder.deleted == [("vpc-attach-reaper", n) for n in ("vpz1", "vpz2", "vpz3")]


def test_a_full_queue_makes_the_caller_delete_its_own(recorder: Recorder) -> None:
    recorder.release.clear()  # the reaper is stuck on its first link
    reaping = reaper.Reaper(max_pending=1)
    reaping.submit("vpz1")
    assert recorder.entered.wait(10)  # the reaper holds vpz1
    reaping.submit("vpz2")  # waits behind vpz1 (one pending)
    caller = threading.Thread(target=reaping.submit, args=("vpz3",), name="a-verb")
    caller.start()
    assert not reaping.drain(0.2)  # nothing moves while the first deletion hangs
    recorder.release.set()
    caller.join(10)
    assert reaping.drain(10)
    assert ("a-verb", "vpz3") in recorder.deleted
    assert [name for _, name in recorder.deleted if _ == "vpc-attach-reaper"] == ["vpz1", "vpz2"]
