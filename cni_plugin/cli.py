"""The `vpc-attach` executable.

Without arguments it is the CNI plugin: env + stdin in, one JSON document out, exit status.
Subcommands: `vpc-attach agent` (the node agent), `vpc-attach install` / `uninstall`.
"""

from __future__ import annotations

import sys

SUBCOMMANDS = ("agent", "install", "uninstall")


def main() -> None:
    """Entry point of `vpc-attach`."""
    args = sys.argv[1:]
    if args and args[0] in SUBCOMMANDS:
        _subcommand(args[0], args[1:])
        return
    if args and args[0] in ("-h", "--help"):
        print(f"usage: vpc-attach [{'|'.join(SUBCOMMANDS)}] ...\n"
              "Without arguments: the CNI plugin (CNI_COMMAND etc. in the environment, "
              "the network config on stdin).")
        return
    _cni()


def _cni() -> None:
    # Forwarding path: standard library only (SPEC §11). VERSION never needs the agent.
    import os

    environ = dict(os.environ)
    if environ.get("CNI_COMMAND") == "VERSION":  # ignores stdin; needs none of the models
        answer_version()
    from cni_plugin.agent.client import forward, socket_path

    stdin = sys.stdin.buffer.read()
    answer = forward(environ, stdin, socket_path(environ, stdin))
    if answer is not None:
        status, text = answer
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
        sys.exit(status)
    from cni_plugin.dispatch import answer_stdio

    answer_stdio(environ, stdin)


def answer_version() -> None:
    """Print the VERSION answer and exit 0 (shared by both executables; no `json`)."""
    from cni_plugin.verbs.version import version_json

    sys.stdout.write(version_json())
    sys.stdout.flush()
    sys.exit(0)


def _subcommand(name: str, argv: list[str]) -> None:
    if name == "agent":
        from cni_plugin.agent.server import main as agent_main
        sys.exit(agent_main(argv))
    from cni_plugin.install import main as install_main
    sys.exit(install_main([name, *argv]))


if __name__ == "__main__":
    main()
