"""`vpc-attach install` / `uninstall`: put the plugin on a host, and take back only its own files.

Modules: `cli` (flags, output, exit codes, --watch), `engine` (plan, atomic apply, manifest
rules), `manifest`, `files` (fingerprints, atomic writes), `targets`, `binaries` (what to stage
from a standalone build), `launcher` (launchers for a Python environment or a build's own
interpreter), `credentials` (token + kubeconfig), `hostfiles` (host.json, conflist), `errors`.
"""

from __future__ import annotations

from cni_plugin.install.cli import main

__all__ = ["main"]
