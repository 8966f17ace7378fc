"""VERSION: which CNI spec versions we speak (stdin is ignored)."""

from __future__ import annotations

from netconf.versions import CURRENT_VERSION, SUPPORTED_VERSIONS


def version() -> dict[str, object]:
    """The VERSION answer."""
    return {"cniVersion": CURRENT_VERSION, "supportedVersions": list(SUPPORTED_VERSIONS)}


def version_json() -> str:
    """The VERSION answer as JSON text, without `json` (which pulls in `re`): the executables
    answer VERSION before importing anything else. Versions are plain ASCII like "1.0.0"."""
    listed = ", ".join(f'"{v}"' for v in SUPPORTED_VERSIONS)
    return f'{{"cniVersion": "{CURRENT_VERSION}", "supportedVersions": [{listed}]}}'
