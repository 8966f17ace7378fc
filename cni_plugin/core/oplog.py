"""Operator logs: JSON lines in the configured log file — never stdout, never a credential.

Every verb writes exactly one summary line (ts, verb, containerID, ifname, pod, netns,
cniVersion, outcome, code, error, durationMs); warnings and details of the same invocation are
JSON lines too, so one `jq` reads the whole file. Without a log file, only warnings go to
stderr (which runtimes show next to a failed sandbox). The file rotates by size (`logfile.py`).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from cni_plugin.core.logfile import LogFile, log_file
from cni_plugin.core.request import Request
from netconf.errors import CniError
from netconf.host import (
    DEFAULT_HOST_CONFIG,
    DEFAULT_LOG_BACKUPS,
    DEFAULT_LOG_MAX_BYTES,
    HOST_CONFIG_ENV,
    LOG_LEVELS,
    MAX_LOG_BACKUPS,
    stanza_host_settings_allowed,
)

_configured: dict[str, Any] = {}
# Any of these in a config's bytes (lower-cased) means it might set a log setting.
_LOG_KEYS_BYTES = (b'"logfile"', b'"loglevel"', b'"logmaxbytes"', b'"logbackups"')
_configure_lock = threading.Lock()  # the agent's verb threads share the root logger


@dataclass(frozen=True)
class LogSettings:
    """Where the operator log goes and how much of it is kept."""

    path: str | None
    level: str
    max_bytes: int = DEFAULT_LOG_MAX_BYTES
    backups: int = DEFAULT_LOG_BACKUPS

    def file(self) -> LogFile | None:
        """The shared writer of the log file, if there is one."""
        return log_file(self.path, self.max_bytes, self.backups) if self.path else None


def settings(request: Request) -> LogSettings:
    """The log settings: environment > host file, cheaply and leniently (netconf.host validates
    the same settings for the verbs, and an invalid size or count here means its default). A
    stanza's log keys count only where the node allows stanza host settings: elsewhere the
    verb refuses them (code 7), and its log line goes to the node's log, not theirs."""
    stanza: dict[str, Any] = {}
    host: dict[str, Any] | None = None
    lowered = request.stdin.lower()
    if any(key in lowered for key in _LOG_KEYS_BYTES):  # most configs name none: no parsing
        host = _host_file(request)
        stanza = _allowed_stanza(request, host)

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

    def count(stanza_key: str, env_key: str, default: int, high: int) -> int:
        nonlocal host
        if host is None:
            host = _host_file(request)
        for value in (stanza.get(stanza_key.lower()), request.environ.get(env_key),
                      host.get(stanza_key)):
            if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
                value = int(value)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high:
                return value
            if value not in (None, ""):
                return default
        return default

    return LogSettings(
        path=setting("logFile", "VPC_ATTACH_LOG_FILE"),
        level=(setting("logLevel", "VPC_ATTACH_LOG_LEVEL") or "info").lower(),
        max_bytes=count("logMaxBytes", "VPC_ATTACH_LOG_MAX_BYTES", DEFAULT_LOG_MAX_BYTES,
                        2**40),
        backups=count("logBackups", "VPC_ATTACH_LOG_BACKUPS", DEFAULT_LOG_BACKUPS,
                      MAX_LOG_BACKUPS))


def _allowed_stanza(request: Request, host: dict[str, Any]) -> dict[str, Any]:
    """The config's keys, lower-cased, if this node lets a stanza set host settings; else {}."""
    try:
        if not stanza_host_settings_allowed(request.environ, host):
            return {}
        parsed = json.loads(request.stdin)
    except (CniError, ValueError, RecursionError):
        return {}  # not allowed, or the config does not parse: the node's settings only
    # keys match case-insensitively, as the stanza's do
    return {str(k).lower(): v for k, v in parsed.items()} if isinstance(parsed, dict) else {}


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


class LogFileHandler(logging.Handler):
    """Log records as lines of the rotating operator log."""

    def __init__(self, file: LogFile) -> None:
        super().__init__()
        self.file = file

    def emit(self, record: logging.LogRecord) -> None:
        """Append the formatted record (never raises: logging must not change an answer)."""
        try:
            self.file.write(self.format(record).encode("utf-8", "replace"))
        except Exception:  # a record that cannot be formatted is dropped, not raised
            self.handleError(record)


def configure(request: Request) -> None:
    """Send Python logging to the log file as JSON lines (or warnings to stderr)."""
    chosen = settings(request)
    with _configure_lock:
        if _configured.get("key") == chosen:
            return
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
            old.close()
        file = chosen.file()
        handler = LogFileHandler(file) if file else logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines())
        root.addHandler(handler)
        level = chosen.level
        root.setLevel(level.upper() if file and level in LOG_LEVELS else "WARNING")
        _configured["key"] = chosen


def verb_line(request: Request, code: int, message: str, seconds: float) -> None:
    """Append the one-line summary of a verb to the log file, if one is configured."""
    file = settings(request).file()
    if file is None:
        return
    env = request.environ
    args = dict(kv.split("=", 1) for kv in env.get("CNI_ARGS", "").split(";") if "=" in kv)
    line = {
        "ts": _timestamp(time.time()),
        "verb": request.command,
        "containerID": env.get("CNI_CONTAINERID", ""),
        "ifname": env.get("CNI_IFNAME", ""),
        "pod": f"{args.get('K8S_POD_NAMESPACE', '')}/{args.get('K8S_POD_NAME', '')}".strip("/"),
        "netns": env.get("CNI_NETNS", ""),
        "cniVersion": _cni_version(request),
        "outcome": "ok" if code == 0 else "error",
        "code": code,
        "error": message,
        "durationMs": round(seconds * 1000, 1),
    }
    file.write((json.dumps(line) + "\n").encode())  # never raises


def _cni_version(request: Request) -> str:
    """The configuration's cniVersion as the runtime sent it ("" if it sent none or no JSON)."""
    try:
        parsed = json.loads(request.stdin) if request.stdin else {}
    except (ValueError, RecursionError):
        return ""
    version = parsed.get("cniVersion") if isinstance(parsed, dict) else None
    return version if isinstance(version, str) else ""


def _timestamp(seconds: float) -> str:
    millis = int(seconds % 1 * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
