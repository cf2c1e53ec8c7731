#!/usr/bin/env bash
# Build the one-node cluster's components (devenv/kube: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl and etcd in one multi-call binary) from pinned Go modules.
#
#   bash scripts/build-kube.sh        (prints the binary's path on stdout; logs on stderr)
#
# The binary goes to $RHP_KUBE_PREFIX/<key>/kube (default prefix /opt/runtime-hook-proxy/kube),
# where <key> hashes devenv/kube's go.mod, go.sum and main.go, this script's build flags and the
# Go version: a second run with nothing changed builds nothing. $RHP_KUBE_PREFIX/current is a
# symlink to the last binary built or found. Go's module and build caches stay at their defaults
# (under the home directory, outside the clone). Called by scripts/install-deps.sh; several
# callers at once on one machine are serialized by a lock.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
SRC=devenv/kube
PREFIX=${RHP_KUBE_PREFIX:-/opt/runtime-hook-proxy/kube}
K8S_VERSION=v1.34.4 # the k8s.io/kubernetes version that devenv/kube/go.mod requires

RHP_PROGRESS_NAME=build-kube
# shellcheck source=packaging/lib/progress.sh
source packaging/lib/progress.sh  # a line per step with the elapsed time, on stderr
log() { rhp_step "$*"; }

if ! command -v go >/dev/null 2>&1; then
  [[ -x /usr/local/go/bin/go ]] && PATH=$PATH:/usr/local/go/bin
fi
if ! command -v go >/dev/null 2>&1; then
  log "no Go toolchain on PATH (nor /usr/local/go/bin/go): cannot build $SRC"
  exit 1
fi
if ! grep -q "k8s.io/kubernetes $K8S_VERSION\$" "$SRC/go.mod"; then
  log "$SRC/go.mod does not require k8s.io/kubernetes $K8S_VERSION: update K8S_VERSION here"
  exit 1
fi

major_minor=${K8S_VERSION#v}
major=${major_minor%%.*}
minor=${major_minor#*.}
minor=${minor%%.*}
pkg=k8s.io/component-base/version
LDFLAGS="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
LDFLAGS+=" -X $pkg.gitTreeState=clean"

key=$({
  cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go"
  printf '%s\n' "$LDFLAGS" "$(go version)"
} | sha256sum | cut -c1-16)
dest=$PREFIX/$key
mkdir -p "$PREFIX"
exec 8>"$PREFIX/.build.lock"
flock 8

if [[ -x $dest/kube ]]; then
  log "up to date: $dest/kube"
else
  log "building $SRC (k8s.io/kubernetes $K8S_VERSION) into $dest"
  rm -rf "$PREFIX"/*.tmp # builds that failed or were killed (we hold the lock)
  mkdir -p "$dest.tmp"
  compile() (cd "$SRC" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$LDFLAGS" -o "$dest.tmp/kube" .)
  rhp_run "go build: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl and etcd (about 5 minutes on 2 cores when Go's caches are cold)" compile
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
  log "built $dest/kube"
fi
ln -sfn "$key" "$PREFIX/current.tmp"
mv -T "$PREFIX/current.tmp" "$PREFIX/current"
printf '%s\n' "$dest/kube"
