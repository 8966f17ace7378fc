"""The `vpc-attach` executable: env + stdin in, one JSON document out, exit status.

This is only a transport: everything it does is `dispatch.serve_stdio`.
"""

from __future__ import annotations


def main() -> None:
    """Entry point of `vpc-attach` (the CNI plugin)."""
    from cni_plugin.dispatch import serve_stdio

    serve_stdio()


if __name__ == "__main__":
    main()
