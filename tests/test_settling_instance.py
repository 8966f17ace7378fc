"""Settling the instance (`publishing.SettlingInstance`): the VPC's BGPVRFInstance is settled on a
thread of its own while IPAM and the kernel work run; whatever happens in that block, a
rollback after it finds everything the thread created, and the thread's error reaches the
verb."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.rollback import Rollback
from cni_plugin.publish import publisher as publishing
from cni_plugin.publish.bgp import advertisement, instance
from cni_plugin.publish.context import PublishContext, Router
from netconf.errors import INVALID_CONFIG, CniError

ROUTER = Router("router-worker-1", 65000, None, None)


def fake_context() -> PublishContext:
    inv = SimpleNamespace(deadline=Deadline(5), final_deadline=Deadline(6))
    return cast(PublishContext, SimpleNamespace(inv=inv))


@pytest.fixture(autouse=True)
def no_instance_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def held(_ctx: Any, _deadline: Any) -> Iterator[None]:
        yield

    monkeypatch.setattr(instance, "instance_in_use", held)
    monkeypatch.setattr(advertisement, "read_advertisement", lambda _ctx, _deadline: None)


def test_a_failure_in_the_block_waits_for_the_thread_so_the_rollback_undoes_its_create(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel work fails while the thread is still creating the instance: the block's end
    waits for the thread, so the rollback that follows deletes the instance it created."""
    creating, joining = threading.Event(), threading.Event()
    undone: list[str] = []
    wait = publishing.SettlingInstance.wait

    def block_end_waits(settling: publishing.SettlingInstance) -> None:
        joining.set()
        wait(settling)

    def create_instance(_ctx: Any, _router: Router, rollback: Rollback,
                        _deadline: Deadline) -> int:
        creating.set()
        assert joining.wait(5)  # its answer comes once the failed block's end waits for it
        rollback.created("BGPVRFInstance 3e-worker-1", lambda _d: undone.append("instance"))
        return 7

    monkeypatch.setattr(instance, "ensure_vrf_instance", create_instance)
    monkeypatch.setattr(publishing.SettlingInstance, "wait", block_end_waits)
    publisher = publishing.Publisher(fake_context(), ROUTER)
    with pytest.raises(CniError, match="kernel"), Rollback(Deadline(6)) as rollback, \
            publisher.api_settle_instance_thread(rollback):
        assert creating.wait(5)
        raise CniError(11, "kernel: the link vanished")
    assert joining.is_set() and undone == ["instance"]


def test_the_threads_error_is_raised_to_the_verb(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_router(_ctx: Any, _router: Router, _rollback: Rollback, _deadline: Deadline) -> int:
        raise CniError(INVALID_CONFIG, "BGPVRFInstance refused")

    monkeypatch.setattr(instance, "ensure_vrf_instance", no_router)
    settling = publishing.SettlingInstance(fake_context(), ROUTER, Rollback(Deadline(6)))
    with pytest.raises(CniError, match="refused") as caught:
        settling.result()
    assert caught.value.code == INVALID_CONFIG


def test_the_thread_hands_over_the_vrf_id_and_the_advertisement_it_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instance, "ensure_vrf_instance", lambda *_: 9)
    found = advertisement.Found({"metadata": {"name": "3e-3e-worker-1"}})
    monkeypatch.setattr(advertisement, "read_found", lambda *_: found)
    settling = publishing.SettlingInstance(fake_context(), ROUTER, Rollback(Deadline(6)))
    assert settling.result() == (9, found)
