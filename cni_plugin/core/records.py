"""Small on-node records (which attachment a Pod chose, what it registered, which table id a
VPC keeps): written whole or not at all, under the host's lockDir."""

from __future__ import annotations

import os

from netconf.errors import IO_FAILURE, CniError


def write_record(path: str, text: str, what: str) -> None:
    """Replace the file at path with text atomically (its directory made, private); code 5
    naming `what` and the path when it cannot be written."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot record {what} in {path!r}",
                       exc.strerror or str(exc)) from None
