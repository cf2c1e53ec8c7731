#!/usr/bin/env bash
# Build the one-node cluster's components (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl and etcd in one multi-call binary) from pinned Go modules, for
# each Kubernetes release the harness runs:
#   v1.37.2  devenv/kube/v1.37/  the newest release the Go module proxy serves; tests/e2e runs on it
#   v1.34.4  devenv/kube/        the oldest supported; tests/e2e/test_e2e_oldest.py runs on it
# Both modules build devenv/kube/main.go (devenv/kube/v1.37/main.go is a symlink to it).
#
#   bash scripts/build-kube.sh [VERSION...]   (default: every version above, the newest first;
#                                              prints each binary's path on stdout, a line each,
#                                              in the order asked; logs on stderr)
#
# A binary goes to $RHP_KUBE_PREFIX/<key>/kube (default prefix /opt/runtime-hook-proxy/kube),
# where <key> hashes its module's go.mod, go.sum and main.go, this script's build flags and the Go
# version (the newest Go on PATH or at /usr/local/go/bin/go, or $GO: packaging/lib/go.sh): a
# second run with nothing changed builds nothing. $RHP_KUBE_PREFIX/<version> is a
# symlink to that version's <key> (rhp_devenv.kube finds the binaries there). Go's module and build caches stay at their
# defaults (under the home directory, outside the clone). Called by scripts/install-deps.sh;
# several callers at once on one machine are serialized by a lock while one builds (finding a
# binary built takes none).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PREFIX=${RHP_KUBE_PREFIX:-/opt/runtime-hook-proxy/kube}
NEWEST=v1.37.2
OLDEST=v1.34.4
src_of() {  # the module that pins a version (its go.mod requires k8s.io/kubernetes VERSION)
  case $1 in
    "$NEWEST") echo devenv/kube/v1.37 ;;
    "$OLDEST") echo devenv/kube ;;
    *) return 1 ;;
  esac
}

RHP_PROGRESS_NAME=build-kube
# shellcheck source=packaging/lib/progress.sh
source packaging/lib/progress.sh  # a line per step with the elapsed time, on stderr
# shellcheck source=packaging/lib/go.sh
source packaging/lib/go.sh  # rhp_go: the one Go every caller picks
log() { rhp_step "$*"; }

if (($# == 0)); then
  set -- "$NEWEST" "$OLDEST"
fi
for version in "$@"; do
  if ! src_of "$version" >/dev/null; then
    log "unknown Kubernetes version $version (this script builds $NEWEST and $OLDEST)"
    exit 2
  fi
done

GO=$(rhp_go 1.24) || {
  log "cannot build the Kubernetes components without Go"
  exit 1
}
PATH=$(dirname "$GO"):$PATH  # every `go` below is that one
mkdir -p "$PREFIX"

build_one() {  # VERSION: builds (or finds) its binary, points <prefix>/VERSION at it, prints its path
  local version=$1 src major_minor major minor pkg ldflags key dest
  src=$(src_of "$version")
  if ! grep -q "k8s.io/kubernetes $version\$" "$src/go.mod"; then
    log "$src/go.mod does not require k8s.io/kubernetes $version: update src_of here"
    return 1
  fi
  major_minor=${version#v}
  major=${major_minor%%.*}
  minor=${major_minor#*.}
  minor=${minor%%.*}
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
  key=$({
    cat "$src/go.mod" "$src/go.sum" "$src/main.go"
    printf '%s\n' "$ldflags" "$(go version)"
  } | sha256sum | cut -c1-16)
  dest=$PREFIX/$key
  # A finished binary appears at once (mv), so finding one needs no lock; a build takes the lock,
  # so that one caller builds while the others wait, then find it built.
  [[ -x $dest/kube ]] || { exec 8>"$PREFIX/.build.lock" && flock 8; }
  if [[ -x $dest/kube ]]; then
    log "$version up to date: $dest/kube"
  else
    log "building $src (k8s.io/kubernetes $version) into $dest"
    rm -rf "$PREFIX"/*.tmp # builds that failed or were killed (we hold the lock)
    mkdir -p "$dest.tmp"
    compile() (cd "$src" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$dest.tmp/kube" .)
    rhp_run "go build $version: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl and etcd (about 5 minutes on 2 cores when Go's caches are cold)" compile
    rm -rf "$dest"
    mv "$dest.tmp" "$dest"
    log "built $version: $dest/kube"
  fi
  ln -sfn "$key" "$PREFIX/.$version.$$"
  mv -T "$PREFIX/.$version.$$" "$PREFIX/$version"
  printf '%s\n' "$dest/kube"
}

for version in "$@"; do
  build_one "$version"
done
rhp_done
