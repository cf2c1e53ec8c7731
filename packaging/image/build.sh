#!/usr/bin/env bash
# Build the runtime-hook-proxy OCI images offline from Debian's packages and pinned wheels:
#
#   bash packaging/image/build.sh [node|cluster]...     (as root; default: both)
#
# Prints one line per image: FLAVOUR ARCHIVE REFERENCE (stdout), and a line per step with the
# elapsed time on stderr (packaging/lib/progress.sh). Each ARCHIVE is an OCI image layout in a
# tar (`ctr -n k8s.io images import ARCHIVE`, `skopeo copy oci-archive:ARCHIVE docker://...`).
#
#   node     localhost/runtime-hook-proxy-node:0.1.0        runtime-proxy (serve, nri, hook-server,
#            doctor, kubelet-switch) with the [cluster] extra (the kubernetes client for fromCluster
#            and the node reports); none of the extender's web stack.
#   cluster  localhost/runtime-hook-proxy-cluster:0.1.0     the node image's venv plus the
#            [scheduler] extra: scheduler-ext (the extender, the manager).
#
# How: mmdebstrap (Debian 12) makes a minbase bookworm root holding Debian's python3 and
# ca-certificates from the machine's Debian mirror (bookworm, bookworm-updates, bookworm-security),
# with documentation, man pages and locales left out; the venv (packaging/lib/venv.sh: our wheel
# and the hashed pins of packaging/deb/requirements.txt and packaging/image/requirements-*.txt, no
# pip) is copied in at /opt/runtime-hook-proxy/venv; apt and pip are removed from the final tree
# (dpkg's database stays, for image scanners). umoci (Debian 12) puts that one tar in an OCI layout, with user 65532 (rhp) and
# no entry point but a --help command. SOURCE_DATE_EPOCH (default: the last commit's time, or
# 0) fixes every timestamp, so the same inputs give the same layer and config digests.
#
# The references come from one place, the image block of the chart's values
# (packaging/helm/runtime-hook-proxy/values.yaml: registry, node/cluster repository and tag), with
# RHP_IMAGE_VALUES's on top: give it the values file you install the chart with, and the images
# are named as the chart will run them (packaging/image/refs.py).
#
# Environment:
#   RHP_IMAGE_VALUES  a values file of yours whose image block overrides the chart's (registry, tags)
#   RHP_IMAGE_OUT     output directory (default: dist/ in this checkout)
#   RHP_DEBIAN_URI    Debian mirror (default: the machine's, else http://deb.debian.org/debian)
#   RHP_DEB_WHEEL_CACHE  wheel cache shared with packaging/deb/build.sh
#   RHP_IMAGE_DEB_CACHE  Debian packages kept between builds (default /var/cache/runtime-hook-proxy/image-debs)
set -euo pipefail
exec </dev/null

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
FINAL=/opt/runtime-hook-proxy/venv
UID_RHP=65532

die() { echo "packaging/image/build.sh: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (mmdebstrap's root mode keeps file owners as they are)"
for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install mmdebstrap umoci"
done
flavours=("$@")
((${#flavours[@]})) || flavours=(node cluster)
for f in "${flavours[@]}"; do
  [[ $f == node || $f == cluster ]] || die "unknown image '$f' (node or cluster)"
done

if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
  SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

mirror=${RHP_DEBIAN_URI:-}
if [[ -z $mirror ]]; then
  mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' \
    /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
security=${mirror%/debian}/debian-security
security=${security%/}

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$repo/pyproject.toml")
out=${RHP_IMAGE_OUT:-$repo/dist}
cache=${RHP_DEB_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runtime-hook-proxy/deb-wheels}
debcache=${RHP_IMAGE_DEB_CACHE:-/var/cache/runtime-hook-proxy/image-debs}
mkdir -p "$out" "$cache" "$debcache"

work=$(mktemp -d /tmp/rhp-image.XXXXXX)
trap '[[ -n ${RHP_IMAGE_KEEP_WORK:-} ]] || rm -rf "$work"' EXIT

RHP_PROGRESS_NAME=packaging/image/build.sh
# shellcheck source=packaging/lib/progress.sh
source "$repo/packaging/lib/progress.sh"
# shellcheck source=packaging/lib/venv.sh
source "$repo/packaging/lib/venv.sh"
node_reqs=("$repo/packaging/deb/requirements.txt" "$here/requirements-cluster.txt")
cluster_reqs=("${node_reqs[@]}" "$here/requirements-scheduler.txt")
rhp_run "checking the pinned wheels in $cache (fetched from PyPI once)" \
  rhp_fetch_wheels "$cache" "$work" "${cluster_reqs[@]}" "$repo/packaging/deb/build-requirements.txt"
rhp_step "building the runtime-hook-proxy $version wheel"
wheel=$(rhp_build_wheel "$repo" "$work" "$cache" "$repo/packaging/deb/build-requirements.txt")

layer_tar() {
  # layer_tar DIR TAR: DIR's tree as a deterministic layer (sorted, owners numeric, times fixed).
  find "$1" -newermt "@$SOURCE_DATE_EPOCH" -print0 | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"
  tar --sort=name --numeric-owner --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --xattrs --xattrs-include='security.capability' -C "$1" -cf "$2" .
}

# Layer 1, shared by both images: Debian's minbase with python3 and ca-certificates. The .debs are
# kept in $debcache between builds (mmdebstrap's documented cache hooks), so a rebuild downloads
# only what changed on the mirror.
rootfs=$work/rootfs
rhp_run "mmdebstrap: Debian 12 minbase with python3 and ca-certificates from $mirror (.debs cached in $debcache)" \
  mmdebstrap --quiet --mode=root --variant=minbase --include=python3,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --skip=download/empty --skip=essential/unlink \
  --setup-hook="mkdir -p '$debcache' \"\$1\"/var/cache/apt/archives/" \
  --setup-hook="sync-in '$debcache' /var/cache/apt/archives/" \
  --customize-hook="sync-out /var/cache/apt/archives '$debcache'" \
  --customize-hook="echo 'rhp:x:$UID_RHP:$UID_RHP:runtime-hook-proxy:/nonexistent:/usr/sbin/nologin' >>\"\$1/etc/passwd\"" \
  --customize-hook="echo 'rhp:x:$UID_RHP:' >>\"\$1/etc/group\"" \
  bookworm "$rootfs" \
  "deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security bookworm-security main"
# No package manager in the final tree (dpkg's database stays, for image scanners): nothing to
# fetch code with at run time.
rm -rf "$rootfs"/usr/bin/apt* "$rootfs"/usr/lib/apt "$rootfs"/etc/apt "$rootfs"/var/lib/apt \
  "$rootfs"/var/cache/apt "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/cache/ldconfig/aux-cache \
  "$rootfs"/usr/lib/python3/dist-packages/pip
find "$rootfs"/var/log -type f -delete
rhp_run "layer 1: the Debian base" layer_tar "$rootfs" "$work/base.tar"

# Layer 2 (both images): the node venv. Layer 3 (cluster image only): what the [scheduler] extra
# adds to that venv, as a second venv built the same way and compared file by file.
rhp_run "layer 2: the node venv (the wheel with its [cluster] extra)" \
  rhp_make_venv "$work/node" "$FINAL" "$wheel" "$cache" "${node_reqs[@]}"
# The references, from the chart's values (and RHP_IMAGE_VALUES), read with the venv's PyYAML.
declare -A ref_of=()
refs_said=$("$work/node$FINAL/bin/python3" -B -s "$here/refs.py" ${RHP_IMAGE_VALUES:+"$RHP_IMAGE_VALUES"}) ||
  die "cannot name the images from the chart's values${RHP_IMAGE_VALUES:+ and $RHP_IMAGE_VALUES}"
while read -r flavour ref; do
  ref_of[$flavour]=$ref
done <<<"$refs_said"
rhp_step "the images: ${ref_of[node]} and ${ref_of[cluster]}"
layer_tar "$work/node" "$work/node.tar"
if [[ " ${flavours[*]} " == *" cluster "* ]]; then
  rhp_run "layer 3: what the [scheduler] extra adds to the node venv" \
    rhp_make_venv "$work/cluster" "$FINAL" "$wheel" "$cache" "${cluster_reqs[@]}"
  python3 "$here/difflayer.py" "$work/node" "$work/cluster" "$SOURCE_DATE_EPOCH" "$work/scheduler.tar"
fi

build_one() {
  local flavour=$1 layers
  local layout=$work/$flavour-oci ref=${ref_of[$flavour]}
  if [[ $flavour == node ]]; then layers=(base node); else layers=(base node scheduler); fi
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  for l in "${layers[@]}"; do
    umoci raw add-layer --image "$layout:$version" --history.created "$created" \
      --history.created_by "packaging/image/build.sh: $l" "$work/$l.tar"
  done
  umoci config --image "$layout:$version" --created "$created" --history.created "$created" \
    --author runtime-hook-proxy --os linux --architecture amd64 \
    --config.user "$UID_RHP:$UID_RHP" --config.workingdir / \
    --config.env "PATH=$FINAL/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.cmd "$([[ $flavour == node ]] && echo runtime-proxy || echo scheduler-ext)" --config.cmd --help \
    --config.label "org.opencontainers.image.title=runtime-hook-proxy-$flavour" \
    --config.label "org.opencontainers.image.version=$version" \
    --manifest.annotation "io.containerd.image.name=$ref"
  umoci gc --layout "$layout"
  # containerd's importer names the image from this annotation on the index entry.
  python3 - "$layout/index.json" "$ref" <<'PY'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
with open(path) as f:
    index = json.load(f)
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = ref
with open(path, "w") as f:
    json.dump(index, f, separators=(",", ":"), sort_keys=True)
PY
  local archive=$out/runtime-hook-proxy-$flavour-$version.oci.tar
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    -C "$layout" -cf "$archive.tmp" .
  mv "$archive.tmp" "$archive"
  echo "$flavour $archive $ref"
}

for f in "${flavours[@]}"; do
  rhp_run "the $f image: OCI layout and archive (umoci)" build_one "$f"
done
rhp_done
