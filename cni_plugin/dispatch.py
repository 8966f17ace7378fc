"""Map a Request to a verb and its outcome to (exit status, JSON answer).

Shared by every transport (the executable, the node agent). Any exception becomes a CNI error
object; a Python traceback is never an answer.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from cni_plugin import oplog
from cni_plugin.verbs.request import Request
from netconf.errors import INTERNAL_ERROR, CniError
from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS

log = logging.getLogger(__name__)


def answer_version(request: Request) -> str:
    """The cniVersion to answer in: the config's when supported, else the newest."""
    try:
        data = json.loads(request.stdin)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return CURRENT_VERSION
    version = None
    if isinstance(data, dict):  # keys match case-insensitively, as the config parser does
        version = next((v for k, v in data.items() if k.lower() == "cniversion"), None)
    return version if version in SUPPORTED_VERSIONS else CURRENT_VERSION


def run(request: Request) -> tuple[int, dict[str, Any] | None]:
    """Run the verb; (0, result-or-None) on success, (1, error object) on failure."""
    started = time.monotonic()
    version = answer_version(request)
    code = 0
    message = ""
    try:
        payload = _call(request, version)
        status = 0
    except CniError as exc:
        code, message = exc.code, exc.msg
        payload, status = exc.to_dict(version), 1
    except Exception as exc:  # a bug: still one JSON answer, details in the log
        log.exception("unexpected failure in %s", request.command)
        err = CniError(INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}")
        code, message = err.code, err.msg
        payload, status = err.to_dict(version), 1
    oplog.verb_line(request, code, message, time.monotonic() - started)
    return status, payload


def _call(request: Request, version: str) -> dict[str, Any] | None:
    command = request.command
    if command == "VERSION":
        from cni_plugin.verbs.version import version as version_verb
        return version_verb()
    if command == "ADD":
        from cni_plugin.verbs.add import add
        return add(request).to_wire(version)
    if command == "DEL":
        from cni_plugin.verbs.delete import delete
        delete(request)
    elif command == "CHECK":
        from cni_plugin.verbs.check import check
        check(request)
    elif command == "STATUS":
        from cni_plugin.verbs.status import status
        status(request)
    elif command == "GC":
        from cni_plugin.verbs.gc import gc
        gc(request)
    else:
        from netconf.runtime import RuntimeEnv
        RuntimeEnv.from_environ(request.environ)  # raises code 4 naming CNI_COMMAND
    return None
