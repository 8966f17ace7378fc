"""vpc-attach-ipam's state files read and damaged from outside, independently of its store:
records are files named by an address holding `{"containerID", "ifname"}` and, when an
IPAMClaim owns them, `"claim": {"namespace", "name", "uid"}` (alone once detached); index
entries live in `attachments/`, temp files start with `.tmp-` (cni_plugin/ipam/plugin/README.md).
The unit tests and the e2e tests read them alike; it lives here, where the unit tests need no
e2e extra to import it.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

Owner = tuple[str, str]  # (containerID, ifname)


def _owner(body: bytes) -> Owner | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and isinstance(data.get("containerID"), str) \
            and isinstance(data.get("ifname"), str):
        return data["containerID"], data["ifname"]
    return None


def _claim(body: bytes) -> str | None:
    """`namespace/name@uid` of the IPAMClaim owning a record, if one does."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    claim = data.get("claim") if isinstance(data, dict) else None
    if not isinstance(claim, dict):
        return None
    return f"{claim.get('namespace')}/{claim.get('name')}@{claim.get('uid')}"


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class IpamFiles:
    """Everything under one dataDir: records and index entries keyed by `pool/name`."""

    records: dict[str, Owner | None]  # None: unreadable
    bodies: dict[str, bytes]
    index: dict[str, str]
    temps: list[str]

    @classmethod
    def read(cls, data_dir: Path) -> IpamFiles:
        """Read every pool directory of every network under data_dir."""
        records: dict[str, Owner | None] = {}
        bodies: dict[str, bytes] = {}
        index: dict[str, str] = {}
        temps: list[str] = []
        for path in sorted(data_dir.rglob("*")) if data_dir.exists() else []:
            key = f"{path.parent.name}/{path.name}"
            if path.name.startswith(".tmp-"):
                temps.append(str(path))
            elif path.parent.name == "attachments" and path.is_file():
                index[f"{path.parent.parent.name}/{path.name}"] = \
                    path.read_text(errors="replace").strip()
            elif path.is_file() and _is_address(path.name):
                bodies[key] = path.read_bytes()
                records[key] = _owner(bodies[key])
        return cls(records, bodies, index, temps)

    def held_by(self, container_id: str, ifname: str = "eth0") -> list[str]:
        """`pool/address` of every record naming this attachment."""
        return sorted(k for k, owner in self.records.items() if owner == (container_id, ifname))

    def addresses_of(self, container_id: str, ifname: str = "eth0") -> list[str]:
        """The addresses (record names) this attachment holds."""
        return sorted(key.split("/", 1)[1] for key in self.held_by(container_id, ifname))

    def claims(self) -> dict[str, str]:
        """address -> `namespace/name@uid` of every record an IPAMClaim owns."""
        return {key.split("/", 1)[1]: claim for key, body in self.bodies.items()
                if (claim := _claim(body)) is not None}

    def holders(self) -> dict[str, str]:
        """address -> `containerID@ifname` of every readable record (addresses are unique
        per pool; a test with one pool per family reads each once)."""
        return {key.split("/", 1)[1]: f"{owner[0]}@{owner[1]}"
                for key, owner in self.records.items() if owner is not None}

    def index_sound(self) -> bool:
        """Whether every index entry names a record of its own attachment."""
        for key, name in self.index.items():
            pool, entry = key.split("/", 1)
            owner = self.records.get(f"{pool}/{name}")
            if owner is None or f"{owner[0]}@{owner[1]}" != entry:
                return False
        return True


def pool_dirs(data_dir: Path, network: str) -> list[Path]:
    """The pool directories of a network."""
    network_dir = data_dir / network
    return sorted(p for p in network_dir.iterdir() if p.is_dir()) if network_dir.exists() else []
