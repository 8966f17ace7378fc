"""The `vpc-attach-ipam` executable: env + stdin in, one JSON document out, exit status."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    """Entry point of `vpc-attach-ipam` (the IPAM plugin)."""
    environ = dict(os.environ)
    if environ.get("CNI_COMMAND") == "VERSION":  # ignores stdin; no need to load the models
        from cni_plugin.verbs.version import version
        sys.stdout.write(json.dumps(version()))
        sys.stdout.flush()
        sys.exit(0)

    from cni_plugin import oplog
    from cni_plugin.ipam.plugin import dispatch
    from cni_plugin.verbs.request import Request

    stdin = sys.stdin.buffer.read()
    request = Request(environ=environ, stdin=stdin)
    oplog.configure(request)
    status, payload = dispatch.run(request)
    if payload is not None:
        sys.stdout.write(json.dumps(payload))
        sys.stdout.flush()
    sys.exit(status)


if __name__ == "__main__":
    main()
