#!/usr/bin/env bash
# Build helm (for the chart in packaging/helm/: `helm lint`, `helm template` in tests/test_helm.py
# and install/upgrade/uninstall in tests/e2e/test_e2e_helm.py) from its Go module.
#
#   bash scripts/build-helm.sh               build if needed; print the binary's path on stdout
#   bash scripts/build-helm.sh --print-path  print where the binary is (or would be); no build
#
# `go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION` (about 1.5 minutes on 2 cores with cold Go
# caches). Nothing is written into the clone: the sources go to Go's module cache and the binary
# to $RHP_HELM_PREFIX/<key>/helm (default prefix /opt/runtime-hook-proxy/helm), where <key> hashes
# the version and the Go version; a second run finds it and builds nothing. Progress goes to
# stderr. Called by scripts/install-deps.sh. Environment: RHP_HELM_PREFIX, GO (the go command;
# default: the newest Go on PATH or at /usr/local/go/bin/go, packaging/lib/go.sh).
set -euo pipefail

HELM_VERSION=v3.19.0
PREFIX=${RHP_HELM_PREFIX:-/opt/runtime-hook-proxy/helm}

RHP_PROGRESS_NAME=build-helm
# shellcheck source=packaging/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/../packaging/lib/progress.sh"  # a line per step with the elapsed time, on stderr
# shellcheck source=packaging/lib/go.sh
source "$(dirname "${BASH_SOURCE[0]}")/../packaging/lib/go.sh"  # rhp_go: the one Go every caller picks
log() { rhp_step "$*"; }

GO=$(rhp_go 1.24)

key=$(printf '%s\n' "$HELM_VERSION" "$("$GO" env GOVERSION GOOS GOARCH)" | sha256sum | cut -c1-16)
dest=$PREFIX/$key
binary=$dest/helm

if [[ ${1:-} == --print-path ]]; then
  printf '%s\n' "$binary"
  exit 0
fi

mkdir -p "$PREFIX"
exec 8>"$PREFIX/.build.lock"
flock 8
if [[ -x $binary ]]; then
  log "up to date: $binary"
else
  log "building helm $HELM_VERSION into $dest"
  rm -rf "$PREFIX"/*.tmp
  mkdir -p "$dest.tmp"
  rhp_run "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION (about 1.5 minutes when Go's caches are cold)" \
    env CGO_ENABLED=0 GOBIN="$dest.tmp" GOFLAGS=-trimpath "$GO" install \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
  log "built $binary"
fi
ln -sfn "$key" "$PREFIX/current.tmp"
mv -T "$PREFIX/current.tmp" "$PREFIX/current"
printf '%s\n' "$binary"
