"""Build (once) and cache the Go CNI tools the e2e tests run for real.

Why: Debian 12 ships ``containernetworking-plugins`` 1.1.1, whose plugins do not
speak CNI spec 1.1.0 (no GC / STATUS verbs, ``supportedVersions`` stops at 1.0.0)
and which has no ``tap`` plugin; Debian has no ``cnitool`` at all.  vpc-attach
targets CNI 1.1.0, so the tests need the reference plugins and a libcni client
(``cnitool``) new enough to drive 1.1.0 conflists, and this machine can only get
them as Go modules from the module proxy.

Both are built with a throwaway wrapper module in a temp dir (``go mod init``,
``go get module@version``, ``go build -trimpath -ldflags='-s -w'``, static,
``CGO_ENABLED=0``) into a temp dir next to the cache entry, which is then renamed
into place, so an interrupted build never leaves a half-filled cache entry.
Cache root: ``${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}``; entries are keyed by
version.  When an entry is complete nothing runs (no ``go`` invocation).

    reference_plugins_dir() -> Path   # .../cni-plugins-v1.10.0/{ptp,host-local,...}
    cnitool_path()          -> Path   # .../cnitool-v1.3.1/cnitool
    cnitool_env(...), cnitool_command(...)  # how to drive cnitool (see their docs)

Every subprocess has a timeout; a failure raises :class:`GoToolsError` carrying the
command and its stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence

from cni_plugin.core.locks import acquire

__all__ = [
    "CNI_MODULE",
    "CNI_VERSION",
    "PLUGINS",
    "PLUGINS_MODULE",
    "PLUGINS_VERSION",
    "GoToolsError",
    "build_all",
    "build_plugins",
    "cache_root",
    "cnitool_command",
    "cnitool_env",
    "cnitool_path",
    "go_binary",
    "go_env",
    "reference_plugins_dir",
]

PLUGINS_MODULE = "github.com/containernetworking/plugins"
PLUGINS_VERSION = "v1.10.0"
# Reference plugins built (binary name -> package under PLUGINS_MODULE).  Every
# Linux plugin of v1.10.0 except dhcp (needs a daemon) and the sample.
PLUGINS: Mapping[str, str] = {
    "bridge": "plugins/main/bridge",
    "dummy": "plugins/main/dummy",
    "host-device": "plugins/main/host-device",
    "ipvlan": "plugins/main/ipvlan",
    "loopback": "plugins/main/loopback",
    "macvlan": "plugins/main/macvlan",
    "ptp": "plugins/main/ptp",
    "tap": "plugins/main/tap",
    "vlan": "plugins/main/vlan",
    "host-local": "plugins/ipam/host-local",
    "static": "plugins/ipam/static",
    "bandwidth": "plugins/meta/bandwidth",
    "firewall": "plugins/meta/firewall",
    "portmap": "plugins/meta/portmap",
    "sbr": "plugins/meta/sbr",
    "tuning": "plugins/meta/tuning",
    "vrf": "plugins/meta/vrf",
}

# cnitool lives inside the main cni module (github.com/containernetworking/cni/cnitool
# is a package, not a separate module, up to v1.3.1).  v1.3.1 is the libcni that
# plugins v1.10.0 itself requires; it supports spec 1.1.0 (GC, STATUS).
CNI_MODULE = "github.com/containernetworking/cni"
CNI_VERSION = "v1.3.1"
CNITOOL_PACKAGE = CNI_MODULE + "/cnitool"

# Timeouts (seconds).  A cold build of all plugins takes ~1-2 min on 2 cores.
GO_GET_TIMEOUT = 600.0
GO_BUILD_TIMEOUT = 1800.0
SHORT_TIMEOUT = 60.0
LOCK_TIMEOUT = GO_GET_TIMEOUT + GO_BUILD_TIMEOUT + 120.0


class GoToolsError(RuntimeError):
    """A build step failed; carries the command and its stderr."""

    def __init__(self, message: str, cmd: Sequence[str] | None = None, stderr: str = "") -> None:
        self.cmd = list(cmd) if cmd is not None else None
        self.stderr = stderr
        text = message
        if cmd is not None:
            text += f"\ncommand: {' '.join(cmd)}"
        if stderr:
            text += f"\nstderr:\n{stderr.rstrip()}"
        super().__init__(text)


def cache_root() -> pathlib.Path:
    """``${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}``."""
    env = os.environ.get("VPC_ATTACH_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "vpc-attach"


def go_binary() -> str:
    """The go toolchain's executable (GoToolsError naming where it looked if absent)."""
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if go is None:
        raise GoToolsError(
            "the go toolchain is not installed (no `go` in PATH or /usr/local/go/bin)"
        )
    return go


def _die_with_parent() -> None:
    """In the child: get SIGKILL if we die (e.g. SIGTERM), so no orphan keeps building."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _run(cmd: Sequence[str], *, cwd: pathlib.Path, env: Mapping[str, str], timeout: float) -> str:
    try:
        proc = subprocess.run(
            list(cmd),
            cwd=cwd,
            env=dict(env),
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            preexec_fn=_die_with_parent,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = (
            exc.stderr.decode(errors="replace")
            if isinstance(exc.stderr, bytes)
            else (exc.stderr or "")
        )
        raise GoToolsError(f"timed out after {timeout:.0f}s", cmd, stderr) from None
    except OSError as exc:
        raise GoToolsError(f"could not run: {exc}", cmd) from None
    if proc.returncode != 0:
        raise GoToolsError(f"exit status {proc.returncode}", cmd, proc.stderr)
    return proc.stdout


def go_env(workdir: pathlib.Path) -> dict[str, str]:
    """Our environment for `go`: reproducible, local toolchain only, temp files in workdir."""
    env = dict(os.environ)
    env.update(
        GOWORK="off",  # never pick up a go.work from an enclosing dir
        GOFLAGS="-mod=mod -buildvcs=false",  # let `go build` complete go.sum of the wrapper
        GOTOOLCHAIN="local",  # fail clearly instead of downloading a toolchain
        CGO_ENABLED="0",  # static binaries (usable in a pause image / any netns)
        GOOS="linux",
        GO111MODULE="on",
    )
    env.setdefault("HOME", str(pathlib.Path.home()))
    env["TMPDIR"] = str(workdir)  # go's own temp files go with our temp dir
    return env


def _complete(entry: pathlib.Path, names: Sequence[str]) -> bool:
    return all(os.access(entry / n, os.X_OK) and (entry / n).is_file() for n in names)


@contextlib.contextmanager
def _lock(root: pathlib.Path, name: str, timeout: float) -> Iterator[None]:
    """Host-wide lock so two processes never build the same entry at once."""
    lock_path = root / f".{name}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not acquire(fd, timeout):
            raise GoToolsError(f"timed out after {timeout:.0f}s waiting for build lock "
                               f"{lock_path}")
        yield
    finally:
        os.close(fd)  # releases the flock


def _ensure(
    entry_name: str, names: Sequence[str], module: str, version: str, packages: Sequence[str]
) -> pathlib.Path:
    """Return cache_root()/entry_name, building ``packages`` of ``module@version`` if needed.

    ``packages`` are full import paths; ``go build -o DIR/`` names each binary after the
    last element of its path, which must equal ``names``.
    """
    root = cache_root()
    entry = root / entry_name
    if _complete(entry, names):
        return entry  # fast path: no go, no lock
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root, entry_name, LOCK_TIMEOUT):
        if _complete(entry, names):  # another process finished it while we waited
            return entry
        # Under the lock, leftovers of an interrupted build of this entry are stale.
        for stale in list(root.glob(f".{entry_name}.tmp-*")) + list(
            root.glob(f".{entry_name}.old-*")
        ):
            shutil.rmtree(stale, ignore_errors=True)
        go = go_binary()
        # Everything of this attempt (wrapper module, go's TMPDIR, output) lives in one
        # staging dir next to the entry: same filesystem for the rename, one thing to clean.
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry_name}.tmp-", dir=root))
        try:
            (staging / "tmp").mkdir()
            env = go_env(staging / "tmp")
            wrapper = staging / "wrapper"
            wrapper.mkdir()
            _run(
                [go, "mod", "init", "vpcattach.invalid/gotools"],
                cwd=wrapper,
                env=env,
                timeout=SHORT_TIMEOUT,
            )
            _run([go, "get", f"{module}@{version}"], cwd=wrapper, env=env, timeout=GO_GET_TIMEOUT)
            out = staging / "bin"
            out.mkdir()
            # One invocation for all packages: same result as one per package, but the
            # dependency graph is loaded and compiled once.
            _run(
                [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(out) + "/", *packages],
                cwd=wrapper,
                env=env,
                timeout=GO_BUILD_TIMEOUT,
            )
            missing = [n for n in names if not os.access(out / n, os.X_OK)]
            if missing:
                raise GoToolsError(f"go build finished but did not produce {missing} in {out}")
            (out / "VERSION").write_text(f"{module} {version}\n")
            if entry.exists():  # a stale, incomplete entry (e.g. a binary deleted by hand)
                trash = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry_name}.old-", dir=root))
                os.rename(entry, trash / "old")
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(out, entry)  # atomic: the entry appears complete or not at all
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry


def reference_plugins_dir() -> pathlib.Path:
    """Dir holding the reference CNI plugins of ``PLUGINS_MODULE@PLUGINS_VERSION``.

    Use it as ``CNI_PATH`` (alone, or ahead of the vpc-attach binary's dir).
    """
    return _ensure(
        f"cni-plugins-{PLUGINS_VERSION}",
        list(PLUGINS),
        PLUGINS_MODULE,
        PLUGINS_VERSION,
        [f"{PLUGINS_MODULE}/{pkg}" for pkg in PLUGINS.values()],
    )


def cnitool_path() -> pathlib.Path:
    """Path of ``cnitool`` built from ``CNI_MODULE@CNI_VERSION`` (libcni with spec 1.1.0)."""
    entry = _ensure(
        f"cnitool-{CNI_VERSION}", ["cnitool"], CNI_MODULE, CNI_VERSION, [CNITOOL_PACKAGE]
    )
    return entry / "cnitool"


def cnitool_env(
    cni_path: os.PathLike[str] | str | Sequence[os.PathLike[str] | str],
    netconfpath: os.PathLike[str] | str,
    *,
    ifname: str | None = None,
    cni_args: str | None = None,
    cap_args: Mapping[str, object] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for ``cnitool``; these five variables are all it reads.

    ``CNI_PATH`` (':'-joined plugin dirs), ``NETCONFPATH`` (dir scanned for
    ``*.conflist``, then ``*.conf``/``*.json``; default ``/etc/cni/net.d``),
    ``CNI_IFNAME`` (default ``eth0``; ``cnitool -i NAME`` overrides it),
    ``CNI_ARGS`` (``"K1=V1;K2=V2"``), ``CAP_ARGS`` (JSON object of capability args).
    """
    env = dict(os.environ if base is None else base)
    dirs = [cni_path] if isinstance(cni_path, (str, os.PathLike)) else list(cni_path)
    env["CNI_PATH"] = os.pathsep.join(str(d) for d in dirs)
    env["NETCONFPATH"] = str(netconfpath)
    for key, value in (("CNI_IFNAME", ifname), ("CNI_ARGS", cni_args)):
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    if cap_args is None:
        env.pop("CAP_ARGS", None)
    else:
        env["CAP_ARGS"] = json.dumps(cap_args)
    return env


def cnitool_command(
    verb: str,
    network: str,
    netns: os.PathLike[str] | str,
    *,
    cache_dir: os.PathLike[str] | str | None = None,
) -> list[str]:
    """argv for ``cnitool VERB NETWORK NETNS`` (verb: add, check, del, gc, status).

    cnitool has no option or variable for libcni's cache dir: results always go to
    ``/var/lib/cni/results/<network>-<containerID>-<ifname>`` (containerID is
    ``cnitool-`` + hex of the first 10 bytes of sha512(abs netns path)).  With
    ``cache_dir`` the command runs in a private mount namespace (``unshare -m``, needs
    root) with ``cache_dir`` bind-mounted on ``/var/lib/cni``, so tests do not share the
    host's cache; use the same ``cache_dir`` for every verb of one attachment.
    """
    argv = [str(cnitool_path()), verb, network, str(netns)]
    if cache_dir is None:
        return argv
    script = 'mkdir -p /var/lib/cni && mount --bind "$0" /var/lib/cni && exec "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(cache_dir),
        *argv,
    ]


def build_plugins() -> dict[str, str]:
    """Ensure the reference plugins are built (all a CNI bin dir needs); return their paths."""
    return {
        "cache": str(cache_root()),
        "plugins_dir": str(reference_plugins_dir()),
        "plugins_version": f"{PLUGINS_MODULE}@{PLUGINS_VERSION}",
    }


def build_all() -> dict[str, str]:
    """Ensure everything is built; return the paths (for the CLI / fixtures)."""
    return {
        **build_plugins(),
        "cnitool": str(cnitool_path()),
        "cnitool_version": f"{CNI_MODULE}@{CNI_VERSION}",
    }
