"""``python -m e2e.cluster``: forwards to ``python -m e2e.harness.cluster`` (same arguments)."""

from __future__ import annotations

import sys

from e2e.harness.cluster.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
