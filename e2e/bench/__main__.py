"""`python -m e2e.bench [--quick] [--json OUT] [--results DIR]` (as root)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

RESULTS = Path(__file__).resolve().parent / "results"


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _known_keys() -> tuple[str, ...]:
    from e2e.bench.plan import KEYS
    return KEYS


def _keys(value: str) -> frozenset[str]:
    keys = frozenset(key.strip() for key in value.split(",") if key.strip())
    unknown = sorted(keys - set(_known_keys()))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown subject(s): {', '.join(unknown)}")
    return keys


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, write the results, print the markdown table."""
    parser = argparse.ArgumentParser(prog="python -m e2e.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="10 measured runs per row instead of 50 (2 bursts of 32)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the JSON here")
    parser.add_argument("--results", type=Path, default=RESULTS, metavar="DIR",
                        help=f"where latest.md/.json/.png go (default {RESULTS})")
    parser.add_argument("--runs", type=int, help="measured runs per row (overrides --quick)")
    parser.add_argument("--objects", type=int, default=2000,
                        help="foreign objects of each kind in the large control plane")
    parser.add_argument("--no-cluster", action="store_true",
                        help="skip the control planes (and so every publishing row)")
    parser.add_argument("--only", metavar="KEY[,KEY…]", type=_keys, default=frozenset(),
                        help="measure only these subjects (and the Go reference, always); "
                             "keys: " + ", ".join(_known_keys()))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("python -m e2e.bench needs root (it creates network namespaces)", file=sys.stderr)
        return 2
    from e2e.bench import report as report_module
    from e2e.bench.run import Options, log
    from e2e.bench.suite import Bench

    runs = args.runs or (10 if args.quick else 50)
    options = Options(runs=runs, warmup=2, bursts=max(2, runs // 10), objects=args.objects,
                      quick=args.quick, with_cluster=not args.no_cluster, only=args.only)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # also when started with
        signal.signal(signum, _interrupt)  # SIGINT ignored (a background job of a script)
    bench = Bench(options)
    try:
        report = bench.run()
    except KeyboardInterrupt:
        log("interrupted: cleaning up, nothing written")
        return 130
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # the clean-up itself is not interrupted
        bench.close()
    report_module.write(report, args.results, args.json)
    print(report_module.markdown(report))
    log(f"results in {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
