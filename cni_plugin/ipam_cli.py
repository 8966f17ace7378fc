"""The `vpc-attach-ipam` executable: env + stdin in, one JSON document out, exit status."""

from __future__ import annotations

import os


def main() -> None:
    """Entry point of `vpc-attach-ipam` (the IPAM plugin)."""
    if os.environ.get("CNI_COMMAND") == "VERSION":  # ignores stdin; needs none of the models
        from cni_plugin.cli import print_version_and_exit

        print_version_and_exit()
    from cni_plugin.dispatch import ipam_verbs
    from cni_plugin.stdio import serve_stdio

    # Its delegating plugin logs the verb line; the IPAM plugin only logs what goes wrong.
    serve_stdio(ipam_verbs, log_line=False)


if __name__ == "__main__":
    main()
