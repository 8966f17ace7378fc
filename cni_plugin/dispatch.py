"""Map a Request to a verb and its outcome to (exit status, JSON answer).

Shared by every transport (the executables through `stdio.py`, the node agent). A plugin's
verbs are one table, CNI_COMMAND → verb, and each verb imports its module when it runs, so
VERSION loads none of the others. Any exception becomes a CNI error object; a Python traceback
is never an answer.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from cni_plugin.core import oplog
from cni_plugin.core.request import Request
from netconf.errors import INTERNAL_ERROR, CniError
from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS

if TYPE_CHECKING:
    from cni_plugin.verbs.collaborators import Collaborators
    from netconf.result import Result

log = logging.getLogger(__name__)

# A verb as `run` calls it: the request and the cniVersion to answer in -> the JSON answer, if
# any.
Verb = Callable[[Request, str], "dict[str, Any] | None"]
# One plugin's verbs by CNI_COMMAND.
Verbs = Mapping[str, Verb]


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


def run(request: Request, verbs: Verbs | None = None,
        log_line: bool = True) -> tuple[int, dict[str, Any] | None]:
    """Run the request's verb of `verbs`; (0, result-or-None) on success, (1, error object) on
    failure.

    `verbs` defaults to the vpc-attach verbs with the executable's collaborators (see
    `plugin_verbs`); the agent passes them with its own, the IPAM plugin `ipam_verbs`.
    """
    started = time.monotonic()
    version = answer_version(request)
    code = 0
    message = ""
    try:
        verb = (verbs or plugin_verbs()).get(request.command, _unknown_command)
        payload = verb(request, version)
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


def _version_verb(_request: Request, _version: str) -> dict[str, Any]:
    from cni_plugin.verbs.version import version
    return version()


def plugin_verbs(collaborators: Collaborators | None = None) -> dict[str, Verb]:
    """The vpc-attach verbs with what a transport lends them (default: the executable's)."""

    def lent() -> Collaborators:
        from cni_plugin.verbs.collaborators import Collaborators
        return collaborators or Collaborators()

    def add(request: Request, version: str) -> dict[str, Any]:
        from cni_plugin.verbs.add import add
        return add(request, lent()).to_wire(version)

    def delete(request: Request, _version: str) -> None:
        from cni_plugin.verbs.delete import delete
        delete(request, lent())

    def check(request: Request, _version: str) -> None:
        from cni_plugin.verbs.check import check
        check(request, lent())

    def status(request: Request, _version: str) -> None:
        from cni_plugin.verbs.status import status
        status(request, lent())

    def gc(request: Request, _version: str) -> None:
        from cni_plugin.verbs.gc import gc
        gc(request, lent())

    return {"VERSION": _version_verb, "ADD": add, "DEL": delete, "CHECK": check, "STATUS": status,
            "GC": gc}


def _ipam_add(request: Request, version: str) -> dict[str, Any]:
    from cni_plugin.ipam.plugin.verbs import add
    return ipam_to_wire(add(request), version)


def _ipam_delete(request: Request, _version: str) -> None:
    from cni_plugin.ipam.plugin.verbs import delete
    delete(request)


def _ipam_check(request: Request, _version: str) -> None:
    from cni_plugin.ipam.plugin.verbs import check
    check(request)


def _ipam_status(request: Request, _version: str) -> None:
    from cni_plugin.ipam.plugin.verbs import status
    status(request)


def _ipam_gc(request: Request, _version: str) -> None:
    from cni_plugin.ipam.plugin.verbs import gc
    gc(request)


# The vpc-attach-ipam verbs.
ipam_verbs: Verbs = {"VERSION": _version_verb, "ADD": _ipam_add, "DEL": _ipam_delete,
                     "CHECK": _ipam_check, "STATUS": _ipam_status, "GC": _ipam_gc}


def ipam_to_wire(result: Result, version: str) -> dict[str, Any]:
    """An IPAM result in `version`: ips and routes, no empty interface or route lists."""
    data = result.to_wire(version)
    for key in ("interfaces", "routes"):
        if not data.get(key):
            data.pop(key, None)
    return data


def _unknown_command(request: Request, _version: str) -> None:
    from netconf.runtime import RuntimeEnv
    RuntimeEnv.from_environ(request.environ)  # raises code 4 naming CNI_COMMAND
