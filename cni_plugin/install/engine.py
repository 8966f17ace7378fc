"""Put targets on the host under the manifest's rules, and take back only what it owns.

install: plan every target first (create / update / unchanged, or a refusal when something in
the way is not ours); with any refusal and no --force nothing is written. Then record the
intent in the manifest, write each target atomically, and settle the manifest.
uninstall: remove recorded files that still have their recorded content, then the directories
the installer created, if empty.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cni_plugin.core.locks import acquire
from cni_plugin.install.errors import InstallError, Refused
from cni_plugin.install.files import (
    LINK_PREFIX,
    copy_into,
    ensure_dir,
    fingerprint,
    fsync_dir,
    remove,
    symlink_atomic,
    write_atomic,
)
from cni_plugin.install.manifest import Manifest
from cni_plugin.install.targets import BundleTarget, FileTarget, LinkTarget, Root, Target

# The installed bundle and the one before it: calls started just before an upgrade may still
# be loading modules from the previous one.
KEEP_BUNDLES = 2
STAGING_PREFIX = ".staging-"
LOCK_TIMEOUT_SECONDS = 60.0


@dataclass
class Report:
    """What a run did, by host path."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "path: reason", left in place

    @property
    def changed(self) -> bool:
        """Whether anything on disk changed."""
        return bool(self.created or self.updated or self.removed)


@dataclass
class _Step:
    target: Target
    action: str  # create | update | unchanged
    current: str | None = None


class Installer:
    """Writes and removes the installer's files below a root, keeping the manifest."""

    def __init__(self, root: Root, manifest_path: str, force: bool = False) -> None:
        self.root = root
        self.manifest_path = root.local(manifest_path)
        self.force = force

    # install ------------------------------------------------------------------------------

    def install(self, targets: Sequence[Target]) -> Report:
        """Bring every target into place (all or nothing when something is in the way)."""
        report = Report()
        with self._locked(create=True) as created_dirs:
            manifest = Manifest.load(self.manifest_path)
            before = manifest.serialized()
            manifest.record_dirs([self.root.host(d) for d in created_dirs])
            steps, problems = self._plan(targets, manifest)
            if problems and not self.force:
                for directory in reversed(created_dirs):  # leave no trace of a refused run
                    with contextlib.suppress(OSError):
                        directory.rmdir()
                raise Refused(problems)
            writes = [step for step in steps if step.action != "unchanged"]
            for step in writes:
                self._record_intent(step, manifest)
            if writes:
                manifest.save(self.manifest_path)
            for step in steps:
                if step.action == "unchanged":
                    report.unchanged.append(step.target.path)
                    continue
                self._write(step, manifest)
                (report.created if step.action == "create" else report.updated).append(
                    step.target.path)
            installed = [t.path for t in targets if isinstance(t, BundleTarget)]
            if installed:
                self._retire_bundles(installed, manifest, report)
            manifest.settle()
            if manifest.serialized() != before:
                manifest.save(self.manifest_path)
        return report

    def _plan(self, targets: Sequence[Target],
              manifest: Manifest) -> tuple[list[_Step], list[str]]:
        steps: list[_Step] = []
        problems: list[str] = []
        for target in targets:
            if isinstance(target, BundleTarget):
                step, problem = self._plan_bundle(target, manifest)
            else:
                step, problem = self._plan_file(target, manifest)
            steps.append(step)
            if problem:
                problems.append(problem)
        return steps, problems

    def _plan_file(self, target: FileTarget | LinkTarget,
                   manifest: Manifest) -> tuple[_Step, str | None]:
        current = fingerprint(self.root.local(target.path))
        if current is None:
            return _Step(target, "create"), None
        problem = manifest.ownership_problem(target.path, current)
        if current == target.fingerprint and problem is None:
            return _Step(target, "unchanged", current), None
        return _Step(target, "update", current), f"{target.path} {problem}" if problem else None

    def _plan_bundle(self, bundle: BundleTarget,
                     manifest: Manifest) -> tuple[_Step, str | None]:
        local = self.root.local(bundle.path)
        if not os.path.lexists(local):
            return _Step(bundle, "create"), None
        wanted = {member.path: member for member in bundle.members}
        present = set(self._files_below(local)) if local.is_dir() else {bundle.path}
        differences = sorted(present - set(wanted))
        for path, member in wanted.items():
            current = fingerprint(self.root.local(path))
            if current != member.fingerprint or manifest.ownership_problem(path, current):
                differences.append(path)
        if not differences:
            return _Step(bundle, "unchanged"), None
        return _Step(bundle, "update"), (
            f"{bundle.path} (bundle) does not match what vpc-attach install staged there "
            f"({len(differences)} differing files, e.g. {differences[0]})")

    def _files_below(self, local_dir: Path) -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(local_dir):
            for name in filenames + [d for d in dirnames if os.path.islink(Path(dirpath, d))]:
                yield self.root.host(Path(dirpath, name))

    def _record_intent(self, step: _Step, manifest: Manifest) -> None:
        target = step.target
        if isinstance(target, BundleTarget):
            for member in target.members:
                manifest.record(member.path, member.fingerprint)
        else:
            manifest.record(target.path, target.fingerprint, step.current)

    def _write(self, step: _Step, manifest: Manifest) -> None:
        target = step.target
        local = self.root.local(target.path)
        created: list[Path] = []
        try:
            ensure_dir(local.parent, created)
            if isinstance(target, FileTarget):
                write_atomic(local, target.content, target.mode)
            elif isinstance(target, LinkTarget):
                symlink_atomic(local, target.target)
            else:
                created += self._stage_bundle(target, local)
        except OSError as exc:
            raise InstallError(f"cannot write {target.path}: {exc}") from None
        finally:
            manifest.record_dirs([self.root.host(d) for d in created])

    def _stage_bundle(self, bundle: BundleTarget, local: Path) -> list[Path]:
        """Copy the bundle into a staging dir beside it, then rename it into place."""
        parent = local.parent
        for stale in parent.glob(STAGING_PREFIX + "*"):  # left by a killed run
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))
        try:
            staging.chmod(0o755)
            dirs = [local]
            for member in bundle.members:
                relative = Path(member.path).relative_to(bundle.path)
                dest = staging / relative
                for directory in reversed(relative.parents[:-1]):
                    if not (staging / directory).is_dir():
                        (staging / directory).mkdir(mode=0o755)
                        dirs.append(local / directory)
                if isinstance(member, LinkTarget):
                    os.symlink(member.target, dest)
                    continue
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, member.mode)
                try:
                    copy_into(fd, member.content)
                    os.fchmod(fd, member.mode)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if os.path.lexists(local):  # only with --force: set aside what is in the way
                aside = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))
                os.rename(local, aside / "old")
            os.rename(staging, local)
            fsync_dir(parent)
        finally:
            for leftover in parent.glob(STAGING_PREFIX + "*"):
                shutil.rmtree(leftover, ignore_errors=True)
        return dirs

    def _retire_bundles(self, installed: list[str], manifest: Manifest,
                        report: Report) -> None:
        """Remove all but the newest KEEP_BUNDLES bundles this installer staged."""
        order = [b for b in manifest.bundles if b not in installed] + installed
        retired, manifest.bundles = order[:-KEEP_BUNDLES], order[-KEEP_BUNDLES:]
        removed = Report()
        for bundle in retired:
            inside = [p for p in manifest.files if p.startswith(bundle + "/")]
            self._remove_owned(inside, manifest, removed)
            self._remove_dirs([d for d in manifest.dirs
                               if d == bundle or d.startswith(bundle + "/")], manifest)
        report.removed += _collapse(removed.removed, retired)
        report.kept += removed.kept  # modified files left in a retired bundle: say so

    # uninstall ----------------------------------------------------------------------------

    def uninstall(self) -> Report:
        """Remove every recorded file whose content is still the recorded one."""
        report = Report()
        if not self.manifest_path.exists():
            return report
        with self._locked(create=False):
            manifest = Manifest.load(self.manifest_path)
            # Links first: the runtime stops finding the plugin before its bundle goes.
            paths = sorted(manifest.files,
                           key=lambda p: (not manifest.files[p].fingerprint.startswith(
                               LINK_PREFIX), p))
            self._remove_owned(paths, manifest, report)
            report.removed = _collapse(report.removed, manifest.bundles)
            try:
                remove(self.manifest_path)
            except OSError as exc:
                raise InstallError(f"cannot remove {self.manifest_path}: {exc}") from None
            self._remove_dirs(list(manifest.dirs), manifest)
        return report

    def _remove_owned(self, paths: list[str], manifest: Manifest, report: Report) -> Report:
        for path in paths:
            entry = manifest.files.pop(path)
            current = fingerprint(self.root.local(path))
            if current is None:
                continue
            if not entry.matches(current):
                report.kept.append(f"{path}: modified after vpc-attach install wrote it")
                continue
            try:
                remove(self.root.local(path))
            except OSError as exc:
                report.kept.append(f"{path}: cannot remove: {exc}")
                continue
            report.removed.append(path)
        return report

    def _remove_dirs(self, dirs: list[str], manifest: Manifest) -> None:
        """rmdir the given recorded directories, deepest first, when empty."""
        for directory in sorted(dirs, key=lambda d: d.count("/"), reverse=True):
            try:
                os.rmdir(self.root.local(directory))
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise InstallError(f"cannot remove directory {directory}: {exc}") from None
                continue  # something else lives there now: keep it, and keep it recorded
            manifest.dirs.remove(directory)

    # locking ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, create: bool) -> Iterator[list[Path]]:
        """One installer at a time per host: an exclusive lock on the manifest's directory."""
        directory = self.manifest_path.parent
        created: list[Path] = []
        try:
            if create:
                ensure_dir(directory, created)
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise InstallError(f"cannot open manifest directory {directory}: {exc}") from None
        try:
            if not acquire(fd, LOCK_TIMEOUT_SECONDS):
                raise InstallError(f"another vpc-attach install holds the lock on {directory}",
                                   f"waited {LOCK_TIMEOUT_SECONDS:.0f} s")
            yield created
        finally:
            os.close(fd)


def _collapse(paths: list[str], bundles: list[str]) -> list[str]:
    """Name a bundle once ("DIR (N files)") instead of listing each of its files."""
    counts: dict[str, int] = {}
    listed: list[str] = []
    for path in paths:
        bundle = next((b for b in bundles if path.startswith(b + "/")), None)
        key = bundle or path
        if key not in counts:
            listed.append(key)
            counts[key] = 0
        counts[key] += 1
    return [f"{p} ({counts[p]} files)" if p in bundles else p for p in listed]
