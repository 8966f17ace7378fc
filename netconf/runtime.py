"""What the runtime hands a plugin besides the config: CNI_* environment and CNI_ARGS."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from netconf.errors import INVALID_ENV, UNSUPPORTED_FIELD, CniError, quoted

CONTAINER_ID_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
IFNAME_MAX = 15
KNOWN_CNI_ARGS = frozenset({
    "IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID", "IP", "MAC",
})
# `args.cni` spells the ips and mac capabilities in lower case (CONVENTIONS.md).
KNOWN_CONFIG_ARGS = (KNOWN_CNI_ARGS - {"IP", "MAC"}) | {"ips", "mac"}
COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
# Which CNI_* variables each verb cannot do without (SPEC §3, as libcni's skel checks them).
_REQUIRED_ENV: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "GC": (),
    "STATUS": (),
    "VERSION": (),
}


@dataclass(frozen=True)
class CniArgs:
    """CNI_ARGS split once: its well-formed pairs, and the first malformed item, if any (a
    lenient reader, e.g. an Event about a failed ADD, takes the pairs; the verbs `checked`)."""

    pairs: Mapping[str, str] = field(default_factory=dict)
    malformed: str | None = None

    @classmethod
    def split(cls, text: str) -> CniArgs:
        """Split `K=V;K=V` (a pair without '=' or key is remembered, not kept)."""
        pairs: dict[str, str] = {}
        malformed = None
        for item in text.split(";"):
            if not item:
                continue
            key, sep, value = item.partition("=")
            if not sep or not key:
                malformed = malformed if malformed is not None else item
                continue
            pairs[key] = value
        return cls(pairs, malformed)

    def checked(self) -> dict[str, str]:
        """The pairs; code 4 naming the first malformed one."""
        if self.malformed is not None:
            raise CniError(INVALID_ENV, f"invalid CNI_ARGS pair {self.malformed!r}",
                           "CNI_ARGS must be K=V pairs separated by ';'")
        return dict(self.pairs)


def parse_cni_args(text: str) -> dict[str, str]:
    """Parse CNI_ARGS (`K=V;K=V`); code 4 on a malformed pair."""
    return CniArgs.split(text).checked()


def ignore_unknown(args: Mapping[str, str]) -> bool:
    """The IgnoreUnknown flag as libcni's BoolUnmarshaler reads it."""
    return args.get("IgnoreUnknown", "").lower() in ("1", "true")


def check_known_args(args: Mapping[str, str],
                     config_args: Mapping[str, object] | None = None) -> None:
    """Reject CNI_ARGS keys (args) and config `args.cni` keys (config_args, which win for the
    same key) we do not understand unless IgnoreUnknown is set (code 2)."""
    config_args = config_args or {}
    if ignore_unknown({**args, **{k: str(v) for k, v in config_args.items()}}):
        return
    unknown = sorted((set(args) - set(config_args) - KNOWN_CNI_ARGS)
                     | (set(config_args) - KNOWN_CONFIG_ARGS))
    if unknown:
        raise CniError(UNSUPPORTED_FIELD, f"unknown CNI_ARGS key {quoted(unknown[0])}",
                       f"unknown keys: {', '.join(unknown)}; set IgnoreUnknown=1 to ignore them")


def validate_container_id(container_id: str) -> None:
    """Code 4 unless the ID matches the CNI spec's pattern."""
    if not CONTAINER_ID_PATTERN.fullmatch(container_id):
        raise CniError(INVALID_ENV, f"invalid CNI_CONTAINERID {container_id!r}",
                       "must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


def validate_ifname(ifname: str) -> None:
    """Code 4 unless the name is a valid Linux interface name (the CNI spec's rules)."""
    problem = ""
    if not ifname:
        problem = "is empty"
    elif len(ifname.encode()) > IFNAME_MAX:
        problem = f"is longer than {IFNAME_MAX} bytes"
    elif ifname in (".", ".."):
        problem = "is '.' or '..'"
    elif any(ch in "/:" or ch.isspace() for ch in ifname):
        problem = "contains '/', ':' or whitespace"
    if problem:
        raise CniError(INVALID_ENV, f"invalid CNI_IFNAME {ifname!r}: it {problem}")


@dataclass(frozen=True)
class RuntimeEnv:
    """The CNI_* variables of one invocation, validated for its verb."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    cni_args: Mapping[str, str] = field(default_factory=dict)
    cni_path: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str],
                     cni_args: CniArgs | None = None) -> RuntimeEnv:
        """Read and validate the CNI_* variables (code 4 naming what is missing or invalid);
        cni_args: CNI_ARGS already split (a `Request` splits it once), else split here."""
        command = environ.get("CNI_COMMAND", "")
        if command not in COMMANDS:
            raise CniError(INVALID_ENV,
                           f"invalid CNI_COMMAND {command!r}" if command else
                           "missing CNI_COMMAND", f"expected one of {', '.join(COMMANDS)}")
        missing = [name for name in _REQUIRED_ENV[command] if not environ.get(name)]
        if missing:
            raise CniError(INVALID_ENV, f"missing environment variable(s): {', '.join(missing)}",
                           f"required for {command}")
        env = cls(
            command=command,
            container_id=environ.get("CNI_CONTAINERID", ""),
            netns=environ.get("CNI_NETNS", ""),
            ifname=environ.get("CNI_IFNAME", ""),
            cni_args=(cni_args or CniArgs.split(environ.get("CNI_ARGS", ""))).checked(),
            cni_path=tuple(p for p in environ.get("CNI_PATH", "").split(os.pathsep) if p),
        )
        if env.container_id:
            validate_container_id(env.container_id)
        if env.ifname:
            validate_ifname(env.ifname)
        return env

    def to_environ(self) -> dict[str, str]:
        """The same invocation as CNI_* variables (for delegating to an IPAM plugin)."""
        return {
            "CNI_COMMAND": self.command,
            "CNI_CONTAINERID": self.container_id,
            "CNI_NETNS": self.netns,
            "CNI_IFNAME": self.ifname,
            "CNI_ARGS": ";".join(f"{k}={v}" for k, v in self.cni_args.items()),
            "CNI_PATH": os.pathsep.join(self.cni_path),
        }
