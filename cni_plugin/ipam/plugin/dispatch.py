"""Map a Request to an IPAM verb and its outcome to (exit status, JSON answer).

Any exception becomes a CNI error object; a Python traceback is never an answer.
"""

from __future__ import annotations

import logging
from typing import Any

from cni_plugin import dispatch
from cni_plugin.core.request import Request
from cni_plugin.ipam.plugin import verbs
from cni_plugin.verbs.version import version as version_answer
from netconf.result import Result
from netconf.runtime import RuntimeEnv

log = logging.getLogger(__name__)


def run(request: Request) -> tuple[int, dict[str, Any] | None]:
    """Run an IPAM verb; (0, result-or-None) on success, (1, error object) on failure."""
    return dispatch.run(request, ipam_verbs, log_line=False)


def to_wire(result: Result, version: str) -> dict[str, Any]:
    """An IPAM result in `version`: ips and routes, no empty interface or route lists."""
    data = result.to_wire(version)
    for key in ("interfaces", "routes"):
        if not data.get(key):
            data.pop(key, None)
    return data


def ipam_verbs(request: Request, version: str) -> dict[str, Any] | None:
    """The vpc-attach-ipam verbs."""
    command = request.command
    if command == "VERSION":
        return version_answer()
    if command == "ADD":
        return to_wire(verbs.add(request), version)
    if command == "DEL":
        verbs.delete(request)
    elif command == "CHECK":
        verbs.check(request)
    elif command == "STATUS":
        verbs.status(request)
    elif command == "GC":
        verbs.gc(request)
    else:
        RuntimeEnv.from_environ(request.environ)  # raises code 4 naming CNI_COMMAND
    return None
