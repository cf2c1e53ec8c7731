#!/usr/bin/env bash
# Build the Debian 12 node package: dist/runtime-hook-proxy_<version>_amd64.deb
#
#   bash packaging/deb/build.sh
#
# What it holds:
#   /opt/runtime-hook-proxy/venv/         a venv of Debian's /usr/bin/python3 (3.11) with our wheel
#                                         and packaging/deb/requirements.txt (pinned, hashed), no pip
#   /usr/bin/runtime-proxy                -> the venv's runtime-proxy
#   /lib/systemd/system/runtime-proxy.service     packaging/runtime-proxy.service
#   /usr/lib/tmpfiles.d/runtime-hook-proxy.conf   the listen directory at boot
#   /etc/runtime-hook-proxy/config.yaml   packaging/proxy-config.yaml   (conffiles: an upgrade keeps
#   /etc/runtime-hook-proxy/node.yaml     packaging/node.yaml            the admin's edits)
# and the maintainer scripts beside this file (postinst, prerm, postrm). The venv is made here, at
# its final path's interpreter (/usr/bin/python3, which the package depends on) and moved into the
# package tree; nothing is downloaded on the node. The venv holds the [cluster] extra (the
# kubernetes client, pinned in packaging/image/requirements-cluster.txt, the node image's too), so
# every documented node config works (fromCluster, report.enable, usageLoop.evictBy: api); it
# leaves out the [scheduler] extra: the extender runs in the cluster.
# It prints a line per step with the elapsed time on stderr (packaging/lib/progress.sh), and the
# package's path on stdout.
#
# Needs: Debian 12 amd64 with python3 (3.11), python3-venv, python3-pip and dpkg-deb. The wheels
# come from PyPI once and are kept in the cache directory (hashes checked on every use).
# Environment:
#   RHP_DEB_OUT             output directory (default: dist/ in this checkout)
#   RHP_DEB_VERSION_SUFFIX  appended to the project's version (pyproject.toml), e.g. +1 or ~rc1
#   RHP_DEB_WHEEL_CACHE     wheel cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/runtime-hook-proxy/deb-wheels)
#   RHP_DEB_COMPRESSION     dpkg-deb's -Z (default xz)
set -euo pipefail
exec </dev/null

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
PY=/usr/bin/python3
PKG=runtime-hook-proxy
VENV=/opt/runtime-hook-proxy/venv

die() { echo "build.sh: $*" >&2; exit 1; }

[[ -x $PY ]] || die "$PY is missing: apt-get install python3 python3-venv python3-pip"
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $pyver == 3.11 ]] || die "$PY is Python $pyver; the package is for Debian 12's Python 3.11"
"$PY" -c 'import ensurepip, venv' 2>/dev/null || die "python3-venv is missing: apt-get install python3-venv"
"$PY" -m pip --version >/dev/null 2>&1 || die "python3-pip is missing: apt-get install python3-pip"
arch=$(dpkg --print-architecture)
[[ $arch == amd64 ]] || die "the pinned wheels are for amd64, not $arch"

version=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$repo/pyproject.toml")
debver=$version${RHP_DEB_VERSION_SUFFIX:-}
[[ $debver =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || die "not a Debian version: $debver"
out=${RHP_DEB_OUT:-$repo/dist}
cache=${RHP_DEB_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runtime-hook-proxy/deb-wheels}
mkdir -p "$out" "$cache"

work=$(mktemp -d /tmp/rhp-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root

RHP_PROGRESS_NAME=packaging/deb/build.sh
# shellcheck source=packaging/lib/progress.sh
source "$repo/packaging/lib/progress.sh"
# shellcheck source=packaging/lib/venv.sh
RHP_PY=$PY
source "$repo/packaging/lib/venv.sh"
reqs=("$here/requirements.txt" "$repo/packaging/image/requirements-cluster.txt")
rhp_run "checking the pinned wheels in $cache (fetched from PyPI once)" \
  rhp_fetch_wheels "$cache" "$work" "${reqs[@]}" "$here/build-requirements.txt"
rhp_step "building the runtime-hook-proxy $version wheel"
wheel=$(rhp_build_wheel "$repo" "$work" "$cache" "$here/build-requirements.txt")
rhp_run "making the venv $VENV (the wheel with its [cluster] extra, byte code compiled)" \
  rhp_make_venv "$root" "$VENV" "$wheel" "$cache" "${reqs[@]}"
rhp_step "laying out the package tree"

install -D -m 0644 "$repo/packaging/runtime-proxy.service" "$root/lib/systemd/system/runtime-proxy.service"
install -D -m 0644 "$here/tmpfiles.conf" "$root/usr/lib/tmpfiles.d/runtime-hook-proxy.conf"
install -D -m 0644 "$repo/packaging/proxy-config.yaml" "$root/etc/runtime-hook-proxy/config.yaml"
install -D -m 0644 "$repo/packaging/node.yaml" "$root/etc/runtime-hook-proxy/node.yaml"
install -D -m 0644 "$here/copyright" "$root/usr/share/doc/$PKG/copyright"
mkdir -p "$root/usr/bin"
ln -s "$VENV/bin/runtime-proxy" "$root/usr/bin/runtime-proxy"

mkdir -p "$root/DEBIAN"
for script in postinst prerm postrm; do
  install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
printf '%s\n' /etc/runtime-hook-proxy/config.yaml /etc/runtime-hook-proxy/node.yaml >"$root/DEBIAN/conffiles"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
  >"$root/DEBIAN/md5sums"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: $PKG
Version: $debver
Architecture: amd64
Maintainer: runtime-hook-proxy developers <runtime-hook-proxy@localhost>
Installed-Size: $size
Depends: python3 (>= 3.11~), python3 (<< 3.12), curl
Section: admin
Priority: optional
Description: CRI hook proxy for Kubernetes nodes, compatible with Koordinator
 runtime-proxy sits between kubelet and containerd and runs QoS hooks (cpuset, CPU burst,
 group identity, suppress, RDT...) on pod and container lifecycle calls. This package holds
 the node part in a private venv under $VENV, the systemd unit runtime-proxy.service and
 its config in /etc/runtime-hook-proxy/, with the Kubernetes client for fromCluster and the
 node reports. The scheduler extender is not included.
EOF

deb=$out/${PKG}_${debver}_amd64.deb
rhp_run "compressing $(basename "$deb") (${RHP_DEB_COMPRESSION:-xz}, $size KiB unpacked)" \
  dpkg-deb --root-owner-group -Z"${RHP_DEB_COMPRESSION:-xz}" --build "$root" "$deb" >/dev/null
rhp_done
echo "$deb"
