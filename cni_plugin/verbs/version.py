"""VERSION: which CNI spec versions we speak (stdin is ignored)."""

from __future__ import annotations

from typing import Any

from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS


def version() -> dict[str, Any]:
    """The VERSION answer."""
    return {"cniVersion": CURRENT_VERSION, "supportedVersions": list(SUPPORTED_VERSIONS)}
