"""The `vpc-attach-ipam` executable: env + stdin in, one JSON document out, exit status."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    """Entry point of `vpc-attach-ipam` (the IPAM plugin)."""
    from cni_plugin import oplog
    from cni_plugin.ipam.plugin import dispatch
    from cni_plugin.verbs.request import Request

    environ = dict(os.environ)
    # VERSION ignores stdin; every other verb reads the network config from it.
    stdin = b"" if environ.get("CNI_COMMAND") == "VERSION" else sys.stdin.buffer.read()
    request = Request(environ=environ, stdin=stdin)
    oplog.configure(request)
    status, payload = dispatch.run(request)
    if payload is not None:
        sys.stdout.write(json.dumps(payload))
        sys.stdout.flush()
    sys.exit(status)


if __name__ == "__main__":
    main()
