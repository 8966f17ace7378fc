"""cni_plugin.core.locks: the one flock-with-timeout every lock of the project uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cni_plugin.core.locks import acquire, file_lock
from netconf.errors import TRY_AGAIN_LATER, CniError


def test_acquire_takes_a_free_lock_and_gives_up_on_a_held_one(tmp_path: Path) -> None:
    first = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    second = os.open(tmp_path / "lock", os.O_RDWR)  # its own open file: flock conflicts
    try:
        assert acquire(first, 1.0)
        assert not acquire(second, 0.1)
        os.close(first)  # releases
        first = -1
        assert acquire(second, 1.0)
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)


def test_file_lock_times_out_with_code_11_naming_the_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "locks" / "host.lock")
    with file_lock(path, 1.0), pytest.raises(CniError) as caught, file_lock(path, 0.1):
        pass
    assert caught.value.code == TRY_AGAIN_LATER and path in caught.value.msg
    with file_lock(path, 1.0):  # released on exit
        pass


def test_shared_holders_exclude_only_an_exclusive_one(tmp_path: Path) -> None:
    path = str(tmp_path / "locks" / "instance.lock")
    with file_lock(path, 1.0, shared=True), file_lock(path, 0.1, shared=True):
        with pytest.raises(CniError) as caught, file_lock(path, 0.1):
            pass
        assert caught.value.code == TRY_AGAIN_LATER
    with file_lock(path, 1.0), pytest.raises(CniError), file_lock(path, 0.1, shared=True):
        pass
    with file_lock(path, 1.0):  # every holder released on exit
        pass
