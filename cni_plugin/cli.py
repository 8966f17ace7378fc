"""The `vpc-attach` executable.

Without arguments it is the CNI plugin: env + stdin in, one JSON document out, exit status.
Subcommands: `vpc-attach agent` (the node agent), `vpc-attach install` / `uninstall`,
`vpc-attach doctor` (diagnose the node).

Behind a standalone build's launcher (cni_plugin/install/launcher.py) `main` gets `full`, the
build's own executable: this module then only answers VERSION and forwards to the agent, and
hands everything else to `full` by exec — same arguments, environment and stdin.
"""

from __future__ import annotations

import sys

SUBCOMMANDS = ("agent", "install", "uninstall", "doctor")
# Set for the executable a launcher hands a verb to: that verb already asked the agent (not a
# VPC_ATTACH_* name: it must not be forwarded, and it is removed before the verb runs).
HANDED_OVER = "_VPC_ATTACH_HANDED_OVER"


def main(full: str | None = None) -> None:
    """Entry point of `vpc-attach`; full: see the module doc."""
    args = sys.argv[1:]
    if args and args[0] in SUBCOMMANDS:
        if full is not None:
            _hand_over(full, None)
        _subcommand(args[0], args[1:])
        return
    if args and args[0] in ("-h", "--help"):
        print(f"usage: vpc-attach [{'|'.join(SUBCOMMANDS)}] ...\n"
              "Without arguments: the CNI plugin (CNI_COMMAND etc. in the environment, "
              "the network config on stdin).")
        return
    _cni(full)


def _cni(full: str | None) -> None:
    # Forwarding path: standard library only (SPEC §11). VERSION never needs the agent.
    import posix  # not os: see agent/client.py's docstring

    environ = {key.decode("utf-8", "surrogateescape"): value.decode("utf-8", "surrogateescape")
               for key, value in posix.environ.items()}
    if environ.get("CNI_COMMAND") == "VERSION":  # ignores stdin; needs none of the models
        print_version_and_exit()
    stdin = sys.stdin.buffer.read()
    answer = None
    if environ.pop(HANDED_OVER, None) is not None:
        import os

        os.environ.pop(HANDED_OVER, None)  # not for IPAM delegates
    else:
        from cni_plugin.agent.client import forward, route

        answer = forward(environ, stdin, *route(environ, stdin))
    if answer is not None:
        status, text = answer
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
        sys.exit(status)
    if full is not None:
        _hand_over(full, stdin)
    from cni_plugin.stdio import answer_stdio

    answer_stdio(environ, stdin)


def print_version_and_exit() -> None:
    """Answer VERSION on stdout and exit 0 (shared by both executables; no `json`)."""
    from cni_plugin.verbs.version import version_json

    sys.stdout.write(version_json())
    sys.stdout.flush()
    sys.exit(0)


def _hand_over(executable: str, stdin: bytes | None) -> None:
    """Become executable with our arguments and environment; stdin, if this process already
    read it, is replayed from an anonymous file. Answers a CNI error if the exec fails."""
    import os

    try:
        if stdin is not None:
            replay = os.memfd_create("vpc-attach-stdin")
            view = memoryview(stdin)
            while view:
                view = view[os.write(replay, view):]
            os.lseek(replay, 0, os.SEEK_SET)
            os.dup2(replay, 0)
            os.close(replay)
            os.environ[HANDED_OVER] = "1"  # it must not ask the agent a second time
        os.execv(executable, [executable, *sys.argv[1:]])
    except OSError as exc:
        import json

        from netconf.errors import IO_FAILURE, CniError
        from netconf.versions import CURRENT_VERSION

        error = CniError(IO_FAILURE, f"cannot run {executable}: {exc.strerror or exc}",
                         "the standalone build this launcher belongs to is gone or broken; "
                         "re-run `vpc-attach install`")
        sys.stdout.write(json.dumps(error.to_dict(CURRENT_VERSION)))
        sys.stdout.flush()
        sys.exit(1)


def _subcommand(name: str, argv: list[str]) -> None:
    if name == "agent":
        from cni_plugin.agent.server import main as agent_main
        sys.exit(agent_main(argv))
    if name == "doctor":
        from cni_plugin.doctor import main as doctor_main
        sys.exit(doctor_main(argv))
    from cni_plugin.install import main as install_main
    sys.exit(install_main([name, *argv]))


if __name__ == "__main__":
    main()
