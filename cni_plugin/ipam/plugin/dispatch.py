"""Map a Request to an IPAM verb and its outcome to (exit status, JSON answer).

Any exception becomes a CNI error object; a Python traceback is never an answer.
"""

from __future__ import annotations

import logging
from typing import Any

from cni_plugin.dispatch import answer_version
from cni_plugin.ipam.plugin import verbs
from cni_plugin.verbs.request import Request
from cni_plugin.verbs.version import version as version_answer
from netconf.errors import INTERNAL_ERROR, CniError
from netconf.result import Result
from netconf.runtime import RuntimeEnv

log = logging.getLogger(__name__)


def run(request: Request) -> tuple[int, dict[str, Any] | None]:
    """Run the verb; (0, result-or-None) on success, (1, error object) on failure."""
    version = answer_version(request)
    try:
        return 0, _call(request, version)
    except CniError as exc:
        log.info("%s failed: %s (%s)", request.command, exc.msg, exc.details)
        return 1, exc.to_dict(version)
    except Exception as exc:  # a bug: still one JSON answer, details in the log
        log.exception("unexpected failure in %s", request.command)
        err = CniError(INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}")
        return 1, err.to_dict(version)


def to_wire(result: Result, version: str) -> dict[str, Any]:
    """An IPAM result in `version`: ips and routes, no empty interface or route lists."""
    data = result.to_wire(version)
    for key in ("interfaces", "routes"):
        if not data.get(key):
            data.pop(key, None)
    return data


def _call(request: Request, version: str) -> dict[str, Any] | None:
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
