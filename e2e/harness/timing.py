"""Where a pytest pass's minutes went: seconds per test module (set-up, call and teardown of its
tests, module and session fixtures included where they fell), the largest first, with the
full-kernel VM's modules apart (they run beside the others, in the VM's own time).

Loaded for every pytest run (pyproject's ``addopts``); printed at the end of the run, so a CI
log says which modules to look at when the run's budget tightens.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

SHOWN = 15  # modules listed per part


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Seconds per module, native and in the VM apart, the SHOWN largest of each."""
    from e2e.harness.vm.pytest_plugin import vm_nodeids

    in_vm = vm_nodeids(config)
    seconds: dict[bool, dict[str, float]] = {False: defaultdict(float), True: defaultdict(float)}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid, duration = getattr(report, "nodeid", ""), getattr(report, "duration", None)
            if nodeid and isinstance(duration, float):
                seconds[nodeid in in_vm][nodeid.split("::")[0]] += duration
    for vm, title in ((False, "seconds per test module"),
                      (True, "seconds per test module in the full-kernel VM")):
        if not seconds[vm]:
            continue
        ranked = sorted(seconds[vm].items(), key=lambda item: -item[1])
        terminalreporter.write_sep("-", f"{title}: {sum(seconds[vm].values()):.0f} s in all")
        for module, spent in ranked[:SHOWN]:
            terminalreporter.write_line(f"{spent:8.1f} s  {module}")
