"""Kubeconfig files for the test control plane (credentials embedded, CA always verified)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _kubeconfig(server: str, ca_file: Path, user_name: str, user: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "vpc-attach-e2e",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_file)},
            }
        ],
        "users": [{"name": user_name, "user": user}],
        "contexts": [
            {"name": user_name, "context": {"cluster": "vpc-attach-e2e", "user": user_name}}
        ],
        "current-context": user_name,
    }


def write_cert_kubeconfig(
    path: Path, server: str, ca_file: Path, user_name: str, cert_file: Path, key_file: Path
) -> Path:
    """Write a kubeconfig that authenticates with a client certificate."""
    user = {"client-certificate-data": _b64(cert_file), "client-key-data": _b64(key_file)}
    return _write(path, _kubeconfig(server, ca_file, user_name, user))


def write_token_kubeconfig(
    path: Path, server: str, ca_file: Path, user_name: str, token: str
) -> Path:
    """Write a kubeconfig that authenticates only with a bearer token."""
    return _write(path, _kubeconfig(server, ca_file, user_name, {"token": token}))


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
