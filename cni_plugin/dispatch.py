"""Map a Request to a verb and return its `Outcome`.

Shared by every transport (the executables through `stdio.py`, the node agent). The request is
validated once, here, into the verbs' typed input (an `Invocation` for vpc-attach); the
`Outcome` carries it to whatever reads the invocation after the answer (the log line, the
agent's metrics and Events), so none of them decodes stdin or CNI_ARGS again. A plugin's verbs
are one table, CNI_COMMAND → verb, and each verb imports its module when it runs, so VERSION
loads none of the others. Any exception becomes a CNI error object; a Python traceback is never
an answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from cni_plugin.core import oplog
from cni_plugin.core.request import Invocation, Request
from netconf.errors import INTERNAL_ERROR, CniError
from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS

if TYPE_CHECKING:
    from cni_plugin.verbs.collaborators import Collaborators
    from netconf.result import Result

log = logging.getLogger(__name__)
Parsed = TypeVar("Parsed")
# A verb's JSON answer, if it has one (ADD's result; the others answer nothing on success).
Answer = dict[str, Any] | None


def _forgives_nothing(_request: Request, _exc: CniError) -> bool:
    return False


@dataclass(frozen=True)
class Verbs(Generic[Parsed]):
    """One executable's verbs by CNI_COMMAND (VERSION is answered here), and how a request
    becomes their input: parsed once, before any verb runs."""

    parse: Callable[[Request], Parsed]
    # A verb as `run` calls it: its parsed input and the cniVersion to answer in.
    by_command: Mapping[str, Callable[[Parsed, str], Answer]]
    # Whether a request that does not parse is answered as success, nothing done (DEL).
    forgives: Callable[[Request, CniError], bool] = _forgives_nothing


@dataclass(frozen=True)
class Outcome:
    """What one invocation came to: the answer, and what it was about."""

    request: Request
    # The validated vpc-attach invocation; None when it did not parse (or for VERSION, and the
    # IPAM plugin's verbs, which have their own).
    invocation: Invocation | None
    status: int  # the exit status: 0 success, 1 a CNI error
    payload: Answer  # the JSON answer: the result, the error object, or nothing
    code: int = 0  # the CNI error code (0 on success)
    message: str = ""  # the CNI error message
    seconds: float = 0.0  # from receiving the request to the answer

    @property
    def command(self) -> str:
        """CNI_COMMAND as the runtime sent it."""
        return self.request.command


def reply_version(request: Request) -> str:
    """The cniVersion the answer is written in: the config's when supported, else the newest
    (not the VERSION verb, which lists every version we speak)."""
    # keys match case-insensitively, as the config parser does
    version = next((value for key, value in request.readable_config().items()
                    if key.lower() == "cniversion"), None)
    return version if version in SUPPORTED_VERSIONS else CURRENT_VERSION


def run(request: Request, verbs: Verbs[Any] | None = None, log_line: bool = True) -> Outcome:
    """Parse the request, run its verb of `verbs` and say how it went (status 0 with the
    result or nothing; status 1 with the error object).

    `verbs` defaults to the vpc-attach verbs with the executable's collaborators (see
    `plugin_verbs`); the agent passes them with its own, the IPAM plugin `ipam_verbs`.
    """
    started = time.monotonic()
    table = verbs or plugin_verbs()
    version = CURRENT_VERSION
    parsed: Any = None
    code, message = 0, ""
    try:
        if request.command == "VERSION":  # stdin ignored: nothing to parse
            payload = _version()
        else:
            version = reply_version(request)
            verb = table.by_command.get(request.command)
            if verb is None:
                _refuse_command(request)
            try:
                parsed = table.parse(request)
            except CniError as exc:
                if not table.forgives(request, exc):
                    raise
                payload = None
            else:
                payload = verb(parsed, version)
        status = 0
    except CniError as exc:
        code, message = exc.code, exc.msg
        payload, status = exc.to_dict(version), 1
    except Exception as exc:  # a bug: still one JSON answer, details in the log
        log.exception("unexpected failure in %s", request.command)
        err = CniError(INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}")
        code, message = err.code, err.msg
        payload, status = err.to_dict(version), 1
    outcome = Outcome(request, parsed if isinstance(parsed, Invocation) else None, status,
                      payload, code, message, time.monotonic() - started)
    if log_line:
        oplog.verb_line(request, outcome.invocation, code, message, outcome.seconds)
    return outcome


def _version() -> dict[str, Any]:
    from cni_plugin.verbs.version import version
    return version()


def plugin_verbs(collaborators: Collaborators | None = None) -> Verbs[Invocation]:
    """The vpc-attach verbs with what a transport lends them (default: the executable's)."""

    def lent() -> Collaborators:
        from cni_plugin.verbs.collaborators import Collaborators
        return collaborators or Collaborators()

    def add(inv: Invocation, version: str) -> dict[str, Any]:
        from cni_plugin.verbs.add import add
        return add(inv, lent()).to_wire(version)

    def delete(inv: Invocation, _version: str) -> None:
        from cni_plugin.verbs.delete import delete
        delete(inv, lent())

    def check(inv: Invocation, _version: str) -> None:
        from cni_plugin.verbs.check import check
        check(inv, lent())

    def status(inv: Invocation, _version: str) -> None:
        from cni_plugin.verbs.status import status
        status(inv, lent())

    def gc(inv: Invocation, _version: str) -> None:
        from cni_plugin.verbs.gc import gc
        gc(inv, lent())

    def forgives(request: Request, exc: CniError) -> bool:
        if request.command != "DEL":
            return False
        from cni_plugin.verbs.delete import forgives_unusable_config
        return forgives_unusable_config(exc)

    return Verbs(Invocation.parse, {"ADD": add, "DEL": delete, "CHECK": check,
                                    "STATUS": status, "GC": gc}, forgives)


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


def _as_received(request: Request) -> Request:
    return request


# The vpc-attach-ipam verbs. They validate their own IPAM config (`IpamInvocation`) from the
# request, whose config and CNI_ARGS are decoded once for them and this dispatcher alike.
ipam_verbs: Verbs[Request] = Verbs(_as_received, {
    "ADD": _ipam_add, "DEL": _ipam_delete, "CHECK": _ipam_check, "STATUS": _ipam_status,
    "GC": _ipam_gc})


def ipam_to_wire(result: Result, version: str) -> dict[str, Any]:
    """An IPAM result in `version`: ips and routes, no empty interface or route lists."""
    data = result.to_wire(version)
    for key in ("interfaces", "routes"):
        if not data.get(key):
            data.pop(key, None)
    return data


def _refuse_command(request: Request) -> NoReturn:
    from netconf.runtime import RuntimeEnv
    RuntimeEnv.from_environ(request.environ)  # code 4 naming CNI_COMMAND
    raise AssertionError(f"CNI_COMMAND {request.command!r} has no verb")
