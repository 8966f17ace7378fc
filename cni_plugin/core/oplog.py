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
from cni_plugin.core.request import Invocation, Request
from netconf.host import (
    DEFAULT_LOG_BACKUPS,
    DEFAULT_LOG_MAX_BYTES,
    LOG_LEVELS,
    HostSettings,
    lenient_host_settings,
)

_configured: dict[str, Any] = {}
_configure_lock = threading.Lock()  # the agent's verb threads share the root logger


@dataclass(frozen=True)
class LogSettings:
    """Where the operator log goes and how much of it is kept."""

    path: str | None
    level: str
    max_bytes: int = DEFAULT_LOG_MAX_BYTES
    backups: int = DEFAULT_LOG_BACKUPS

    @classmethod
    def of(cls, host: HostSettings) -> LogSettings:
        """The log part of a node's host settings."""
        return cls(host.log_file, host.log_level.lower(), host.log_max_bytes, host.log_backups)

    def file(self) -> LogFile | None:
        """The shared writer of the log file, if there is one."""
        return log_file(self.path, self.max_bytes, self.backups) if self.path else None


def settings(request: Request) -> LogSettings:
    """The log settings before the request is validated, from the one resolver of host
    settings, leniently (`netconf.host.lenient_host_settings`): a stanza's log keys count
    only where the node allows stanza host settings — elsewhere the verb refuses them (code
    7) and its log line goes to the node's log, not theirs — and an invalid value means its
    default."""
    return LogSettings.of(lenient_host_settings(request.readable_config(), request.environ,
                                                request.readable_host_file()))


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


def verb_line(request: Request, invocation: Invocation | None, code: int, message: str,
              seconds: float) -> None:
    """Append the one-line summary of a verb to the log file, if one is configured; what the
    request says is read from its validated `invocation` when it parsed."""
    chosen = LogSettings.of(invocation.host) if invocation is not None else settings(request)
    file = chosen.file()
    if file is None:
        return
    env = request.environ
    if invocation is not None:
        pod = invocation.pod.namespace or "", invocation.pod.name or ""
        cni_version = invocation.conf.cni_version
    else:  # as far as the request is readable: its answer says what was wrong
        args = request.cni_args.pairs
        pod = args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", "")
        version = request.readable_config().get("cniVersion")
        cni_version = version if isinstance(version, str) else ""
    line = {
        "ts": _timestamp(time.time()),
        "verb": request.command,
        "containerID": env.get("CNI_CONTAINERID", ""),
        "ifname": env.get("CNI_IFNAME", ""),
        "pod": f"{pod[0]}/{pod[1]}".strip("/"),
        "netns": env.get("CNI_NETNS", ""),
        "cniVersion": cni_version,
        "outcome": "ok" if code == 0 else "error",
        "code": code,
        "error": message,
        "durationMs": round(seconds * 1000, 1),
    }
    file.write((json.dumps(line) + "\n").encode())  # never raises


def _timestamp(seconds: float) -> str:
    millis = int(seconds % 1 * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
