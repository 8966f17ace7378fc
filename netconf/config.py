"""The `vpc-attach` plugin stanza (SPEC §4), validated with the CNI error codes.

Keys are matched case-insensitively, like the reference Go plugins' encoding/json does
(containerd injects `HostPort`-style capitalised keys); unknown keys are rejected naming the key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from netconf.base62 import ATTACHMENT_LIMIT, VPC_LIMIT, decode_base62
from netconf.errors import DECODE_FAILURE, INVALID_CONFIG, CniError, quoted
from netconf.result import Result
from netconf.versions import require_supported

STANDARD_KEYS = ("cniVersion", "name", "type", "args", "runtimeConfig", "capabilities",
                 "prevResult", "dns")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PLUGIN_TYPE = "vpc-attach"
OWN_IPAM = "vpc-attach-ipam"  # called in-process (cni_plugin/ipam/delegate.py)
Family = Literal["IPv4", "IPv6"]


def canonical_keys(data: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """Rename keys that match a known key case-insensitively to its canonical spelling."""
    by_lower = {key.lower(): key for key in known}
    out: dict[str, Any] = {}
    for key, value in data.items():
        canonical = by_lower.get(key.lower(), key) if isinstance(key, str) else key
        if canonical in out:
            raise CniError(INVALID_CONFIG, f"duplicate config key {quoted(key)}",
                           f"{canonical!r} is given more than once (keys ignore case)")
        out[canonical] = value
    return out


def lookup_ci(data: Mapping[str, Any] | None, key: str) -> Any:
    """Value of key in data, matching case-insensitively (runtimeConfig)."""
    if not data:
        return None
    if key in data:
        return data[key]
    lowered = key.lower()
    for candidate, value in data.items():
        if candidate.lower() == lowered:
            return value
    return None


class _Strict(BaseModel):
    # Keys are read by their spelled names only (`logBackups`, never the attribute `log_backups`):
    # SPEC §14's refusal of host settings knows the spelled names, so a second spelling would
    # pass a host setting by it.
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _canonical(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            known = tuple(f.alias or name for name, f in cls.model_fields.items())
            return canonical_keys(data, known)
        return data


class TapOptions(_Strict):
    """Settings of the host tap device (attachment: tap)."""

    owner: int | None = Field(default=None, ge=0, le=2**32 - 2)
    group: int | None = Field(default=None, ge=0, le=2**32 - 2)
    multi_queue: bool = Field(default=False, alias="multiQueue")
    vnet_hdr: bool = Field(default=False, alias="vnetHdr")


class PublishOptions(_Strict):
    """What ADD publishes to Kubernetes."""

    bgp: bool = True
    endpoint_slice: bool = Field(default=True, alias="endpointSlice")
    endpoint_slice_families: list[Family] = Field(
        default_factory=lambda: list[Family](["IPv6"]), alias="endpointSliceFamilies")

    @property
    def any(self) -> bool:
        """True when anything is published (and so Kubernetes settings are needed)."""
        return self.bgp or self.endpoint_slice


class NetConf(_Strict):
    """A validated `vpc-attach` stanza."""

    cni_version: str = Field(alias="cniVersion")
    name: str
    type: str
    # Both given, or both absent with vpcFromPod: true (the Pod's annotation names them; a
    # sentinel value in `vpc` would be ambiguous: "fromPod" is itself a valid base62 VPC id).
    vpc: str = ""
    vpcattachment: str = ""
    vpc_from_pod: bool = Field(default=False, alias="vpcFromPod")
    attachment: Literal["veth", "tap", "existing"] = "veth"
    mtu: int | None = Field(default=None, ge=68, le=65535)
    isolation: Literal["vrf", "table"] = "vrf"
    tap: TapOptions | None = None
    publish: PublishOptions = Field(default_factory=PublishOptions)
    ipam: dict[str, Any] | None = None
    # KubeVirt's persistent IPs: the Pod's IPAMClaim keeps its addresses (SPEC §16).
    allow_persistent_ips: bool = Field(default=False, alias="allowPersistentIPs")
    # Host settings: code 7 before this model sees them unless the node allows them (SPEC §14).
    node_name: str | None = Field(default=None, alias="nodeName")
    namespace: str | None = None
    kubeconfig: str | None = None
    log_file: str | None = Field(default=None, alias="logFile")
    log_level: str | None = Field(default=None, alias="logLevel")
    log_max_bytes: int | None = Field(default=None, ge=0, alias="logMaxBytes")
    log_backups: int | None = Field(default=None, ge=0, alias="logBackups")
    agent_socket: str | None = Field(default=None, alias="agentSocket")
    timeout_seconds: float | None = Field(default=None, gt=0, le=600, alias="timeoutSeconds")
    lock_dir: str | None = Field(default=None, alias="lockDir")
    # Standard CNI keys.
    args: dict[str, Any] | None = None
    runtime_config: dict[str, Any] | None = Field(default=None, alias="runtimeConfig")
    capabilities: dict[str, Any] | None = None
    prev_result: dict[str, Any] | None = Field(default=None, alias="prevResult")
    dns: dict[str, Any] | None = None
    # GC input (CNI 1.1.0); read by the GC verb from the raw config.
    valid_attachments: list[Any] | None = Field(default=None, alias="cni.dev/valid-attachments")
    attachments: list[Any] | None = Field(default=None, alias="cni.dev/attachments")

    @field_validator("type")
    @classmethod
    def _our_type(cls, value: str) -> str:
        if value != PLUGIN_TYPE:
            raise ValueError(f"must be {PLUGIN_TYPE!r}")
        return value

    @field_validator("name")
    @classmethod
    def _name_present(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        return value

    @field_validator("vpc")
    @classmethod
    def _vpc_base62(cls, value: str) -> str:
        return _base62_below(value, VPC_LIMIT)

    @field_validator("vpcattachment")
    @classmethod
    def _attachment_base62(cls, value: str) -> str:
        return _base62_below(value, ATTACHMENT_LIMIT)

    @field_validator("namespace")
    @classmethod
    def _namespace_dns_label(cls, value: str | None) -> str | None:
        if value is not None and not DNS_LABEL.fullmatch(value):
            raise ValueError("must be a DNS-1123 label")
        return value

    @field_validator("ipam")
    @classmethod
    def _ipam_has_type(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            ipam_type = value.get("type")
            if not isinstance(ipam_type, str) or not ipam_type or "/" in ipam_type:
                raise ValueError("ipam.type must name an IPAM plugin in CNI_PATH")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> NetConf:
        # Raised directly (not ValueError) so the message names the key, not "top level".
        for key in ("vpc", "vpcattachment"):
            if self.vpc_from_pod and getattr(self, key):
                raise CniError(INVALID_CONFIG, f"invalid config key {quoted(key)}",
                               "with vpcFromPod the Pod's annotation "
                               "vpc-attach.datum.net/attachment names the VPC and attachment")
            if not self.vpc_from_pod and not getattr(self, key):
                raise CniError(INVALID_CONFIG, f"missing config key {quoted(key)}",
                               "or set vpcFromPod: true to take it from the Pod's annotation")
        if self.attachment == "veth" and self.ipam is None:
            raise CniError(INVALID_CONFIG, "missing config key 'ipam'",
                           "attachment 'veth' needs an IPAM block")
        if self.attachment == "existing" and self.ipam is not None:
            raise CniError(INVALID_CONFIG, "invalid config key 'ipam'",
                           "attachment 'existing' takes its addresses from prevResult")
        if self.allow_persistent_ips and (self.ipam or {}).get("type") != OWN_IPAM:
            found = (self.ipam or {}).get("type")
            raise CniError(INVALID_CONFIG, "invalid config key 'allowPersistentIPs'",
                           f"an IPAMClaim's addresses are kept by {OWN_IPAM}, called in-process "
                           f"with the claim; this config's IPAM is "
                           f"{repr(found) if found else 'absent'}")
        if self.tap is not None and self.attachment != "tap":
            raise CniError(INVALID_CONFIG, "invalid config key 'tap'",
                           f"tap options need attachment 'tap', not {self.attachment!r}")
        return self

    def choosing(self, vpc: str, vpcattachment: str) -> NetConf:
        """This config with the VPC and attachment a Pod chose (validated like the keys)."""
        try:
            return self.model_copy(update={"vpc": _base62_below(vpc, VPC_LIMIT),
                                           "vpcattachment": _base62_below(vpcattachment,
                                                                          ATTACHMENT_LIMIT)})
        except ValueError as exc:
            raise CniError(INVALID_CONFIG, f"invalid VPC attachment {vpc}/{vpcattachment}",
                           str(exc)) from None

    @property
    def tap_options(self) -> TapOptions:
        """Tap settings, defaulted."""
        return self.tap or TapOptions()

    def prev(self) -> Result | None:
        """prevResult parsed, if any."""
        return Result.from_wire(self.prev_result) if self.prev_result is not None else None

    def cni_args(self) -> dict[str, str]:
        """`args.cni` of the config (these win over CNI_ARGS)."""
        cni = (self.args or {}).get("cni") or {}
        return {str(k): str(v) for k, v in cni.items()} if isinstance(cni, dict) else {}


def _base62_below(value: str, limit: int) -> str:
    try:
        number = decode_base62(value)
    except ValueError as exc:
        raise ValueError(f"not base62 ({exc})") from None
    if number >= limit:
        raise ValueError(f"value {number} is not below {limit}")
    return value


def decode_json(stdin: bytes | str) -> dict[str, Any]:
    """Parse stdin as one JSON object (code 6 otherwise)."""
    try:
        data = json.loads(stdin)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CniError(DECODE_FAILURE, "cannot decode network config: invalid JSON",
                       str(exc)) from None
    if not isinstance(data, dict):
        raise CniError(DECODE_FAILURE, "network config must be a JSON object")
    return data


def config_version(data: Mapping[str, Any]) -> str:
    """The config's cniVersion, checked (code 7 if missing, code 1 if unsupported)."""
    version = lookup_ci(data, "cniVersion")
    if version is None or version == "":
        raise CniError(INVALID_CONFIG, "missing config key 'cniVersion'")
    if not isinstance(version, str):
        raise CniError(INVALID_CONFIG, "config key 'cniVersion' must be a string")
    return require_supported(version)


def validation_error(exc: ValidationError, what: str = "config") -> CniError:
    """Map the first pydantic error to code 7, naming the key."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return CniError(INVALID_CONFIG, f"unknown {what} key {quoted(where)}")
    if err["type"] == "missing":
        return CniError(INVALID_CONFIG, f"missing {what} key {quoted(where)}")
    message = err["msg"].removeprefix("Value error, ")
    return CniError(INVALID_CONFIG, f"invalid {what} key {quoted(where)}: {message}")


def parse_netconf(data: Mapping[str, Any]) -> NetConf:
    """Validate a plugin stanza (code 1, 6 or 7 naming what is wrong)."""
    config_version(data)
    try:
        return NetConf.model_validate(dict(data))
    except ValidationError as exc:
        raise validation_error(exc) from None
