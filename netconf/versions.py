"""CNI spec versions vpc-attach speaks."""

from __future__ import annotations

from netconf.errors import INCOMPATIBLE_VERSION, CniError

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CURRENT_VERSION = "1.1.0"
# Versions whose results carry ips[].version and lack interface mtu/socketPath/pciID.
LEGACY_RESULT_VERSIONS = frozenset({"0.3.0", "0.3.1", "0.4.0"})
# CHECK appeared in 0.4.0, STATUS and GC in 1.1.0.
CHECK_MIN_VERSION = "0.4.0"
GC_STATUS_MIN_VERSION = "1.1.0"


def version_key(version: str) -> tuple[int, ...]:
    """Sortable tuple of a dotted version; ValueError if malformed."""
    return tuple(int(part) for part in version.split("."))


def require_supported(version: str) -> str:
    """Return version if supported, else raise code 1 listing what is."""
    if version not in SUPPORTED_VERSIONS:
        raise CniError(INCOMPATIBLE_VERSION, f"incompatible CNI version {version!r}",
                       f"supported versions: {', '.join(SUPPORTED_VERSIONS)}")
    return version


def at_least(version: str, minimum: str) -> bool:
    """True when version is minimum or newer."""
    return version_key(version) >= version_key(minimum)
