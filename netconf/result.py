"""CNI results of every supported version, held internally in the 1.1.0 shape.

`Result.from_wire` reads a result (or a prevResult) of any supported version;
`Result.to_wire` writes it in exactly the version asked for. Fields this plugin does not know
(for example added by an earlier plugin in the chain) are kept and passed on.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from netconf.errors import DECODE_FAILURE, CniError
from netconf.versions import LEGACY_RESULT_VERSIONS, require_supported

# Fields that only exist from 1.0.0/1.1.0 on, dropped when answering an older version.
_NEW_INTERFACE_KEYS = ("mtu", "socketPath", "pciID")
_NEW_ROUTE_KEYS = ("mtu", "advmss", "priority", "table", "scope")
_OPTIONAL_KEYS = frozenset({"mtu", "socketPath", "pciID", "gateway", "interface", "gw",
                            "domain"})


class _Open(BaseModel):
    # Results are passed down a chain: keep what other plugins wrote.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Interface(_Open):
    """One entry of result.interfaces."""

    name: str
    mac: str = ""
    mtu: int | None = None
    sandbox: str = ""
    socket_path: str | None = Field(default=None, alias="socketPath")
    pci_id: str | None = Field(default=None, alias="pciID")


class IPConfig(_Open):
    """One entry of result.ips: an address with prefix, optional gateway and interface index."""

    address: str
    gateway: str | None = None
    interface: int | None = None

    @field_validator("address")
    @classmethod
    def _address_is_cidr(cls, value: str) -> str:
        ipaddress.ip_interface(value)
        return value

    @property
    def ip(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        """The address as an interface object (address + prefix)."""
        return ipaddress.ip_interface(self.address)

    @property
    def family(self) -> int:
        """4 or 6."""
        return self.ip.version


class Route(_Open):
    """One entry of result.routes."""

    dst: str
    gw: str | None = None


class DNS(_Open):
    """result.dns."""

    nameservers: list[str] = Field(default_factory=list)
    domain: str | None = None
    search: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list)


class Result(_Open):
    """A CNI result in the 1.1.0 shape."""

    interfaces: list[Interface] = Field(default_factory=list)
    ips: list[IPConfig] = Field(default_factory=list)
    routes: list[Route] = Field(default_factory=list)
    dns: DNS = Field(default_factory=DNS)

    @classmethod
    def from_wire(cls, data: Any, what: str = "prevResult") -> Result:
        """Parse a result of any supported version (code 6 naming `what` if it is not one)."""
        if not isinstance(data, dict):
            raise CniError(DECODE_FAILURE, f"{what} is not a JSON object")
        body = {k: v for k, v in data.items() if k != "cniVersion"}
        ips = body.get("ips")
        if isinstance(ips, list):  # drop 0.3/0.4's ips[].version without editing the input
            body["ips"] = [{k: v for k, v in ip.items() if k != "version"}
                           if isinstance(ip, dict) else ip for ip in ips]
        try:
            return cls.model_validate(body)
        except ValidationError as exc:
            raise CniError(DECODE_FAILURE, f"cannot decode {what}",
                           _first_error(exc)) from None

    def to_wire(self, cni_version: str) -> dict[str, Any]:
        """The result as JSON-ready data in exactly cni_version."""
        require_supported(cni_version)
        data = _without_unset(self.model_dump(by_alias=True))
        dns = {key: value for key, value in data.pop("dns").items() if value}
        if dns:
            data["dns"] = dns
        for iface in data["interfaces"]:
            for key in ("sandbox", "mac"):
                if not iface.get(key):
                    iface.pop(key, None)  # omitted when empty, as libcni does
        if cni_version in LEGACY_RESULT_VERSIONS:
            for iface in data["interfaces"]:
                for key in _NEW_INTERFACE_KEYS:
                    iface.pop(key, None)
            for route in data["routes"]:
                for key in _NEW_ROUTE_KEYS:
                    route.pop(key, None)
            for ip, model in zip(data["ips"], self.ips, strict=True):
                ip["version"] = str(model.family)
        return {"cniVersion": cni_version, **data}

    def copy_deep(self) -> Result:
        """An independent copy (results are edited by later steps of a chain)."""
        return self.model_copy(deep=True)


def _without_unset(value: Any) -> Any:
    """Drop our own optional fields left unset (None); unknown fields pass on untouched."""
    if isinstance(value, dict):
        return {k: _without_unset(v) for k, v in value.items()
                if not (v is None and k in _OPTIONAL_KEYS)}
    if isinstance(value, list):
        return [_without_unset(v) for v in value]
    return value


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}"
