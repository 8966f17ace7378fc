"""Link events of the host's netns and a Pod's, as `ip -o monitor link` prints them, while a
block runs: what a verb made, even for a moment (a rollback removes it again)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable

from e2e.harness.kernel import run_ip
from e2e.harness.wait import wait_until


class LinkEvents:
    """Every link event (`ip -o monitor link`) in the host's netns and in a Pod's while the block
    runs; a link of our own marks the start and the end in each, so none in between is
    missed (the monitor is listening before the first mark, and has read all before the last)."""

    def __init__(self, netns: str) -> None:
        self.names: dict[str, str | None] = {"host": None, "pod": os.path.basename(netns)}
        self.lines: dict[str, list[str]] = {"host": [], "pod": []}
        self._monitors: list[tuple[subprocess.Popen[str], threading.Thread]] = []

    def __enter__(self) -> LinkEvents:
        for where, name in self.names.items():
            args = ["ip", *(["-n", name] if name else []), "-o", "monitor", "link"]
            monitor = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
            reader = threading.Thread(target=self._read, args=(monitor, self.lines[where]),
                                      daemon=True)
            reader.start()
            self._monitors.append((monitor, reader))
        self._mark("vpa-rt-begin")
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self._mark("vpa-rt-end")
        finally:
            for monitor, reader in self._monitors:
                monitor.terminate()
                monitor.wait(10)
                reader.join(10)

    @staticmethod
    def _read(monitor: subprocess.Popen[str], lines: list[str]) -> None:
        assert monitor.stdout is not None
        for line in monitor.stdout:
            lines.append(line)

    def _mark(self, mark: str) -> None:
        for where, name in self.names.items():
            wait_until(f"the {where} monitor to see {mark}", self._marked(where, name, mark),
                       interval=0.5)

    def _marked(self, where: str, name: str | None, mark: str) -> Callable[[], bool]:
        """Whether the monitor of `where` saw `mark`; if not yet, the mark made (again). A
        monitor just started may not be listening yet when the first mark comes and goes (the
        agent pass of a busy run missed it: 60 s without the event), so it is made until seen;
        `between_marks` counts from the last begin mark."""
        netns = ["-n", name] if name else []
        seeing = self._seeing(where, mark)

        def marked() -> bool:
            if seeing():
                return True
            # A veth pair: every kernel the tests run on has veth (not always dummy).
            run_ip(*netns, "link", "add", mark, "type", "veth", "peer", "name", f"{mark}-p")
            run_ip(*netns, "link", "del", mark)
            return False
        return marked

    def _seeing(self, where: str, mark: str) -> Callable[[], bool]:
        lines = self.lines[where]
        return lambda: any(mark in line for line in lines)

    def between_marks(self, where: str) -> list[str]:
        """The events of `where` ("host", "pod") between the marks, the marks left out."""
        lines = self.lines[where]
        first = max(i for i, line in enumerate(lines) if "vpa-rt-begin" in line)
        last = min(i for i, line in enumerate(lines) if "vpa-rt-end" in line)
        return lines[first + 1:last]
