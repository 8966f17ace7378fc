"""Operator logs: JSON lines in the configured log file — never stdout, never a credential.

Every verb writes exactly one summary line (ts, verb, containerID, ifname, pod, outcome, code,
error, durationMs); warnings and details of the same invocation are JSON lines too, so one
`jq` reads the whole file. Without a log file, only warnings go to stderr (which runtimes
show next to a failed sandbox).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from cni_plugin.core.request import Request
from netconf.host import DEFAULT_HOST_CONFIG, HOST_CONFIG_ENV, LOG_LEVELS

_configured: dict[str, Any] = {}
_configure_lock = threading.Lock()  # the agent's verb threads share the root logger


def settings(request: Request) -> tuple[str | None, str]:
    """(log file or None, level): stanza > environment > host file, cheaply and leniently (the
    stanza may not even parse; netconf.host validates the same settings for the verbs)."""
    stanza: dict[str, Any] = {}
    try:
        parsed = json.loads(request.stdin) if request.stdin else {}
        if isinstance(parsed, dict):  # keys match case-insensitively, as the stanza's do
            stanza = {str(k).lower(): v for k, v in parsed.items()}
    except (ValueError, RecursionError):
        pass
    host: dict[str, Any] | None = None

    def setting(stanza_key: str, env_key: str) -> str | None:
        nonlocal host
        value = stanza.get(stanza_key.lower())
        if isinstance(value, str) and value:
            return value
        if request.environ.get(env_key):
            return request.environ[env_key]
        if host is None:
            host = _host_file(request)
        value = host.get(stanza_key)
        return value if isinstance(value, str) and value else None

    path = setting("logFile", "VPC_ATTACH_LOG_FILE")
    return path, (setting("logLevel", "VPC_ATTACH_LOG_LEVEL") or "info").lower()


def _host_file(request: Request) -> dict[str, Any]:
    try:
        with open(request.environ.get(HOST_CONFIG_ENV) or DEFAULT_HOST_CONFIG,
                  encoding="utf-8") as handle:
            content = json.load(handle)
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


class JsonLines(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": _timestamp(record.created), "level": record.levelname.lower(),
                "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure(request: Request) -> None:
    """Send Python logging to the log file as JSON lines (or warnings to stderr)."""
    path, level = settings(request)
    with _configure_lock:
        if _configured.get("key") == (path, level):
            return
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
            old.close()
        handler: logging.Handler
        try:
            handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
        except OSError:
            handler = logging.StreamHandler(sys.stderr)
            path = None
        handler.setFormatter(JsonLines())
        root.addHandler(handler)
        root.setLevel(level.upper() if path and level in LOG_LEVELS else "WARNING")
        _configured["key"] = (path, level)


def verb_line(request: Request, code: int, message: str, seconds: float) -> None:
    """Append the one-line summary of a verb to the log file, if one is configured."""
    path, _ = settings(request)
    if not path:
        return
    env = request.environ
    args = dict(kv.split("=", 1) for kv in env.get("CNI_ARGS", "").split(";") if "=" in kv)
    line = {
        "ts": _timestamp(time.time()),
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


def _timestamp(seconds: float) -> str:
    millis = int(seconds % 1 * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
