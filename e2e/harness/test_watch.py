"""The admin client's watch recorder (`Kube.watching`) fails a test at once when the watch
fails, instead of letting it wait out its timeout: an ERROR event or a line that is no event
raises, and the recorded events raise when read afterwards; on the real API server, a watch
it ends before the block does fails the wait on it within seconds."""

from __future__ import annotations

import json
import time

import pytest

from e2e.harness.kube import Kube, WatchEvents, WatchFailed, watch_event
from e2e.harness.wait import wait_until

WAIT_S = 60.0  # what a test would wait on an event that never comes


def line(kind: str, obj: dict[str, object]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def test_an_event_is_its_type_and_object_name() -> None:
    assert watch_event(line("MODIFIED", {"metadata": {"name": "adv-1"}})) == \
        ("MODIFIED", "adv-1")


def test_an_error_event_raises_with_the_api_servers_reason() -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired",
            "message": "too old resource version: 5 (200)"}
    with pytest.raises(WatchFailed, match="ERROR event: 410 Expired: too old resource"):
        watch_event(line("ERROR", gone))


@pytest.mark.parametrize("raw", [b"not json", b'{"type": "ADDED"}', b"[1, 2]"])
def test_a_line_that_is_no_event_raises(raw: bytes) -> None:
    with pytest.raises(WatchFailed, match="not a watch event"):
        watch_event(raw)


def test_recorded_events_read_as_a_sequence_until_the_watch_fails() -> None:
    events = WatchEvents("/apis/x/v1/things")
    events.record(("ADDED", "a"))
    events.record(("MODIFIED", "a"))
    assert ("MODIFIED", "a") in events and events.index(("MODIFIED", "a")) == 1
    assert list(events) == [("ADDED", "a"), ("MODIFIED", "a")] and len(events) == 2
    events.failure = "WatchFailed: ERROR event: 410 Expired"
    with pytest.raises(WatchFailed, match=r"the watch of /apis/x/v1/things failed: .*410"):
        _ = ("DELETED", "a") in events  # what a test's wait_until condition does
    assert "failed: WatchFailed" in repr(events)  # still printable for the failure message


@pytest.mark.cluster
def test_a_watch_the_api_server_ends_fails_a_wait_on_it_long_before_its_timeout(
        kube: Kube) -> None:
    started = time.monotonic()
    with kube.watching("/api/v1/namespaces/default/configmaps", window_s=2) as events, \
            pytest.raises(WatchFailed, match="ended the watch within 2 s"):
        wait_until("an event that never comes", lambda: ("ADDED", "never") in events, WAIT_S)
    assert time.monotonic() - started < WAIT_S / 2
