"""Map a Request to a verb and its outcome to (exit status, JSON answer).

Shared by every transport (the executables, the node agent). Any exception becomes a CNI error
object; a Python traceback is never an answer.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from cni_plugin.core import oplog
from cni_plugin.core.request import Request
from netconf.errors import INTERNAL_ERROR, CniError
from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS

if TYPE_CHECKING:
    from cni_plugin.verbs.collaborators import Collaborators
    from netconf.result import Result

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


# A verb's adapter: the request and the version to answer in -> the JSON answer, if any.
Handler = Callable[[Request, str], "dict[str, Any] | None"]


def run(request: Request, handler: Handler | None = None,
        log_line: bool = True) -> tuple[int, dict[str, Any] | None]:
    """Run the verb; (0, result-or-None) on success, (1, error object) on failure.

    `handler` defaults to the vpc-attach verbs with the executable's environment (see
    `plugin_verbs`); the agent passes them with its own, the IPAM plugin `ipam_verbs`.
    """
    started = time.monotonic()
    version = answer_version(request)
    code = 0
    message = ""
    try:
        payload = (handler or plugin_verbs())(request, version)
        status = 0
    except CniError as exc:
        code, message = exc.code, exc.msg
        payload, status = exc.to_dict(version), 1
    except Exception as exc:  # a bug: still one JSON answer, details in the log
        log.exception("unexpected failure in %s", request.command)
        err = CniError(INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}")
        code, message = err.code, err.msg
        payload, status = err.to_dict(version), 1
    if log_line:
        oplog.verb_line(request, code, message, time.monotonic() - started)
    return status, payload


def plugin_verbs(collaborators: Collaborators | None = None) -> Handler:
    """The vpc-attach verbs with what a transport lends them (default: the executable's),
    imported on use: VERSION loads none of them."""

    def handle(request: Request, version: str) -> dict[str, Any] | None:
        command = request.command
        if command == "VERSION":
            from cni_plugin.verbs.version import version as version_verb
            return version_verb()
        from cni_plugin.verbs.collaborators import Collaborators
        lent = collaborators or Collaborators()
        if command == "ADD":
            from cni_plugin.verbs.add import add
            return add(request, lent).to_wire(version)
        if command == "DEL":
            from cni_plugin.verbs.delete import delete
            delete(request, lent)
        elif command == "CHECK":
            from cni_plugin.verbs.check import check
            check(request, lent)
        elif command == "STATUS":
            from cni_plugin.verbs.status import status
            status(request, lent)
        elif command == "GC":
            from cni_plugin.verbs.gc import gc
            gc(request, lent)
        else:
            _unknown_command(request)
        return None

    return handle


def ipam_verbs(request: Request, version: str) -> dict[str, Any] | None:
    """The vpc-attach-ipam verbs."""
    from cni_plugin.ipam.plugin import verbs
    from cni_plugin.verbs.version import version as version_verb
    command = request.command
    if command == "VERSION":
        return version_verb()
    if command == "ADD":
        return ipam_to_wire(verbs.add(request), version)
    if command == "DEL":
        verbs.delete(request)
    elif command == "CHECK":
        verbs.check(request)
    elif command == "STATUS":
        verbs.status(request)
    elif command == "GC":
        verbs.gc(request)
    else:
        _unknown_command(request)
    return None


def ipam_to_wire(result: Result, version: str) -> dict[str, Any]:
    """An IPAM result in `version`: ips and routes, no empty interface or route lists."""
    data = result.to_wire(version)
    for key in ("interfaces", "routes"):
        if not data.get(key):
            data.pop(key, None)
    return data


def _unknown_command(request: Request) -> None:
    from netconf.runtime import RuntimeEnv
    RuntimeEnv.from_environ(request.environ)  # raises code 4 naming CNI_COMMAND


def serve_stdio(handler: Handler | None = None, log_line: bool = True) -> NoReturn:
    """The executable's transport: env + stdin in, one JSON document on stdout, exit status."""
    environ = dict(os.environ)
    # VERSION ignores stdin; every other verb reads the config from it.
    stdin = b"" if environ.get("CNI_COMMAND") == "VERSION" else sys.stdin.buffer.read()
    answer_stdio(environ, stdin, handler, log_line)


def answer_stdio(environ: dict[str, str], stdin: bytes, handler: Handler | None = None,
                 log_line: bool = True) -> NoReturn:
    """Run the verb in this process and answer on stdout with the exit status."""
    request = Request(environ=environ, stdin=stdin)
    oplog.configure(request)
    status, payload = run(request, handler, log_line)
    if payload is not None:
        sys.stdout.write(json.dumps(payload))
        sys.stdout.flush()
    sys.exit(status)
