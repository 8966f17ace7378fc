"""Map a Request to a verb and its outcome to (exit status, JSON answer).

Shared by every transport (the executables through `stdio.py`, the node agent). Any exception
becomes a CNI error object; a Python traceback is never an answer.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

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


class VerbSet(Protocol):
    """The verbs of one plugin besides VERSION (the `cni_plugin.ipam.plugin.verbs` module is
    one)."""

    def add(self, request: Request) -> Result:
        """ADD: the result."""

    def delete(self, request: Request) -> None:
        """DEL."""

    def check(self, request: Request) -> None:
        """CHECK."""

    def status(self, request: Request) -> None:
        """STATUS."""

    def gc(self, request: Request) -> None:
        """GC."""


def _dispatch(request: Request, version: str, verbs: Callable[[], VerbSet],
              to_wire: Callable[[Result, str], dict[str, Any]]) -> dict[str, Any] | None:
    """Run the request's verb of `verbs()` (loaded unless it is VERSION); ADD's result in
    `version`, via to_wire."""
    command = request.command
    if command == "VERSION":
        from cni_plugin.verbs.version import version as version_verb
        return version_verb()
    if command == "ADD":
        return to_wire(verbs().add(request), version)
    if command not in ("DEL", "CHECK", "STATUS", "GC"):
        _unknown_command(request)
        return None
    loaded = verbs()
    {"DEL": loaded.delete, "CHECK": loaded.check, "STATUS": loaded.status,
     "GC": loaded.gc}[command](request)
    return None


class _PluginVerbs:
    """The vpc-attach verbs with what a transport lends them, each imported on use."""

    def __init__(self, collaborators: Collaborators) -> None:
        self.lent = collaborators

    def add(self, request: Request) -> Result:
        from cni_plugin.verbs.add import add
        return add(request, self.lent)

    def delete(self, request: Request) -> None:
        from cni_plugin.verbs.delete import delete
        delete(request, self.lent)

    def check(self, request: Request) -> None:
        from cni_plugin.verbs.check import check
        check(request, self.lent)

    def status(self, request: Request) -> None:
        from cni_plugin.verbs.status import status
        status(request, self.lent)

    def gc(self, request: Request) -> None:
        from cni_plugin.verbs.gc import gc
        gc(request, self.lent)


def plugin_verbs(collaborators: Collaborators | None = None) -> Handler:
    """The vpc-attach verbs with what a transport lends them (default: the executable's),
    imported on use: VERSION loads none of them."""

    def verbs() -> VerbSet:
        from cni_plugin.verbs.collaborators import Collaborators
        return _PluginVerbs(collaborators or Collaborators())

    def handle(request: Request, version: str) -> dict[str, Any] | None:
        return _dispatch(request, version, verbs, lambda result, v: result.to_wire(v))

    return handle


def ipam_verbs(request: Request, version: str) -> dict[str, Any] | None:
    """The vpc-attach-ipam verbs."""

    def verbs() -> VerbSet:
        from cni_plugin.ipam.plugin import verbs
        return verbs

    return _dispatch(request, version, verbs, ipam_to_wire)


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
