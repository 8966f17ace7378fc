"""The `vpc-attach-ipam` executable: env + stdin in, one JSON document out, exit status."""

from __future__ import annotations


def main() -> None:
    """Entry point of `vpc-attach-ipam` (the IPAM plugin)."""
    from cni_plugin.dispatch import serve_stdio
    from cni_plugin.ipam.plugin.dispatch import ipam_verbs

    # Its delegating plugin logs the verb line; the IPAM plugin only logs what goes wrong.
    serve_stdio(ipam_verbs, log_line=False)


if __name__ == "__main__":
    main()
