"""The executables' transport: env + stdin in, one JSON document on stdout, the exit status."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn

from cni_plugin.core import oplog
from cni_plugin.core.request import Request
from cni_plugin.dispatch import Verbs, run


def serve_stdio(verbs: Verbs[Any] | None = None, log_line: bool = True) -> NoReturn:
    """Read this process's env and stdin, run the verb, answer on stdout and exit."""
    environ = dict(os.environ)
    # VERSION ignores stdin; every other verb reads the config from it.
    stdin = b"" if environ.get("CNI_COMMAND") == "VERSION" else sys.stdin.buffer.read()
    answer_stdio(environ, stdin, verbs, log_line)


def answer_stdio(environ: dict[str, str], stdin: bytes, verbs: Verbs[Any] | None = None,
                 log_line: bool = True) -> NoReturn:
    """Run the verb in this process and answer on stdout with the exit status."""
    request = Request(environ=environ, stdin=stdin)
    oplog.configure(request)
    outcome = run(request, verbs, log_line)
    if outcome.payload is not None:
        sys.stdout.write(json.dumps(outcome.payload))
        sys.stdout.flush()
    sys.exit(outcome.status)
