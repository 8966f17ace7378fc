"""Build and cache the control-plane and node binaries from Go modules.

Each wrapper module under ``gomod/`` pins one upstream version; its binaries are cached in
``${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}/<name>-<version>/``. A build writes into a
temporary sibling directory and renames it (or, when the cache directory already holds some of
the component's binaries, each binary) into place, so a binary is either in the cache complete
or not at all. Only the binaries asked for are built: the demo's control plane needs
kube-apiserver and kube-controller-manager, not the node's kubelet, kube-scheduler and kubectl,
which a later build adds beside them (its compiled packages come from Go's own build cache).
Independent components build at the same time (``BUILD_WORKERS``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from e2e.harness.wait import wait_until

log = logging.getLogger(__name__)

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"
BUILD_TIMEOUT_S = 3600.0  # a cold kube-apiserver build takes ~10-20 min on 2 cores
LOCK_TIMEOUT_S = BUILD_TIMEOUT_S + 60.0
# Components built at once: on 2 cores one go build leaves a core idle while it downloads
# modules or links a binary (single-threaded), and the next component fills it.
BUILD_WORKERS = 2
PR_SET_PDEATHSIG = 1


class BuildError(RuntimeError):
    """A Go build failed; the message carries the command's output tail."""


def no_version_ldflags(version: str) -> list[str]:
    """For components whose binaries report their version without help from the linker."""
    return []


@dataclasses.dataclass(frozen=True)
class GoComponent:
    """One wrapper module, the binaries built from it and how they are built."""

    name: str  # cache prefix: "k8s", "etcd", "containerd", "runc"
    module_dir: Path
    upstream_module: str  # the module whose version keys the cache
    packages: dict[str, str]  # binary name -> Go package path
    cgo: bool = False  # static binaries unless a package needs a C library
    tags: tuple[str, ...] = ()
    # Linker flags that stamp the pinned version, given that version (e.g. ``v1.37.2``).
    version_ldflags: Callable[[str], list[str]] = no_version_ldflags

    @property
    def version(self) -> str:
        """The upstream module version required by the wrapper's go.mod (e.g. ``v1.37.2``)."""
        return required_version(self.module_dir / "go.mod", self.upstream_module)

    def ldflags(self) -> str:
        """The ``-ldflags`` value: stripped binaries with the version stamped."""
        return " ".join(["-s", "-w", *self.version_ldflags(self.version)])


def kubernetes_version_ldflags(version: str) -> list[str]:
    """Stamp the version the way upstream's hack/lib/version.sh does, so /version is truthful."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return flags


def containerd_version_ldflags(version: str) -> list[str]:
    """Stamp the version as containerd's Makefile does (``git describe``, so with the ``v``)."""
    return [f"-X github.com/containerd/containerd/v2/version.Version={version}"]


def runc_version_ldflags(version: str) -> list[str]:
    """Stamp the version as runc's Makefile does (its VERSION file: no leading ``v``)."""
    return [f"-X main.version={version.removeprefix('v')}"]


KUBERNETES = GoComponent(
    name="k8s",
    module_dir=GOMOD_DIR / "kubernetes",
    upstream_module="k8s.io/kubernetes",
    # One go build for all five: they share most of their compiled packages.
    packages={
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        "kubelet": "k8s.io/kubernetes/cmd/kubelet",
        "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    },
    version_ldflags=kubernetes_version_ldflags,
)

ETCD = GoComponent(
    name="etcd",
    module_dir=GOMOD_DIR / "etcd",
    upstream_module="go.etcd.io/etcd/server/v3",
    packages={"etcd": "go.etcd.io/etcd/server/v3"},
)

CONTAINERD = GoComponent(
    name="containerd",
    module_dir=GOMOD_DIR / "containerd",
    upstream_module="github.com/containerd/containerd/v2",
    packages={
        "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
        "containerd-shim-runc-v2": (
            "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
        ),
        "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
    },
    tags=("no_btrfs",),  # the btrfs snapshotter needs cgo and the btrfs headers
    version_ldflags=containerd_version_ldflags,
)

RUNC = GoComponent(
    name="runc",
    module_dir=GOMOD_DIR / "runc",
    upstream_module="github.com/opencontainers/runc",
    packages={"runc": "github.com/opencontainers/runc"},
    # nsenter is C, and seccomp filters come from libseccomp (libseccomp-dev, pkg-config).
    cgo=True,
    tags=("seccomp", "urfave_cli_no_docs"),
    version_ldflags=runc_version_ldflags,
)

COMPONENTS = (ETCD, KUBERNETES, CONTAINERD, RUNC)
API_SERVER_BINARIES = ("etcd", "kube-apiserver")
CONTROL_PLANE_BINARIES = (*API_SERVER_BINARIES, "kube-controller-manager")
NODE_BINARIES = (
    "kubelet",
    "kube-scheduler",
    "kubectl",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
)


def cache_root() -> Path:
    """Where built binaries live: ``$VPC_ATTACH_CACHE`` or ``~/.cache/vpc-attach``."""
    configured = os.environ.get("VPC_ATTACH_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "vpc-attach"


def required_version(go_mod: Path, module: str) -> str:
    """Return the version of ``module`` required in ``go_mod``."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.M)
    if match is None:
        raise BuildError(f"{go_mod}: no requirement on {module}")
    return match.group(1)


def cached_dir(component: GoComponent) -> Path:
    """The cache directory of ``component`` at its pinned version (may not exist yet)."""
    return cache_root() / f"{component.name}-{component.version}"


def _selected(component: GoComponent, binaries: Collection[str] | None) -> tuple[str, ...]:
    """The binaries of ``component`` among ``binaries`` (all of them for None), in its order."""
    return tuple(name for name in component.packages if binaries is None or name in binaries)


def _missing(component: GoComponent, binaries: tuple[str, ...]) -> tuple[str, ...]:
    target = cached_dir(component)
    return tuple(name for name in binaries if not os.access(target / name, os.X_OK))


def is_cached(component: GoComponent, binaries: Collection[str] | None = None) -> bool:
    """Whether ``binaries`` of ``component`` (default: all of them) are already in the cache."""
    return not _missing(component, _selected(component, binaries))


def ensure_built(component: GoComponent, binaries: Collection[str] | None = None) -> Path:
    """Return the cache directory of ``component``, building first those of ``binaries``
    (default: all of the component's) that it does not hold yet."""
    wanted = _selected(component, binaries)
    if not _missing(component, wanted):
        return cached_dir(component)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f".{component.name}-{component.version}.lock"):
        missing = _missing(component, wanted)  # another process may have built some meanwhile
        if missing:
            _remove_stale_builds(root, component)
            _build_into_cache(component, missing)
    return cached_dir(component)


def ensure_all_built() -> dict[str, Path]:
    """Build (if needed) every component; return ``{binary name: path}``."""
    return _ensure_binaries(COMPONENTS, CONTROL_PLANE_BINARIES + NODE_BINARIES)


def ensure_control_plane_built(controller_manager: bool = True) -> dict[str, Path]:
    """Build (if needed) etcd, kube-apiserver and (unless told not to) kube-controller-manager;
    return their paths. Without it the build is the demo's: kube-controller-manager's own
    packages are a quarter of the CPU a cold build of the three takes."""
    wanted = CONTROL_PLANE_BINARIES if controller_manager else API_SERVER_BINARIES
    return _ensure_binaries((ETCD, KUBERNETES), wanted)


def ensure_node_built() -> dict[str, Path]:
    """Build (if needed) what a node runs; return ``{binary name: path}``.

    The binaries are NODE_BINARIES: kubelet, kube-scheduler, kubectl, containerd,
    containerd-shim-runc-v2, ctr and runc.
    """
    return _ensure_binaries((KUBERNETES, CONTAINERD, RUNC), NODE_BINARIES)


def _ensure_binaries(
    components: tuple[GoComponent, ...], wanted: tuple[str, ...]
) -> dict[str, Path]:
    with ThreadPoolExecutor(BUILD_WORKERS, thread_name_prefix="go-build") as pool:
        built = [
            (component, pool.submit(ensure_built, component, wanted)) for component in components
        ]
        binaries: dict[str, Path] = {}
        for component, directory in built:  # .result() raises the first BuildError
            binaries.update(
                {name: directory.result() / name for name in _selected(component, wanted)}
            )
    return binaries


def pin_kubernetes(version: str, module_dir: Path = KUBERNETES.module_dir) -> Path:
    """Rewrite the Kubernetes wrapper's go.mod for ``version`` (e.g. ``v1.36.3``), then tidy.

    Every ``k8s.io/*`` module that upstream replaces with ``./staging/...`` is replaced here
    with its published ``v0.MINOR.PATCH`` tag instead.
    """
    _major, minor, patch = version.lstrip("v").split(".")
    staging_version = f"v0.{minor}.{patch}"
    module_dir.mkdir(parents=True, exist_ok=True)
    upstream_go_mod = Path(
        _go_json(["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], module_dir)["GoMod"]
    )
    staging = re.findall(r"^\s*(k8s\.io/\S+)\s+=>\s+\./staging/", upstream_go_mod.read_text(), re.M)
    lines = [
        "// Wrapper module: the control-plane and node binaries of k8s.io/kubernetes",
        "// (e2e/harness/cluster/build.py: KUBERNETES.packages).",
        "// Staging modules are replaced by their published tags (v0.MINOR.PATCH); the upstream",
        "// go.mod replaces them with ./staging paths, which a dependent module cannot see.",
        "// Regenerate with: python -m e2e.harness.cluster pin-kubernetes VERSION",
        "module vpc-attach.local/e2e/kubernetes",
        "",
        "go 1.26.0",
        "",
        "tool (",
        *(f"\t{package}" for package in KUBERNETES.packages.values()),
        ")",
        "",
        f"require k8s.io/kubernetes {version}",
        "",
        "replace (",
        *(f"\t{module} => {module} {staging_version}" for module in staging),
        ")",
        "",
    ]
    (module_dir / "go.mod").write_text("\n".join(lines))
    (module_dir / "go.sum").unlink(missing_ok=True)
    _go(["mod", "tidy"], module_dir)
    log.info("pinned %s to k8s.io/kubernetes %s (staging %s)", module_dir, version, staging_version)
    return module_dir / "go.mod"


def _go(args: list[str], cwd: Path) -> str:
    env = dict(os.environ, GOTOOLCHAIN="local")
    try:
        result = subprocess.run(
            ["go", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"go {' '.join(args)} timed out") from exc
    if result.returncode != 0:
        raise BuildError(f"go {' '.join(args)} failed:\n{result.stderr.strip()[-4000:]}")
    return result.stdout


def _go_json(args: list[str], cwd: Path) -> dict[str, str]:
    decoded: dict[str, str] = json.loads(_go(args, cwd))
    return decoded


def _build_into_cache(component: GoComponent, binaries: tuple[str, ...]) -> None:
    target = cached_dir(component)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    started = time.monotonic()
    try:
        log.info(
            "building %s of %s %s into %s (slow the first time)",
            ", ".join(binaries),
            component.name,
            component.version,
            target,
        )
        _go_build(component, binaries, staging)
        elapsed = time.monotonic() - started
        build = {
            "binaries": list(binaries),
            "go": _go_version(),
            "build_seconds": round(elapsed, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        info_file = target / "BUILD-INFO.json"
        if target.is_dir():  # holds other binaries of this version: add ours beside them
            info = json.loads(info_file.read_text()) if info_file.exists() else {}
            info.setdefault("builds", []).append(build)
            for name in binaries:
                os.replace(staging / name, target / name)  # each appears complete or not at all
            (staging / "BUILD-INFO.json").write_text(json.dumps(info, indent=2) + "\n")
            os.replace(staging / "BUILD-INFO.json", info_file)
        else:
            info = {
                "module": component.upstream_module,
                "version": component.version,
                "builds": [build],
            }
            (staging / "BUILD-INFO.json").write_text(json.dumps(info, indent=2) + "\n")
            staging.chmod(0o755)
            os.rename(staging, target)
        log.info(
            "built %s of %s %s in %.0f s",
            ", ".join(binaries),
            component.name,
            component.version,
            elapsed,
        )
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _go_build(component: GoComponent, binaries: tuple[str, ...], out_dir: Path) -> None:
    env = dict(os.environ)
    # Static binaries unless a C library is needed; never try to download a toolchain (only
    # module proxies are reachable).
    env.update({"CGO_ENABLED": "1" if component.cgo else "0", "GOTOOLCHAIN": "local"})
    # With one package, -o names the file; with several, a trailing slash names the directory.
    output = str(out_dir / binaries[0]) if len(binaries) == 1 else f"{out_dir}/"
    command = [
        "go",
        "build",
        "-trimpath",
        f"-tags={','.join(component.tags)}",
        f"-ldflags={component.ldflags()}",
        # The linker strips DWARF (-w): the compiler need not write it for any package (etcd
        # cold: 11 % less CPU, the same binary but for its build ID).
        "-gcflags=all=-dwarf=false",
        "-o",
        output,
        # One go build for several binaries: they share most of their compiled packages.
        *(component.packages[name] for name in binaries),
    ]
    try:
        result = subprocess.run(
            command,
            cwd=component.module_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
            preexec_fn=_die_with_parent,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(
            f"go build of {component.name} timed out after {BUILD_TIMEOUT_S:.0f} s"
        ) from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-40:])
        raise BuildError(f"go build of {component.name} {component.version} failed:\n{tail}")


# Loaded in the parent: the child of a fork taken while another build thread runs only calls it.
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # If we are killed mid-build, go must not keep writing into the staging dir.
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _go_version() -> str:
    result = subprocess.run(
        ["go", "env", "GOVERSION"], capture_output=True, text=True, timeout=30, check=False
    )
    return result.stdout.strip()


def _remove_stale_builds(root: Path, component: GoComponent) -> None:
    # Called under the per-version lock: any staging directory left for this version is from
    # an interrupted build of ours.
    for stale in root.glob(f".{component.name}-{component.version}.build-*"):
        log.info("removing interrupted build %s", stale)
        shutil.rmtree(stale, ignore_errors=True)


class _exclusive_lock:
    """``flock`` on a file, polled so that waiting is bounded by LOCK_TIMEOUT_S."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o644)

        def locked() -> bool:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: not yet
            return True

        try:
            wait_until(f"build lock {self._path}", locked, LOCK_TIMEOUT_S, interval=1.0)
        except TimeoutError as exc:
            os.close(self._fd)
            raise BuildError(str(exc)) from None

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
