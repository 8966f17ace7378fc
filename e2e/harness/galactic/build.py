"""Build and cache galactic-router, galactic-cni, galactic's own CNI chain (galactic-veth,
galactic-bgp), our two programs on galactic's internal
packages (the slice verdict, the eBPF vrf_table sweep) and gobgpd/gobgp.

galactic comes from the unmodified source archives in ``../shared/peers/`` (``$VPC_ATTACH_PEERS``
overrides the directory), prepared as that directory's README says: the three archives unpacked
side by side, two ``replace`` lines appended to ``galactic/go.mod``, the eBPF objects generated
with clang-14. The prepared tree is cached as ``galactic-src-<commit>-<key>/`` (the extra CRDs
are read from it; ``<key>`` hashes the archives and this recipe) and the binaries as
``galactic-<commit>-<key>-<programs>/`` (``<programs>`` hashes our programs, copied into the
tree before each build: a changed one is rebuilt even where only the tree is cached).
gobgpd/gobgp come from the wrapper module ``gomod/gobgp`` into ``gobgp-<version>/``. Both go
through the control plane's cache helper (``e2e.harness.cluster.build.ensure_built``): built in
a staging directory, renamed into place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from cni_plugin.core.locks import acquire
from e2e.harness.cluster.build import BuildError, GoComponent, cache_root, ensure_built

__all__ = ["GOBGP", "BuildError", "GalacticBuild", "ensure_galactic_built", "peers_dir"]

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
# Our programs, copied into galactic's module (they import its internal/ packages):
# {package path inside the module: source file}.
OUR_PROGRAMS = {
    "cmd/vpc-attach-slice-verdict": HERE / "verdict" / "main.go",
    "cmd/vpc-attach-ebpf-sweep": HERE / "sweep" / "main.go",
}
# binary name -> package, built in the prepared tree (go build names a binary after its package).
GALACTIC_PACKAGES = {
    "galactic-router": "./cmd/galactic-router",
    "galactic-cni": "./cmd/galactic-cni",
    # galactic's CNI chain for a Pod (galactic-veth, then galactic-bgp): what vpc-attach's
    # registration is compared with, row by row (SPEC §15).
    "galactic-veth": "./cmd/galactic-veth",
    "galactic-bgp": "./cmd/galactic-bgp",
    **{Path(package).name: f"./{package}" for package in OUR_PROGRAMS},
}
# Archive name prefix -> the directory it unpacks to (galactic's replace lines point there).
ARCHIVES = {"galactic-": "galactic", "datum-network-": "network", "vishvananda-netlink-": "netlink"}
REPLACES = (
    "replace go.datum.net/network => ../network",
    "replace github.com/vishvananda/netlink => ../netlink",
)
EBPF_PACKAGES = ("prog", "edgeprog", "nat66prog")  # under internal/plumbing/ebpf/
EBPF_ENV = {"BPF2GO_CC": "clang-14", "BPF2GO_STRIP": "llvm-strip-14"}
# Part of the cache key: change it when the preparation above changes.
RECIPE = "\n".join((*REPLACES, *EBPF_PACKAGES, *EBPF_ENV.values(), "go generate -mod=mod"))
GENERATE_TIMEOUT_S = 900.0
LOCK_TIMEOUT_S = 3 * GENERATE_TIMEOUT_S

GOBGP = GoComponent(
    name="gobgp",
    module_dir=HERE / "gomod" / "gobgp",
    upstream_module="github.com/osrg/gobgp/v4",
    packages={
        "gobgpd": "github.com/osrg/gobgp/v4/cmd/gobgpd",
        "gobgp": "github.com/osrg/gobgp/v4/cmd/gobgp",
    },
)


@dataclasses.dataclass(frozen=True)
class SourceComponent(GoComponent):
    """A component built inside an unpacked source tree, keyed by a version we compute."""

    pinned_version: str = ""

    @property
    def version(self) -> str:
        """``<commit>-<key>``: the archive's commit and the hash of what was built."""
        return self.pinned_version


@dataclasses.dataclass(frozen=True)
class GalacticBuild:
    """Where the built binaries and galactic's CRDs are."""

    router: Path
    cni: Path  # galactic-cni (its ``run`` loads and pins the eBPF uSID datapath)
    veth: Path  # galactic-veth: creates a Pod's veth (with the reference host-device plugin)
    bgp: Path  # galactic-bgp: publishes it and registers it in the eBPF datapath
    verdict: Path
    sweep: Path  # runs gc.SweepEBPFVRFTable once (sweep/main.go)
    gobgpd: Path
    gobgp: Path
    crd_dir: Path  # the network archive's config/crd/


def peers_dir() -> Path:
    """``$VPC_ATTACH_PEERS``, else ``shared/peers`` next to the repository or next to one of
    its parent directories (a clone made elsewhere, e.g. CI's, still finds the workplace's)."""
    configured = os.environ.get("VPC_ATTACH_PEERS")
    if configured:
        return Path(configured)
    for parent in REPO_ROOT.resolve().parents:
        if any((parent / "shared" / "peers").glob("galactic-*.tar.gz")):
            return parent / "shared" / "peers"
    return REPO_ROOT.parent / "shared" / "peers"


def cached_source_key() -> str | None:
    """The key of the newest prepared source tree in the cache, for a machine that prepared
    one before but has not the archives at hand now (a clone made away from the workplace)."""
    trees = [d for d in cache_root().glob("galactic-src-*") if (d / ".prepared").exists()]
    newest = max(trees, key=lambda d: d.stat().st_mtime, default=None)
    return newest.name.removeprefix("galactic-src-") if newest else None


def archives(directory: Path) -> dict[str, Path]:
    """``{unpacked directory name: archive}`` for the three archives galactic needs."""
    found: dict[str, Path] = {}
    for prefix, unpacked in ARCHIVES.items():
        matches = sorted(directory.glob(f"{prefix}*.tar.gz"))
        # "galactic-" must not pick another archive whose name only starts the same way.
        matches = [m for m in matches if m.name[len(prefix):-len(".tar.gz")].isalnum()]
        if len(matches) != 1:
            raise BuildError(f"{directory}: expected one {prefix}<commit>.tar.gz, found "
                             f"{[m.name for m in matches]}")
        found[unpacked] = matches[0]
    return found


def source_key(found: dict[str, Path]) -> str:
    """``<galactic commit>-<8 hex of the archives and the recipe>``: the prepared tree's key."""
    digest = hashlib.sha256()
    for unpacked in sorted(found):
        digest.update(hashlib.sha256(found[unpacked].read_bytes()).digest())
    digest.update(RECIPE.encode())
    commit = found["galactic"].name.removeprefix("galactic-").removesuffix(".tar.gz")
    return f"{commit}-{digest.hexdigest()[:8]}"


def build_version(key: str) -> str:
    """``<source key>-<8 hex of our programs and the package list>``: the binaries' key, so
    a changed program of ours is rebuilt even where only a prepared tree is cached."""
    digest = hashlib.sha256()
    for package, source in sorted(OUR_PROGRAMS.items()):
        digest.update(package.encode())
        digest.update(source.read_bytes())
    digest.update(" ".join(sorted(GALACTIC_PACKAGES.values())).encode())
    return f"{key}-{digest.hexdigest()[:8]}"


def place_programs(tree: Path) -> None:
    """Our programs into galactic's module, as this checkout has them."""
    for package, source in OUR_PROGRAMS.items():
        (tree / "galactic" / package).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, tree / "galactic" / package / "main.go")


def ensure_source(found: dict[str, Path], version: str) -> Path:
    """The prepared source tree (``galactic/``, ``network/``, ``netlink/``), made if missing."""
    root = cache_root()
    target = root / f"galactic-src-{version}"
    stamp = target / ".prepared"
    if stamp.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".galactic-src-{version}.lock"):
        if stamp.exists():
            return target
        for stale in root.glob(f".galactic-src-{version}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".galactic-src-{version}.build-", dir=root))
        try:
            _prepare(found, staging)
            (staging / ".prepared").write_text(version + "\n")
            if target.exists():  # an incomplete tree from an interrupted older layout
                shutil.rmtree(target)
            os.rename(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # One preparation at a time per version; closing the file releases the flock.
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        if not acquire(fd, LOCK_TIMEOUT_S):
            raise BuildError(f"timed out waiting for build lock {path}")
        yield
    finally:
        os.close(fd)


def _prepare(found: dict[str, Path], tree: Path) -> None:
    started = time.monotonic()
    for unpacked, archive in found.items():
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        if not (tree / unpacked).is_dir():
            raise BuildError(f"{archive.name} did not unpack to {unpacked}/")
    galactic = tree / "galactic"
    with (galactic / "go.mod").open("a") as go_mod:
        go_mod.write("\n" + "\n\n".join(REPLACES) + "\n")
    place_programs(tree)
    for package in EBPF_PACKAGES:
        _run_go(["generate", "./..."], galactic / "internal" / "plumbing" / "ebpf" / package)
    # Settles go.sum for the commands, so the build itself runs with -mod=readonly.
    _run_go(["list", "-deps", *GALACTIC_PACKAGES.values()], galactic)
    log.info("prepared galactic's source in %.0f s", time.monotonic() - started)


def _run_go(args: list[str], cwd: Path) -> None:
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", **EBPF_ENV)
    try:
        result = subprocess.run(["go", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S,
                                check=False)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"go {' '.join(args)} in {cwd} timed out") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-40:])
        raise BuildError(f"go {' '.join(args)} in {cwd} failed:\n{tail}")


def galactic_component(source: Path, version: str) -> SourceComponent:
    """galactic's programs (GALACTIC_PACKAGES) and ours, built in the prepared tree."""
    return SourceComponent(
        name="galactic",
        module_dir=source / "galactic",
        upstream_module="go.datum.net/galactic",
        packages=dict(GALACTIC_PACKAGES),
        pinned_version=version,
    )


def ensure_galactic_built() -> GalacticBuild:
    """Build (if needed) galactic-router, galactic-cni, galactic-veth, galactic-bgp, our
    programs, gobgpd and gobgp."""
    try:
        found = archives(peers_dir())
    except BuildError as missing:
        key = cached_source_key()
        if key is None:
            raise BuildError(f"{missing}; set VPC_ATTACH_PEERS to the directory of galactic's "
                             "source archives") from None
        log.warning("%s: building in the cached source tree %s", missing, key)
        source = cache_root() / f"galactic-src-{key}"
    else:
        key = source_key(found)
        source = ensure_source(found, key)
    version = build_version(key)
    # One build at a time per tree: our programs are copied in, then built.
    with _locked(cache_root() / f".galactic-src-{key}.programs.lock"):
        place_programs(source)
        galactic = ensure_built(galactic_component(source, version))
    gobgp = ensure_built(GOBGP)
    return GalacticBuild(
        router=galactic / "galactic-router",
        cni=galactic / "galactic-cni",
        veth=galactic / "galactic-veth",
        bgp=galactic / "galactic-bgp",
        verdict=galactic / "vpc-attach-slice-verdict",
        sweep=galactic / "vpc-attach-ebpf-sweep",
        gobgpd=gobgp / "gobgpd",
        gobgp=gobgp / "gobgp",
        crd_dir=source / "network" / "config" / "crd",
    )
