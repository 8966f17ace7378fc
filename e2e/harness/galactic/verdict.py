"""What galactic's ingress sidecar makes of EndpointSlices: its own selection and route building
(``internal/ingresssidecar``: ``IsSelected``, ``BuildDesiredRoute``), run by the verdict program
built next to galactic-router (``verdict/main.go``)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERDICT_TIMEOUT_S = 60


@dataclass(frozen=True)
class SidecarRoute:
    """The sidecar's DesiredRoute: traffic for ``prefix`` of ``vpc`` goes to ``sid``."""

    vpc: str
    prefix: str
    sid: str


@dataclass(frozen=True)
class Verdict:
    """One slice: selected or not, and the route built, or the error the sidecar would log."""

    namespace: str
    name: str
    selected: bool
    route: SidecarRoute | None
    error: str


def parse_verdicts(text: str) -> list[Verdict]:
    """The verdict program's output: a JSON list, one object per slice."""
    verdicts = []
    for entry in json.loads(text):
        route = entry.get("route")
        verdicts.append(Verdict(
            namespace=str(entry["namespace"]), name=str(entry["name"]),
            selected=bool(entry["selected"]),
            route=SidecarRoute(str(route["vpc"]), str(route["prefix"]), str(route["sid"]))
            if route else None,
            error=str(entry.get("error") or "")))
    return verdicts


def judge(program: Path, slices: list[dict[str, Any]]) -> list[Verdict]:
    """Run the verdict program on EndpointSlices as the API server returned them."""
    result = subprocess.run([str(program)], input=json.dumps(slices), capture_output=True,
                            text=True, timeout=VERDICT_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{program.name} failed ({result.returncode}): {result.stderr}")
    return parse_verdicts(result.stdout)
