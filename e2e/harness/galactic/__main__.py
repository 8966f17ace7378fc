"""``python -m e2e.harness.galactic build``: build (if needed) and cache galactic-router,
galactic-cni, the slice-verdict and eBPF-sweep programs and gobgpd/gobgp (see ``build``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time

from e2e.harness.galactic.build import BuildError, ensure_galactic_built


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; return the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m e2e.harness.galactic", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build",
                        help="build galactic-router, galactic-cni, our programs, gobgpd, gobgp")
    parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    started = time.monotonic()
    try:
        built = ensure_galactic_built()
    except (BuildError, OSError) as exc:
        logging.getLogger("e2e.harness.galactic").error("build failed: %s", exc)
        return 1
    for name, path in dataclasses.asdict(built).items():
        print(f"{name}: {path}", file=sys.stderr)
    print(f"galactic: ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
