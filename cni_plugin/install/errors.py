"""Installer failures and the exit codes they map to."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # bad input, missing source, I/O error
EXIT_USAGE = 2  # bad command line (argparse's own code)
EXIT_REFUSED = 3  # a file in the way is not ours, or was modified: nothing was written


class InstallError(Exception):
    """A failure to report in one line (plus a hint), never as a traceback."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class Refused(InstallError):
    """Files in the way that the installer did not write, or that changed since."""

    exit_code = EXIT_REFUSED

    def __init__(self, problems: list[str]) -> None:
        super().__init__("refusing to overwrite:\n" + "\n".join(f"  {p}" for p in problems),
                         "remove or move those files, or pass --force to overwrite them")
        self.problems = problems
