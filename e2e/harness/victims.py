"""What a tenant's network config points the plugin at, to prove it is left alone (SPEC §14): a
file with content and a Unix socket that counts connections and never answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PRECIOUS = "root:$6$do-not-touch:19000:0:99999:7:::\n" * 8


class Listener:
    """A Unix socket that accepts, keeps and counts connections, and never answers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.accepted: list[socket.socket] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(16)
        self._sock.settimeout(0.1)  # how soon close() is noticed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self.accepted.append(self._sock.accept()[0])
            except TimeoutError:
                continue

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._stop.set()
        self._thread.join(5)
        for conn in self.accepted:
            conn.close()
        self._sock.close()


@dataclass
class Victims:
    """A file with content (`precious.conf`, mode 0600) and a listener (`agent.sock`), alone
    in their directory."""

    directory: Path
    file: Path
    listener: Listener

    def assert_untouched(self) -> None:
        """Same content and mode, nothing beside them, never connected to."""
        assert self.file.read_text() == PRECIOUS
        assert self.file.stat().st_mode & 0o777 == 0o600
        assert sorted(p.name for p in self.directory.iterdir()) == ["agent.sock", "precious.conf"]
        assert self.listener.accepted == [], "the plugin connected to the tenant's socket"


@contextmanager
def planted_victims(directory: Path) -> Iterator[Victims]:
    """Victims made in directory (created), the listener closed afterwards."""
    directory.mkdir()
    precious = directory / "precious.conf"
    precious.write_text(PRECIOUS)
    precious.chmod(0o600)
    listener = Listener(directory / "agent.sock")
    try:
        yield Victims(directory, precious, listener)
    finally:
        listener.close()
