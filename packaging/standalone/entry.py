"""Entry point of the standalone bundle: one executable, dispatching on the name it runs as.

`vpc-attach-ipam` (a symlink to the same executable) is the IPAM plugin; any other name is
`vpc-attach` with its subcommands.
"""

from __future__ import annotations

import os
import sys


def _restore_environment() -> None:
    # The bootloader re-executes itself with LD_LIBRARY_PATH pointing into the bundle and with
    # _PYI_* markers. The loader has read them by now; children (IPAM delegates, possibly our
    # own vpc-attach-ipam) must get the runtime's environment back, not ours.
    original = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        os.environ.pop("LD_LIBRARY_PATH", None)
    else:
        os.environ["LD_LIBRARY_PATH"] = original
    for name in [key for key in os.environ if key.startswith("_PYI_")]:
        del os.environ[name]


def main() -> None:
    """Run the program named by argv[0]."""
    _restore_environment()
    if os.path.basename(sys.argv[0]).startswith("vpc-attach-ipam"):
        from cni_plugin.ipam_cli import main as ipam_main
        ipam_main()
    else:
        from cni_plugin.cli import main as plugin_main
        plugin_main()


if __name__ == "__main__":
    main()
