"""What every verb receives: the runtime env, the raw config and the host environment.

Transports (the executable, the node agent) build a `Request`; the dispatcher validates it
once into an `Invocation` (`Invocation.parse`), which the verb, the log line, the agent's
metrics and Events all read. A `Request` decodes its config and CNI_ARGS, and reads the node's
host file, once, however many readers ask (the log settings before the parse, a failed parse's
answer and Event read them too). Nothing here reads stdin or writes stdout.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cni_plugin.core.deadline import Deadline
from cni_plugin.core.locks import container_lock_path, file_lock, lock_path
from netconf.capabilities import requested_mac
from netconf.config import NetConf, decode_json, lookup_ci, parse_netconf
from netconf.errors import INVALID_ENV, CniError
from netconf.host import HostSettings, NodeSettings, read_host_file
from netconf.runtime import CniArgs, RuntimeEnv, check_known_args

# STATUS answers within this, whatever timeoutSeconds says: containerd polls it every ~5 s
# and blocks its own CRI Status meanwhile, and kubelet reports "container runtime is down"
# (not "network not ready") when that call hangs; an unreachable API is an answer, code 50.
STATUS_TIMEOUT_S = 4.0


@dataclass(frozen=True)
class Request:
    """One invocation as a transport received it."""

    environ: Mapping[str, str]  # the full process environment (CNI_* and VPC_ATTACH_*)
    stdin: bytes

    @property
    def command(self) -> str:
        """CNI_COMMAND, unvalidated."""
        return self.environ.get("CNI_COMMAND", "")

    def config(self) -> dict[str, Any]:
        """The network config on stdin, decoded on first use only (code 6 unless it is one
        JSON object)."""
        if isinstance(self._decoded, CniError):
            raise self._decoded
        return self._decoded

    def readable_config(self) -> dict[str, Any]:
        """The network config for a reader that must not fail: empty when it does not decode."""
        return {} if isinstance(self._decoded, CniError) else self._decoded

    def host_file(self) -> dict[str, Any]:
        """The host file the environment names, read on first use only (missing is empty;
        unreadable or not JSON is code 7)."""
        if isinstance(self._host_file, CniError):
            raise self._host_file
        return self._host_file

    def readable_host_file(self) -> dict[str, Any]:
        """The host file for a reader that must not fail: empty when it cannot be read."""
        return {} if isinstance(self._host_file, CniError) else self._host_file

    @cached_property
    def _host_file(self) -> dict[str, Any] | CniError:
        try:
            return read_host_file(self.environ)
        except CniError as exc:
            return exc

    @cached_property
    def cni_args(self) -> CniArgs:
        """CNI_ARGS, split on first use only (malformed pairs are code 4 where checked)."""
        return CniArgs.split(self.environ.get("CNI_ARGS", ""))

    @cached_property
    def _decoded(self) -> dict[str, Any] | CniError:
        try:
            return decode_json(self.stdin)
        except CniError as exc:
            return exc


@dataclass(frozen=True)
class PodRef:
    """The Kubernetes Pod behind the sandbox, from CNI_ARGS / args.cni."""

    namespace: str | None
    name: str | None
    uid: str | None
    infra_container_id: str | None


@dataclass(frozen=True)
class Invocation:
    """A validated request: runtime env, stanza, the node's settings, pod and deadline."""

    env: RuntimeEnv
    conf: NetConf
    raw: dict[str, Any]
    stdin: bytes
    host: HostSettings  # the node's, and the stanza's where the node allows them (SPEC §4)
    pod: PodRef
    deadline: Deadline = field(compare=False)  # for forward work
    final_deadline: Deadline = field(compare=False)  # the invocation's, rollback included
    attempt: str = field(compare=False)  # random token of this invocation (created-by)
    # The node's settings, the host file read once for the whole verb: every step reads them
    # here (an IPAM delegate gets their environment too).
    node: NodeSettings = field(compare=False)
    # The workload link's MAC the runtime asked for (the `mac` capability), validated.
    mac: str | None = None

    @classmethod
    def parse(cls, request: Request) -> Invocation:
        """Validate env, config, CNI_ARGS and host settings (codes 1, 2, 4, 6, 7)."""
        env = RuntimeEnv.from_environ(request.environ, request.cni_args)
        raw = request.config()
        # First: a host setting in the config is named as such, whatever else is wrong.
        node = NodeSettings.read(request.environ, request.host_file())
        host = node.host(raw)
        conf = parse_netconf(raw)
        args = {**env.cni_args, **conf.cni_args()}  # config args.cni wins (SPEC §3)
        check_known_args(env.cni_args, conf.cni_args())
        if env.netns and env.command in ("ADD", "CHECK"):
            _check_netns(env.netns, veth=conf.attachment == "veth")
        mac = requested_mac(raw, env.cni_args)
        pod = PodRef(args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME"),
                     args.get("K8S_POD_UID"), args.get("K8S_POD_INFRA_CONTAINER_ID"))
        seconds = host.timeout_seconds
        if env.command == "STATUS":  # a probe the runtime repeats: answer before it gives up
            seconds = min(seconds, STATUS_TIMEOUT_S)
        final = Deadline(seconds)
        forward = final.less_rollback_reserve() if env.command == "ADD" else final
        return cls(env=env, conf=conf, raw=raw, stdin=request.stdin, host=host, pod=pod,
                   deadline=forward, final_deadline=final, attempt=secrets.token_hex(6),
                   node=node, mac=mac)

    @property
    def namespace(self) -> str:
        """Namespace of the BGP custom resources (a host setting)."""
        return self.host.namespace

    def lock_path(self, name: str) -> str:
        """Lock file for a host object name (a host link, or 'host' for shared state)."""
        return lock_path(self.host.lock_dir, name)

    def container_lock(self) -> AbstractContextManager[None]:
        """The lock of this (container, ifname), held for a whole ADD or DEL (SPEC §9), so the
        two never interleave. One of 256 files: unrelated containers rarely share one."""
        return file_lock(container_lock_path(self.host.lock_dir, self.env.container_id,
                                             self.env.ifname), self.deadline.remaining())

    @property
    def created_by(self) -> str:
        """What every object this invocation creates records about its creator (SPEC §7)."""
        return f"{self.env.container_id}/{self.env.ifname}/{self.attempt}"

    def runtime_value(self, key: str) -> Any:
        """A runtimeConfig value, matched case-insensitively like the Go plugins do."""
        return lookup_ci(self.conf.runtime_config, key)


def _check_netns(path: str, veth: bool) -> None:
    if not path.startswith("/"):
        raise CniError(INVALID_ENV, f"invalid CNI_NETNS {path!r}: not an absolute path")
    if veth and _same_file(path, "/proc/self/ns/net"):
        raise CniError(INVALID_ENV, f"invalid CNI_NETNS {path!r}: it is the plugin's own "
                       "network namespace", "a Pod's interface would be made on the host")


def _same_file(path: str, other: str) -> bool:
    try:
        mine, theirs = os.stat(path), os.stat(other)
    except OSError:
        return False  # a netns that does not exist is reported where it is opened
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)

