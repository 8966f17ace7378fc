"""`vpc-attach install` and `vpc-attach uninstall`: command line, output and exit codes.

Every host path is a path on the host (what the runtime and the plugin see); `--root` says where
the host's / is mounted for the installer (an init container mounts it at e.g. /host). Paths of
inputs (`--source`, `--conflist`, the ServiceAccount files) are the installer's own.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from cni_plugin.attachment.node import set_up_node
from cni_plugin.install.binaries import binary_targets, default_source, launcher_targets
from cni_plugin.install.credentials import (
    PLUGIN_SERVICE_ACCOUNT,
    SERVICEACCOUNT_DIR,
    HostToken,
    api_server,
    credential_targets,
    describe_expiry,
    read_service_account,
    token_expiry,
)
from cni_plugin.install.engine import Installer, Report
from cni_plugin.install.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, InstallError
from cni_plugin.install.hostfiles import HostSettingsFile, conflist_target
from cni_plugin.install.targets import FileTarget, Root, Target
from cni_plugin.kernel import hostfilter
from netconf.errors import CniError
from netconf.host import (
    DEFAULT_AGENT_SOCKET,
    DEFAULT_HOST_CONFIG,
    DEFAULT_NAMESPACE,
    HOST_CONFIG_ENV,
    read_host_file,
    resolve_datapath_settings,
    resolve_host_settings,
)

DEFAULT_CNI_BIN_DIR = "/opt/cni/bin"
DEFAULT_CNI_CONF_DIR = "/etc/cni/net.d"
DEFAULT_MANIFEST = "/var/lib/vpc-attach/install-manifest.json"
DEFAULT_KUBECONFIG = "/etc/vpc-attach/kubeconfig"
DEFAULT_TOKEN_FILE = "/etc/vpc-attach/token"
DEFAULT_LOG_FILE = "/var/log/vpc-attach/vpc-attach.log"
DEFAULT_REFRESH_SECONDS = 60.0

# (flag destination, environment variables consulted when the flag is absent, first wins)
_ENVIRONMENT: dict[str, tuple[str, ...]] = {
    "node_name": ("NODE_NAME", "VPC_ATTACH_NODE_NAME"),
    "namespace": ("VPC_ATTACH_NAMESPACE",),
    "log_file": ("VPC_ATTACH_LOG_FILE",),
    "log_level": ("VPC_ATTACH_LOG_LEVEL",),
    "agent_socket": ("VPC_ATTACH_AGENT_SOCKET",),
    "log_max_bytes": ("VPC_ATTACH_LOG_MAX_BYTES",),
    "log_backups": ("VPC_ATTACH_LOG_BACKUPS",),
    "tenancy": ("VPC_ATTACH_TENANCY",),
}


def main(argv: list[str]) -> int:
    """Run `install ...` or `uninstall ...`; return the exit status (never raises)."""
    if not argv or argv[0] not in ("install", "uninstall"):
        print("usage: vpc-attach {install|uninstall} [options]  (--help for options)",
              file=sys.stderr)
        return EXIT_USAGE
    command = argv[0]
    parser = _parser(command)
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if command == "install":
            return install(args, os.environ, sys.stdout, sys.stderr)
        return uninstall(args, sys.stdout, sys.stderr)
    except InstallError as exc:
        _print_error(command, exc.message, exc.hint)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: one line, never a traceback
        _print_error(command, f"internal error: {type(exc).__name__}: {exc}", None)
        return EXIT_FAILED


def _print_error(command: str, message: str, hint: str | None) -> None:
    print(f"vpc-attach {command}: error: {message}", file=sys.stderr)
    if hint:
        print(f"vpc-attach {command}: hint: {hint}", file=sys.stderr)


def _host_path(value: str) -> str:
    if not value.startswith("/") or ".." in value.split("/"):
        raise argparse.ArgumentTypeError(f"{value!r} must be an absolute host path without '..'")
    return os.path.normpath(value)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{value!r} must be a number of seconds in (0, 86400]")
    return seconds


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"vpc-attach {command}",
        description=("Stage vpc-attach on a host: executables, host settings, kubeconfig, "
                     "optional conflist. Refuses to overwrite files it did not write."
                     if command == "install" else
                     "Remove the files `vpc-attach install` wrote that still have the content "
                     "it wrote. Exit codes: 0 done, 1 failure."),
        epilog="Exit codes: 0 done (or nothing to do), 1 failure, 2 usage, 3 refused (a file "
               "in the way was not written by the installer or was modified; nothing written)."
        if command == "install" else None)
    paths = parser.add_argument_group("host paths (absolute, as seen on the host)")
    paths.add_argument("--root", default="/", help="where the host's / is mounted (default /)")
    paths.add_argument("--manifest", type=_host_path, default=DEFAULT_MANIFEST,
                       help=f"record of what was written (default {DEFAULT_MANIFEST})")
    protection = parser.add_mutually_exclusive_group()
    protection.add_argument(
        "--host-protection", dest="host_protection", action="store_true", default=None,
        help="write (uninstall: delete) the nftables table `inet vpc_attach` in this network "
        "namespace (the default when --root is /)")
    protection.add_argument("--no-host-protection", dest="host_protection",
                            action="store_false", help="leave the nftables table alone")
    if command == "uninstall":
        return parser
    paths.add_argument("--cni-bin-dir", type=_host_path, default=DEFAULT_CNI_BIN_DIR,
                       help=f"default {DEFAULT_CNI_BIN_DIR}")
    paths.add_argument("--cni-conf-dir", type=_host_path, default=DEFAULT_CNI_CONF_DIR,
                       help=f"default {DEFAULT_CNI_CONF_DIR}")
    paths.add_argument("--host-config", type=_host_path, default=DEFAULT_HOST_CONFIG,
                       help=f"host settings file the plugin reads (default {DEFAULT_HOST_CONFIG})")
    paths.add_argument("--kubeconfig", type=_host_path, default=DEFAULT_KUBECONFIG,
                       help=f"kubeconfig to write for the plugin (default {DEFAULT_KUBECONFIG})")
    paths.add_argument("--token-file", type=_host_path, default=DEFAULT_TOKEN_FILE,
                       help=f"copy of the ServiceAccount token (default {DEFAULT_TOKEN_FILE})")

    stage = parser.add_argument_group("what to stage")
    stage.add_argument("--source", help="directory of the executables to stage: a standalone "
                       "build (default: this executable's own, when it is one; otherwise "
                       "launchers for the Python environment the installer runs in)")
    stage.add_argument("--no-binaries", action="store_true", help="stage no executables")
    stage.add_argument("--conflist", help="a conflist file to copy into the conf dir")
    stage.add_argument("--conflist-name", help="its name there (default: the file's name)")
    stage.add_argument("--no-kubeconfig", action="store_true",
                       help="write no token or kubeconfig (publishing off)")
    stage.add_argument("--force", action="store_true",
                       help="overwrite files that the installer did not write or that changed")

    settings = parser.add_argument_group(
        "host settings (flag, else environment variable, else default)")
    settings.add_argument("--node-name", help="this node's name (env NODE_NAME, "
                          "VPC_ATTACH_NODE_NAME; required unless --no-kubeconfig)")
    settings.add_argument("--namespace", help=f"namespace of the BGP resources (env "
                          f"VPC_ATTACH_NAMESPACE, default {DEFAULT_NAMESPACE})")
    settings.add_argument("--log-file", help=f"host path of the plugin's log (env "
                          f"VPC_ATTACH_LOG_FILE, default {DEFAULT_LOG_FILE})")
    settings.add_argument("--log-level", help="debug|info|warning|error (env "
                          "VPC_ATTACH_LOG_LEVEL, default info)")
    settings.add_argument("--agent-socket", help=f"node agent socket (env "
                          f"VPC_ATTACH_AGENT_SOCKET, default {DEFAULT_AGENT_SOCKET})")
    settings.add_argument("--log-max-bytes", help="size at which the log rotates, 0 never (env "
                          "VPC_ATTACH_LOG_MAX_BYTES; default: unset, the plugin's 10 MiB)")
    settings.add_argument("--log-backups", help="rotated log files kept (env "
                          "VPC_ATTACH_LOG_BACKUPS; default: unset, the plugin's 3)")
    settings.add_argument("--tenancy", help="VPCBindings: enforce|audit|off (env "
                          "VPC_ATTACH_TENANCY; default: unset, enforce with a kubeconfig)")

    kube = parser.add_argument_group("Kubernetes credentials")
    kube.add_argument("--serviceaccount-dir", default=SERVICEACCOUNT_DIR,
                      help=f"where token, ca.crt and namespace are (default {SERVICEACCOUNT_DIR})")
    kube.add_argument("--sa-token", help="token file (default SERVICEACCOUNT_DIR/token)")
    kube.add_argument("--sa-ca", help="CA file (default SERVICEACCOUNT_DIR/ca.crt)")
    kube.add_argument("--sa-namespace", help="namespace file (default SERVICEACCOUNT_DIR/"
                      "namespace)")
    kube.add_argument("--server", help="API server URL (default https://"
                      "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
    kube.add_argument("--plugin-service-account", default=PLUGIN_SERVICE_ACCOUNT,
                      help="the plugin's ServiceAccount, in the installer's namespace: an "
                      "installer running as another one writes a token of it bound to the "
                      f"Node (default {PLUGIN_SERVICE_ACCOUNT})")
    kube.add_argument("--watch", action="store_true",
                      help="after installing, keep the token copy and kubeconfig current "
                      "(until SIGTERM)")
    kube.add_argument("--refresh-interval", type=_seconds, default=DEFAULT_REFRESH_SECONDS,
                      help=f"seconds between token checks in --watch mode (default "
                      f"{DEFAULT_REFRESH_SECONDS:.0f}; shorter near the token's expiry)")
    return parser


def _setting(args: argparse.Namespace, name: str, environ: Mapping[str, str],
             default: str | None) -> str | None:
    value: str | None = getattr(args, name)
    if value:
        return value
    return next((environ[e] for e in _ENVIRONMENT[name] if environ.get(e)), default)


def _whole(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise InstallError(f"{flag} {value!r} is not a whole number")
    return int(value)


def _root(args: argparse.Namespace) -> Root:
    root = Path(args.root)
    if not root.is_dir():
        raise InstallError(f"--root {root} is not a directory")
    return Root(root.resolve())


def install(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO,
            err: TextIO, stop: threading.Event | None = None) -> int:
    """Stage everything once; with --watch, then keep the credentials fresh until stopped."""
    if args.watch and args.no_kubeconfig:  # refused before anything is written
        raise InstallError("--watch refreshes the kubeconfig's token: it needs credentials",
                           "drop --no-kubeconfig")
    root = _root(args)
    targets: list[Target] = []
    if not args.no_binaries:
        source = Path(args.source) if args.source else default_source()
        targets += launcher_targets(args.cni_bin_dir) if source is None \
            else binary_targets(source, args.cni_bin_dir)
    node_name = _setting(args, "node_name", environ, None)
    if not node_name and not args.no_kubeconfig:
        raise InstallError("node name unknown", "pass --node-name or set NODE_NAME from the "
                           "downward API (fieldRef spec.nodeName), or --no-kubeconfig")
    credentials = _credentials(args, environ, node_name)
    log_level = _setting(args, "log_level", environ, "info") or "info"
    settings = HostSettingsFile(
        node_name=node_name,
        kubeconfig=None if args.no_kubeconfig else args.kubeconfig,
        log_file=_setting(args, "log_file", environ, DEFAULT_LOG_FILE),
        log_level=log_level.lower(),
        agent_socket=_setting(args, "agent_socket", environ, DEFAULT_AGENT_SOCKET)
        or DEFAULT_AGENT_SOCKET,
        namespace=_setting(args, "namespace", environ, DEFAULT_NAMESPACE) or DEFAULT_NAMESPACE,
        log_max_bytes=_whole(_setting(args, "log_max_bytes", environ, None), "--log-max-bytes"),
        log_backups=_whole(_setting(args, "log_backups", environ, None), "--log-backups"),
        tenancy=_setting(args, "tenancy", environ, None))
    targets.append(settings.target(args.host_config))
    targets += credentials()
    if args.conflist:  # last: once it is there the runtime starts calling the plugin
        targets.append(conflist_target(Path(args.conflist), args.cni_conf_dir,
                                       args.conflist_name))
    installer = Installer(root, args.manifest, force=args.force)
    _print_report("install", installer.install(targets), out, err)
    if _protects_host(args):  # a node without an agent is protected from its first ADD on
        _protect_host(environ, root.local(args.host_config))
        print(f"wrote nftables table {hostfilter.FAMILY} {hostfilter.TABLE}", file=out)
    if not args.watch:
        return EXIT_OK
    return watch(installer, credentials, args.token_file, args.refresh_interval, out, err,
                 stop or _stop_on_signals())


def _credentials(args: argparse.Namespace, environ: Mapping[str, str],
                 node_name: str | None) -> Callable[[], list[FileTarget]]:
    """A function reading the ServiceAccount afresh into token + kubeconfig targets."""
    if args.no_kubeconfig:
        return list
    sa_dir = Path(args.serviceaccount_dir)
    token = Path(args.sa_token) if args.sa_token else sa_dir / "token"
    ca = Path(args.sa_ca) if args.sa_ca else sa_dir / "ca.crt"
    namespace = Path(args.sa_namespace) if args.sa_namespace else sa_dir / "namespace"
    server = api_server(args.server, environ)
    host_token = HostToken(server, node_name, args.plugin_service_account)

    def read() -> list[FileTarget]:
        account = host_token.for_host(read_service_account(token, ca, namespace))
        return credential_targets(account, server, args.kubeconfig, args.token_file, node_name)

    return read  # install() reads it before anything is written: unusable credentials fail


def watch(installer: Installer, credentials: Callable[[], list[FileTarget]], token_file: str,
          interval: float, out: TextIO, err: TextIO, stop: threading.Event) -> int:
    """Re-copy the token (and kubeconfig) whenever it changes, until stop is set."""
    print(f"vpc-attach install: watching the ServiceAccount token every {interval:g} s",
          file=out, flush=True)
    warned_for: bytes | None = None
    wait = 0.0
    while not stop.wait(wait):
        wait = interval
        try:
            targets = credentials()
            report = installer.install(targets)
        except InstallError as exc:
            print(f"vpc-attach install: error: refreshing credentials: {exc.message}",
                  file=err, flush=True)
            continue
        content = next((t.content for t in targets if t.path == token_file), b"")
        token = content if isinstance(content, bytes) else b""
        expiry = token_expiry(token)
        if report.changed:
            print(f"vpc-attach install: refreshed {', '.join(report.created + report.updated)}"
                  f" (token {describe_expiry(expiry)})", file=out, flush=True)
        if expiry is None:
            continue
        remaining = expiry - time.time()
        # The kubelet rotates projected tokens at 80% of their life: check often enough to
        # copy the new one well before the old one lapses, and say so if it never comes.
        wait = min(interval, max(1.0, remaining / 4))
        if remaining < 2 * interval and warned_for != token:
            warned_for = token
            print(f"vpc-attach install: warning: the ServiceAccount token "
                  f"{describe_expiry(expiry)} and has not been rotated yet", file=err,
                  flush=True)
    print("vpc-attach install: stopped watching", file=out, flush=True)
    return EXIT_OK


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def _protect_host(environ: Mapping[str, str], host_file: Path) -> None:
    try:
        files = {**environ, HOST_CONFIG_ENV: str(host_file)}
        host = resolve_host_settings({}, files)
        set_up_node(resolve_datapath_settings(environ, read_host_file(files)), host.lock_dir,
                    host.timeout_seconds)
    except CniError as exc:
        raise InstallError(f"host protection: {exc.msg}", exc.details) from None


def _remove_host_protection() -> bool:
    try:
        return hostfilter.remove()
    except CniError as exc:
        raise InstallError(f"host protection: {exc.msg}", exc.details) from None


def _protects_host(args: argparse.Namespace) -> bool:
    if args.host_protection is not None:
        return bool(args.host_protection)
    return Path(args.root).resolve() == Path("/")


def uninstall(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Remove what the manifest owns (and our nftables table, never anyone else's)."""
    if _protects_host(args) and _remove_host_protection():
        print(f"removed nftables table {hostfilter.FAMILY} {hostfilter.TABLE}", file=out)
    installer = Installer(_root(args), args.manifest)
    if not installer.manifest_path.exists():
        print(f"vpc-attach uninstall: nothing to remove (no manifest at {args.manifest})",
              file=out)
        return EXIT_OK
    _print_report("uninstall", installer.uninstall(), out, err)
    return EXIT_OK


def _print_report(command: str, report: Report, out: TextIO, err: TextIO) -> None:
    for verb, paths in (("created", report.created), ("updated", report.updated),
                        ("removed", report.removed)):
        for path in paths:
            print(f"{verb} {path}", file=out)
    for kept in report.kept:
        print(f"vpc-attach {command}: warning: kept {kept}", file=err)
    if command == "install" and not report.changed:
        print(f"vpc-attach install: nothing to change ({len(report.unchanged)} items up to "
              "date)", file=out)
    elif command == "install":
        print(f"vpc-attach install: {len(report.created)} created, {len(report.updated)} "
              f"updated, {len(report.removed)} removed, {len(report.unchanged)} unchanged",
              file=out)
    else:
        print(f"vpc-attach uninstall: {len(report.removed)} removed, {len(report.kept)} kept",
              file=out)
    out.flush()
