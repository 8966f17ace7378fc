"""Figures a test module reports at the end of the run (quoted in issues' closing notes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def report(config: pytest.Config, title: str, path: Path, figures: dict[str, Any],
           headline: dict[str, Any] | None = None) -> None:
    """Write `figures` to `path` as JSON and show `headline` (default: all of them) in the
    terminal summary, even when every test passed."""
    path.write_text(json.dumps(figures, indent=2) + "\n")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n{title} ({path}):\n"
                                f"{json.dumps(figures if headline is None else headline)}")
