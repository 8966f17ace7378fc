"""A small CRI client over gRPC: the pod-sandbox calls a kubelet makes, each with a timeout."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from e2e.harness.cri.protos import load_stubs

RUN_TIMEOUT = 120.0  # RunPodSandbox runs the whole CNI chain (publishing included)
CALL_TIMEOUT = 60.0


class CriError(RuntimeError):
    """A CRI call failed; carries the gRPC status code and the runtime's message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method}: {code.name}: {details}")


@dataclass(frozen=True)
class SandboxConfig:
    """What a kubelet puts in PodSandboxConfig for a Pod (metadata from the Pod object)."""

    name: str
    namespace: str
    uid: str
    attempt: int = 0
    hostname: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""  # empty: the client's default


@dataclass(frozen=True)
class SandboxStatus:
    """PodSandboxStatus, with the runtime's verbose details that tests need."""

    id: str
    ready: bool
    uid: str  # the Pod's (from the sandbox metadata)
    ip: str
    additional_ips: tuple[str, ...]
    netns: str | None  # the network namespace path the runtime passed as CNI_NETNS
    info: dict[str, Any]


class CriClient:
    """RuntimeService and ImageService on a Unix socket."""

    def __init__(self, socket: Path, cgroup_parent: str = "") -> None:
        self._api, services = load_stubs()
        self._cgroup_parent = cgroup_parent
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._runtime = services.RuntimeServiceStub(self._channel)
        self._images = services.ImageServiceStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        try:
            return getattr(stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise CriError(method, code, details or "") from None

    def status(self, timeout: float = CALL_TIMEOUT) -> tuple[dict[str, bool], dict[str, Any]]:
        """Runtime conditions (RuntimeReady, NetworkReady) and the verbose info, parsed."""
        reply = self._call(self._runtime, "Status", self._api.StatusRequest(verbose=True),
                           timeout)
        conditions = {c.type: c.status for c in reply.status.conditions}
        return conditions, {key: _json_or_text(value) for key, value in reply.info.items()}

    def image_present(self, ref: str, timeout: float = CALL_TIMEOUT) -> bool:
        """Whether the CRI image store has ref (e.g. after `ctr images import`)."""
        request = self._api.ImageStatusRequest(image=self._api.ImageSpec(image=ref))
        reply = self._call(self._images, "ImageStatus", request, timeout)
        return bool(reply.image.id)

    def run_pod_sandbox(self, config: SandboxConfig, timeout: float = RUN_TIMEOUT) -> str:
        """RunPodSandbox; returns the sandbox id (the CNI container ID)."""
        request = self._api.RunPodSandboxRequest(config=self._sandbox_config(config))
        return str(self._call(self._runtime, "RunPodSandbox", request, timeout).pod_sandbox_id)

    def stop_pod_sandbox(self, sandbox_id: str, timeout: float = CALL_TIMEOUT) -> None:
        """StopPodSandbox (the runtime runs CNI DEL)."""
        request = self._api.StopPodSandboxRequest(pod_sandbox_id=sandbox_id)
        self._call(self._runtime, "StopPodSandbox", request, timeout)

    def remove_pod_sandbox(self, sandbox_id: str, timeout: float = CALL_TIMEOUT) -> None:
        """RemovePodSandbox."""
        request = self._api.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
        self._call(self._runtime, "RemovePodSandbox", request, timeout)

    def pod_sandbox_status(self, sandbox_id: str,
                           timeout: float = CALL_TIMEOUT) -> SandboxStatus:
        """PodSandboxStatus (verbose); raises CriError NOT_FOUND for an unknown sandbox."""
        request = self._api.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        reply = self._call(self._runtime, "PodSandboxStatus", request, timeout)
        info = {key: _json_or_text(value) for key, value in reply.info.items()}
        network = reply.status.network
        return SandboxStatus(
            id=reply.status.id,
            ready=reply.status.state == self._api.SANDBOX_READY,
            uid=reply.status.metadata.uid,
            ip=network.ip,
            additional_ips=tuple(extra.ip for extra in network.additional_ips),
            netns=_netns_path(info),
            info=info)

    def list_pod_sandboxes(self, timeout: float = CALL_TIMEOUT) -> list[str]:
        """Ids of every sandbox the runtime knows."""
        reply = self._call(self._runtime, "ListPodSandbox", self._api.ListPodSandboxRequest(),
                           timeout)
        return [item.id for item in reply.items]

    def _sandbox_config(self, config: SandboxConfig) -> Any:
        api = self._api
        return api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(name=config.name, namespace=config.namespace,
                                            uid=config.uid, attempt=config.attempt),
            hostname=config.hostname or config.name,
            labels=config.labels,
            annotations=config.annotations,
            linux=api.LinuxPodSandboxConfig(
                cgroup_parent=config.cgroup_parent or self._cgroup_parent),
        )


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _netns_path(info: dict[str, Any]) -> str | None:
    """containerd's verbose info: the network namespace of the sandbox's runtime spec."""
    details = info.get("info")
    if not isinstance(details, dict):
        return None
    namespaces = details.get("runtimeSpec", {}).get("linux", {}).get("namespaces", [])
    for namespace in namespaces:
        if namespace.get("type") == "network":
            path = namespace.get("path")
            return str(path) if path else None
    return None
