"""Operator logs: one JSON line per verb, to the configured file; never stdout, never secrets."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from cni_plugin.verbs.request import Request

_configured: dict[str, Any] = {}


def _log_file(request: Request) -> str | None:
    # Cheap precedence (env, then host file) — the stanza may not even parse.
    path = request.environ.get("VPC_ATTACH_LOG_FILE")
    if path:
        return path
    try:
        with open(request.environ.get("VPC_ATTACH_HOST_CONFIG") or "/etc/vpc-attach/host.json",
                  encoding="utf-8") as handle:
            value = json.load(handle).get("logFile")
            return value if isinstance(value, str) else None
    except (OSError, ValueError, AttributeError):
        return None


def configure(request: Request) -> None:
    """Send Python logging to the log file (or stderr); idempotent per file."""
    path = _log_file(request)
    level = (request.environ.get("VPC_ATTACH_LOG_LEVEL") or "info").upper()
    if _configured.get("path") == path and path is not None:
        return
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler
    try:
        handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
    except OSError:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "INFO")
    _configured["path"] = path


def verb_line(request: Request, code: int, message: str, seconds: float) -> None:
    """Append the one-line summary of a verb to the log file, if one is configured."""
    path = _log_file(request)
    if not path:
        return
    env = request.environ
    args = dict(kv.split("=", 1) for kv in env.get("CNI_ARGS", "").split(";") if "=" in kv)
    line = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
        "verb": request.command,
        "containerID": env.get("CNI_CONTAINERID", ""),
        "ifname": env.get("CNI_IFNAME", ""),
        "pod": f"{args.get('K8S_POD_NAMESPACE', '')}/{args.get('K8S_POD_NAME', '')}".strip("/"),
        "outcome": "ok" if code == 0 else "error",
        "code": code,
        "error": message,
        "durationMs": round(seconds * 1000, 1),
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # logging must never change the answer
