#!/usr/bin/env bash
# Builds the DaemonSet's OCI image from the standalone build, with no Docker and no registry
# (README.md here says what is inside and why). From the repository root:
#
#   bash packaging/image/build.sh [--out FILE]  # default FILE: dist/image/vpc-attach-<version>.oci.tar
#   bash packaging/image/build.sh --cache-only  # no copy: the archive stays in the cache
#
# Prints one JSON line: "archive" (the file to import or push), "image" (the name containerd
# gives it: docker.io/library/vpc-attach:<version>), "tag", "manifest_digest", sizes. Then:
#   ctr -n k8s.io images import FILE
#   skopeo copy oci-archive:FILE docker://REGISTRY/vpc-attach:<version>
#
# <version> is pyproject.toml's. SOURCE_DATE_EPOCH sets every mtime and the created date
# (default 0); VPC_ATTACH_IMAGE_SOURCE the source label (default: the git remote "origin").
# Runs packaging/standalone/build.sh (cached), then assemble.py; the archive is cached in
# ${VPC_ATTACH_CACHE:-~/.cache/vpc-attach}/image, keyed by a hash of its inputs (the layer's
# bytes, the labels, assemble.py and oci.py): an unchanged tree only copies it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=""
copy=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --out=*) out=$(realpath -m "${1#--out=}"); shift ;;
    --cache-only) copy=0; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (usage: build.sh [--out FILE | --cache-only])" >&2; exit 2 ;;
  esac
done

python=${PYTHON:-python3}
version=$("$python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as handle:
    print(tomllib.load(handle)["project"]["version"])
PY
)
[ -n "$out" ] || out="$repo/dist/image/vpc-attach-$version.oci.tar"
cache="${VPC_ATTACH_CACHE:-$HOME/.cache/vpc-attach}/image"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 1800 9 || { echo "build.sh: another build holds $cache/.lock" >&2; exit 1; }
rm -rf "$cache"/.bundle-* "$cache"/.work-*  # left by a killed build (we hold the lock)
work=$(mktemp -d "$cache/.bundle-XXXXXX")
trap 'rm -rf "$work"' EXIT

# Its progress goes to stderr; not its last line (how to stage the copy that is removed here).
bash "$repo/packaging/standalone/build.sh" --out "$work/standalone" 2>&1 \
  | sed -u '/ to stage it$/d' >&2

# Labels: the commit, marked -dirty when what goes into the image differs from it.
revision=""
if commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null); then
  revision=$commit
  if [ -n "$(git -C "$repo" status --porcelain -- cni_plugin netconf packaging/standalone \
      packaging/image pyproject.toml)" ]; then
    revision="$commit-dirty"
  fi
fi
source_url=${VPC_ATTACH_IMAGE_SOURCE-$(git -C "$repo" remote get-url origin 2>/dev/null || true)}
source_url=$(printf '%s' "$source_url" | sed -E 's#^([a-z+]+://)[^/@]*@#\1#')  # no user:token@

args=(--bundle "$work/standalone" --version "$version" --revision "$revision"
      --source-url "$source_url" --epoch "${SOURCE_DATE_EPOCH:-0}" --cache "$cache")
[ "$copy" = 0 ] || args+=(--out "$out")
result=$("$python" "$here/assemble.py" "${args[@]}")
echo "$result"
"$python" - "$result" >&2 <<'PY'
import json, sys
image = json.loads(sys.argv[1])
print(f"build.sh: {image['archive']} ({image['layer_bytes'] / 2**20:.1f} MiB compressed, "
      f"{image['layer_uncompressed_bytes'] / 2**20:.1f} MiB unpacked, "
      f"{'cached' if image['cached'] else 'built'}): {image['image']}")
PY
